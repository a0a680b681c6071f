"""HEAD answered wherever GET is (RFC 9110 §9.3.2): the GET's status and headers, no body.

FastAPI registers a ``@router.get`` route for GET alone, so load balancers and uptime checkers
probing with HEAD got a 405. Rather than doubling every GET operation in the OpenAPI document,
a HEAD request is routed as a GET and the body of its answer is dropped here; its
``content-length`` stays the GET's, as §9.3.2 asks.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        # in place, so the outer middleware sees the route matched (its access log and metrics
        # keep the method they read on the way in: HEAD)
        scope["method"] = "GET"
        await self.app(scope, receive, headers_only)
