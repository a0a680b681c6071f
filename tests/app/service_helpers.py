"""Shared helpers of the service tests: an in-process app, a real uvicorn, clean environment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from kperf_client.client import KperfClient

REPO = Path(__file__).resolve().parents[2]
A6000 = "rtx-a6000"
#: a problem the real solver proves optimal in well under a second, small enough (875
#: configurations under the paper's DRAM-stream loads) for the service's inline thread
SMALL = {"m": 1024, "n": 1024, "k": 1024, "device": A6000, "memory_model": "dram-stream"}


def problem(**overrides: Any) -> dict[str, Any]:
    return {**SMALL, **overrides}


def make_settings(**overrides: Any) -> Settings:
    """Settings for tests: one worker, explicit values, no environment involved. Every solve
    goes to the pool (``inline_max_configurations`` 0): these tests exercise the pool with
    small problems; tests/app/test_inline.py turns the inline thread on."""
    values: dict[str, Any] = {
        "workers": 1,
        "queue_size": 4,
        "log_level": "WARNING",
        "inline_max_configurations": 0,
    }
    values.update(overrides)
    return Settings(**values)


def in_app(
    scenario: Callable[[KperfClient], Awaitable[Any]], settings: Settings | None = None
) -> Any:
    """Run ``scenario`` against a fresh in-process app (lifespan and worker pool included)."""

    async def main() -> Any:
        async with KperfClient(settings=settings or make_settings()) as client:
            return await scenario(client)

    return asyncio.run(main())


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        found = dict(
            part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part
        )
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return 0.0


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No KPERF_* variable of the developer's shell reaches the settings under test."""
    for key in list(os.environ):
        if key.startswith("KPERF_"):
            monkeypatch.delenv(key)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    env_overrides: dict[str, str] | None = None, *, address_in_env: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """``kperf serve`` on a free 127.0.0.1 port, as the README runs it; waits for /readyz.

    ``address_in_env``: the address comes from KPERF_HOST / KPERF_PORT, as in the image.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPERF_")}
    env.update({"KPERF_WORKERS": "1", "KPERF_LOG_LEVEL": "WARNING"})
    # this checkout's packages, whichever one the venv's editable install points at
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    address = ["--host", "127.0.0.1", "--port", str(port)]
    if address_in_env:
        env.update({"KPERF_HOST": "127.0.0.1", "KPERF_PORT": str(port)})
        address = []
    env.update(env_overrides or {})
    kperf = Path(sys.executable).with_name("kperf")
    command = [str(kperf)] if kperf.exists() else [sys.executable, "-m", "kperf_client.cli"]
    # the server's JSON log, for post-mortems: removed by stop_server unless
    # KEEP_KPERF_TEST_LOGS=1 (not a KPERF_ variable: clean_environ would drop it)
    log_path = server_log_path(port)
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*command, "serve", *address],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    proc.kperf_port = port  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kperf serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("kperf serve did not become ready within 60 s")


def server_log_path(port: int | str) -> Path:
    return Path(tempfile.gettempdir()) / f"kperf-test-server-{port}.log"


def remove_server_log(url: str) -> None:
    """Delete the log of the server at ``url`` (kept with KEEP_KPERF_TEST_LOGS=1)."""
    if os.environ.get("KEEP_KPERF_TEST_LOGS") != "1":
        server_log_path(url.rsplit(":", 1)[1]).unlink(missing_ok=True)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    port = getattr(proc, "kperf_port", None)  # set by start_server
    if port is not None:
        remove_server_log(f"http://127.0.0.1:{port}")


@contextlib.contextmanager
def servers(count: int, env_overrides: dict[str, str]) -> Iterator[list[str]]:
    """``count`` ``kperf serve`` processes (e.g. replicas on one store), stopped on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for _ in range(count):
            proc, url = start_server(env_overrides)
            procs.append(proc)
            urls.append(url)
        yield urls
    finally:
        for proc in reversed(procs):
            stop_server(proc)


@pytest.fixture(scope="module")
def live_server() -> Iterator[str]:
    proc, url = start_server()
    try:
        yield url
    finally:
        stop_server(proc)


async def wait_until_all_workers_busy(client: KperfClient, timeout_s: float = 30.0) -> None:
    """Poll the in-process pool until no worker is idle (a job has been dispatched)."""
    pool = client.app.state.service.pool  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout_s
    while pool.idle_workers > 0:
        if time.monotonic() > deadline:
            raise AssertionError("the pool never became busy")
        await asyncio.sleep(0.01)
