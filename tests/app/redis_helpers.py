"""A real redis-server for the integration tests: a free loopback port, a temporary directory,
no persistence, killed at teardown (even when the test fails).

Tests that need it skip, saying why, only when no ``redis-server`` binary can be found
(``apt-get install redis-server``); .ci/run installs it and sets ``KPERF_TEST_REQUIRE_REDIS=1``,
which turns that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")
#: read at import, before any test's environment clean-up
REQUIRE_REDIS = os.environ.get("KPERF_TEST_REQUIRE_REDIS") == "1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process on a fixed port; ``kill``/``start`` simulate an outage."""

    def __init__(self, directory: Path) -> None:
        if REDIS_SERVER is None:  # pragma: no cover - callers skip first
            raise RuntimeError("redis-server not found")
        self.port = _free_port()
        self.directory = directory
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "no",
                "--protected-mode", "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 10
        while not _answers_ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not start; see {self.directory}/redis.log")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL, as a crashed or partitioned Redis (no goodbye to clients)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
            sock.sendall(b"FLUSHALL\r\n")
            assert sock.recv(16).startswith(b"+OK")


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A running redis-server for this test module, stopped at teardown."""
    if REDIS_SERVER is None:
        reason = "redis-server not on PATH (apt-get install redis-server): real-Redis tests"
        if REQUIRE_REDIS:
            pytest.fail(f"{reason} are required here (KPERF_TEST_REQUIRE_REDIS=1)")
        pytest.skip(f"{reason} skipped")
    with tempfile.TemporaryDirectory(prefix="kperf-redis-") as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            yield server
        finally:
            server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The module's Redis, running and empty, for one test."""
    if redis_server.proc is None:
        redis_server.start()
    redis_server.flush()
    yield redis_server.url
