"""Fixtures shared by the plug-ins' tests."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from kperf_client.session import KperfSession


@pytest.fixture
def sessions() -> Iterator[list[KperfSession]]:
    """Plug-in sessions a test made: closed (runs flushed, loop stopped) after it."""
    made: list[KperfSession] = []
    yield made
    for session in made:
        session.close()


def warnings_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """What ``logger`` said at WARNING or above."""
    return [
        r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING
    ]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers (a hung service)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


#: what a plug-in must not bring along on import: the server and its heavy dependencies
SERVER_SIDE = (
    *("app", "solver", "perfmodel", "device_profiles", "render"),
    *("fastapi", "z3", "numpy", "scipy"),
)


def loaded_on_import(module: str, watched: tuple[str, ...]) -> list[str]:
    """The modules of ``watched`` (top-level names) that importing ``module`` loads, in a
    fresh interpreter."""
    code = (
        f"import sys, {module}; "
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {watched!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]
