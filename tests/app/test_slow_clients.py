"""Slowloris: a real ``kperf serve`` cuts off clients that send headers or a body
too slowly, within KPERF_HEADER_TIMEOUT_S / KPERF_BODY_TIMEOUT_S, and serves others meanwhile."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.app.service_helpers import clean_environ, start_server, stop_server

__all__ = ["clean_environ"]

HEADER_TIMEOUT_S = 1.5
BODY_TIMEOUT_S = 2.5
#: scheduling slack on a shared 2-core machine
SLACK_S = 2.0


@pytest.fixture(scope="module")
def guarded_server() -> Iterator[str]:
    proc, url = start_server(
        {
            "KPERF_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "KPERF_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        }
    )
    try:
        yield url
    finally:
        stop_server(proc)


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return sock


def _closed_after_s(sock: socket.socket) -> tuple[float, bytes]:
    """Seconds until the server closes the socket, and what it sent before."""
    started = time.monotonic()
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return time.monotonic() - started, received
        received += chunk


def test_half_sent_headers_are_cut_off(guarded_server: str) -> None:
    sockets = [_connect(guarded_server) for _ in range(15)]
    for sock in sockets:
        sock.sendall(b"POST /optimize-tiling HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    # meanwhile a well-behaved client is served
    assert httpx.get(f"{guarded_server}/healthz", timeout=10).status_code == 200
    for sock in sockets:
        waited_s, received = _closed_after_s(sock)
        assert waited_s <= HEADER_TIMEOUT_S + SLACK_S
        assert received.startswith(b"HTTP/1.1 408 ")
        assert b"KPERF_HEADERS_TIMEOUT_S" in received
        sock.close()


def test_silent_connection_is_cut_off(guarded_server: str) -> None:
    sock = _connect(guarded_server)
    waited_s, _ = _closed_after_s(sock)
    assert waited_s <= HEADER_TIMEOUT_S + SLACK_S
    sock.close()


def test_stalled_body_is_cut_off(guarded_server: str) -> None:
    sock = _connect(guarded_server)
    sock.sendall(
        b"POST /optimize-tiling HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 100000\r\n\r\n{"m": 1'
    )
    started = time.monotonic()
    waited_s, received = _closed_after_s(sock)
    sock.close()
    # the header deadline does not apply to the body: it gets its own, longer one
    assert BODY_TIMEOUT_S - 0.5 <= time.monotonic() - started
    assert waited_s <= BODY_TIMEOUT_S + SLACK_S
    assert received.startswith(b"HTTP/1.1 408 ")
    assert b'"field": "body"' in received


def test_kept_alive_connection_still_serves_requests(guarded_server: str) -> None:
    # the deadlines bound a request's arrival, not a connection's life
    with httpx.Client(base_url=guarded_server, timeout=10) as http:
        for _ in range(3):
            assert http.get("/healthz").status_code == 200
            time.sleep(HEADER_TIMEOUT_S * 0.6)
        assert http.get("/healthz").status_code == 200
