"""ASGI middleware: request id + access log + metrics, and the request body size limit.

Both are plain ASGI callables (not ``BaseHTTPMiddleware``) so streaming and cancellation pass
through untouched.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PROBLEM_JSON, BodyTooLarge, body_limit_reason
from app.head import HeadAsGetMiddleware
from app.logging import REQUEST_ID_HEADER, request_id_from, request_id_var, request_started_var
from app.metrics import Metrics

access_log = logging.getLogger("kperf.access")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            try:
                return str(value.decode("latin-1"))
            except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
                return None
    return None


async def _send_problem(
    send: Send,
    status: int,
    title: str,
    field: str,
    reason: str,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    body = {
        "type": "https://kperf.dev/problems/" + title.lower().replace(" ", "-"),
        "title": title,
        "status": status,
        "detail": f"{field}: {reason}",
        "errors": [{"field": field, "reason": reason}],
    }
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(payload)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class RequestContextMiddleware:
    """Tag each request with an id (echoed in ``X-Request-ID``), log it and count it."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(_header(scope, b"x-request-id"))
        method = scope.get("method", "-")  # before an inner middleware rewrites it
        token = request_id_var.set(request_id)
        start = time.perf_counter()
        started_token = request_started_var.set(start)
        status = 500
        cache_state = "-"
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, cache_state, started
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"
                ]
                headers.append((REQUEST_ID_HEADER.lower().encode(), request_id.encode()))
                # the server-side time to the first byte of the answer (W3C Server-Timing),
                # so a client can tell queueing in its own process from the service's time
                elapsed_ms = (time.perf_counter() - start) * 1000
                headers.append((b"server-timing", f"app;dur={elapsed_ms:.1f}".encode()))
                for key, value in headers:
                    if key.lower() == b"x-cache":
                        cache_state = value.decode("latin-1")
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # a bug: log it with the request id and still answer problem+json (never a bare
            # text 500); if the response had started there is nothing left to send
            access_log.exception("unhandled error")
            status = 500
            if not started:
                await _send_problem(
                    send_with_id,
                    500,
                    "Internal error",
                    "body",
                    f"unexpected server error; report request id {request_id}",
                )
        finally:
            elapsed_s = time.perf_counter() - start
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            labels = (template, method, str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(elapsed_s)
            access_log.info(
                "request",
                extra={
                    "method": method,
                    "path": scope.get("path"),
                    "route": template,
                    "status": status,
                    "duration_ms": round(elapsed_s * 1000, 3),
                    "cache": cache_state,
                },
            )
            request_id_var.reset(token)
            request_started_var.reset(started_token)


class BodyLimitMiddleware:
    """Refuse bodies larger than ``max_body_bytes`` with 413 problem+json.

    A declared Content-Length is checked before reading. Otherwise the body passes through as
    it arrives (nothing is buffered here: a held copy per request would double what ten
    concurrent 2 MB uploads cost) and is counted; the message that crosses the limit raises
    :class:`~app.errors.BodyTooLarge` in whoever reads it, so an oversized upload never sits
    in memory whole.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def _refuse(self, send: Send) -> None:
        await _send_problem(
            send,
            413,
            "Content too large",
            "body",
            body_limit_reason(self.max_body_bytes),
            [(b"connection", b"close")],
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit():
            if int(declared) > self.max_body_bytes:
                self.metrics.rejected.labels("body_too_large").inc()
                await self._drain(receive, int(declared))
                await self._refuse(send)
                return
        size = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.max_body_bytes:
                    self.metrics.rejected.labels("body_too_large").inc()
                    if message.get("more_body", False):
                        await self._drain(receive, None)
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            # read by something that let it through (not FastAPI's body reading, whose
            # exception handlers answer it): answer here unless a response has begun
            if started:
                raise
            await self._refuse(send)

    async def _drain(self, receive: Receive, declared: int | None) -> None:
        """Read and discard the rest of an oversized body, up to a bound.

        Answering before the client has finished sending makes most clients see a reset
        connection instead of the 413; discarding (never storing) up to 16x the limit lets
        them read it. Beyond that bound the connection is closed instead.
        """
        bound = 16 * self.max_body_bytes
        if declared is not None and declared > bound:
            return
        seen = 0
        while seen <= bound:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


class EncodedSlashMiddleware:
    """A 404 for a path holding an encoded slash (``%2F``).

    The server decodes the path before routing, so ``/devices/h100%2Fmeasurements`` was routed
    as ``/devices/h100/measurements``: a proxy rule written on paths could be sidestepped. No
    id, name or batch the API serves contains a ``/`` (device names: ``[a-z0-9._-]``), so such
    a path names nothing.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path")
        if scope["type"] == "http" and isinstance(raw, bytes) and b"%2f" in raw.lower():
            await _send_problem(
                send,
                404,
                "Not found",
                "path",
                "an encoded slash (%2F) names no resource: ids and names hold no '/'",
            )
            return
        await self.app(scope, receive, send)


def install(app: Any, metrics: Metrics, max_body_bytes: int) -> None:
    """Add the middleware; the context middleware is outermost so 413s are logged too; HEAD
    is turned into GET innermost, after the body limit has let it through."""
    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes, metrics=metrics)
    app.add_middleware(EncodedSlashMiddleware)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
