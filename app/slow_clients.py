"""Cut off clients that send a request too slowly (slowloris): the HTTP protocol of `kperf serve`.

uvicorn times out only an idle keep-alive connection between requests; once a request's first
byte arrives, nothing bounds how long its headers or body may take, so a few hundred sockets
trickling bytes hold every connection slot (measured: 15 half-sent headers and a 7-of-100,000
byte body were all still open after 45 s). The ASGI app cannot help: it is called only once the
headers are complete. So the guard sits in uvicorn's h11 protocol, as a subclass:

- headers: complete within ``header_timeout_s`` of the connection opening, or of the first byte
  of the next request on a reused connection;
- body: complete within ``body_timeout_s`` of the end of its headers.

A client over either bound gets ``408 Request Timeout`` (problem+json, when no answer has begun)
and the connection is closed; an app still waiting on the body sees the disconnect.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("kperf.slow_clients")


def _timeout_response(phase: str, limit_s: float) -> bytes:
    field = "headers" if phase == "headers" else "body"
    reason = (
        f"the request's {field} did not arrive within {limit_s:g} s; send them at once "
        f"(operators: KPERF_{field.upper()}_TIMEOUT_S)"
    )
    body = json.dumps(
        {
            "type": "https://kperf.dev/problems/request-timeout",
            "title": "Request timeout",
            "status": 408,
            "detail": f"{field}: {reason}",
            "errors": [{"field": field, "reason": reason}],
        }
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return head + body


class SlowClientGuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body read deadlines (see the module docstring)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._guard: asyncio.TimerHandle | None = None
        self._guard_phase: str | None = None
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._guard_phase != "headers":
            self._arm("headers")  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn's keep-alive timer bounds the idle wait for the next request from here
        if self.conn.their_state is not h11.SEND_BODY:
            self._disarm()

    def _follow(self) -> None:
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._guard_phase != "body":
                self._arm("body")
        elif state is not h11.IDLE:
            self._disarm()  # the request is in (DONE), or the connection is ending

    def _arm(self, phase: str) -> None:
        self._disarm()
        delay = self.header_timeout_s if phase == "headers" else self.body_timeout_s
        self._guard_phase = phase
        self._guard = self.loop.call_later(delay, self._expired)

    def _disarm(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
        self._guard = None
        self._guard_phase = None

    def _expired(self) -> None:
        phase = self._guard_phase or "headers"
        self._guard = None
        self._guard_phase = None
        if self.transport.is_closing():
            return
        limit_s = self.header_timeout_s if phase == "headers" else self.body_timeout_s
        log.warning(
            "slow client cut off", extra={"phase": phase, "limit_s": limit_s, "client": self.client}
        )
        answered = self.cycle is not None and self.cycle.response_started
        if phase == "headers" or not answered:
            self.transport.write(_timeout_response(phase, limit_s))
        # the app waiting on the body reads a disconnect; what it sends then is dropped
        self.transport.close()


def guarded_protocol(header_timeout_s: float, body_timeout_s: float) -> type[Any]:
    """The protocol class for ``uvicorn.run(http=...)`` with these deadlines."""
    return type(
        "KperfH11Protocol",
        (SlowClientGuardedH11Protocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )
