"""Request bodies decoded off the event loop: the route class every JSON router uses.

FastAPI decodes a JSON body with ``json.loads`` on the event loop. A 2 MB PTX module takes
about 8 ms to decode (its newlines are escapes), so ten such requests arriving together held
the loop for 80 ms and /healthz waited behind them. Bodies above
:data:`OFF_LOOP_ABOVE_BYTES` are decoded in one dedicated thread instead: one at a time, so
between two decodes the loop always gets its turn (the decoder holds the GIL for a whole
body; several decoding threads would pass it among themselves while the loop waits).

The request object handed to FastAPI is this route's own, so the body bytes it caches are
released when the endpoint returns, not held while a large answer is still being sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

#: bodies up to this size are decoded on the loop (a thread hop costs more than they do)
OFF_LOOP_ABOVE_BYTES = 64 * 1024

_decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kperf-json")


class OffLoopJSONRequest(Request):
    async def json(self) -> Any:
        body = await self.body()
        if len(body) <= OFF_LOOP_ABOVE_BYTES:
            return json.loads(body)
        # not cached on the request (FastAPI asks once): the decoded document is the
        # validated model's to keep, or nobody's
        return await asyncio.get_running_loop().run_in_executor(_decoder, json.loads, body)


class OffLoopJSONRoute(APIRoute):
    """An :class:`APIRoute` whose endpoint sees an :class:`OffLoopJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            return await handler(OffLoopJSONRequest(request.scope, request.receive))

        return route_handler
