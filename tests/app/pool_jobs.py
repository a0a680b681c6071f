"""Jobs for the worker-pool tests (module level so a spawned worker can import them)."""

from __future__ import annotations

import os
import signal
import time


def echo(value: object, time_limit_s: float | None = None) -> tuple[object, float | None]:
    return value, time_limit_s


def runaway(time_limit_s: float) -> str:
    """Ignores its time limit, like a solve stuck inside C++."""
    while True:
        time.sleep(0.01)


def cooperative(time_limit_s: float) -> str:
    """Stops itself at its limit and reports it, like the solver returning "timeout"."""
    time.sleep(time_limit_s)
    return "timeout"


def sleep_for(seconds: float, time_limit_s: float | None = None) -> float:
    time.sleep(seconds)
    return seconds


def allocate(n_bytes: int, time_limit_s: float | None = None) -> int:
    block = bytearray(n_bytes)
    return len(block)


def die(time_limit_s: float | None = None) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fail(message: str, time_limit_s: float | None = None) -> None:
    raise ValueError(message)


def pid(time_limit_s: float | None = None) -> int:
    return os.getpid()


class FieldError(ValueError):
    """Shaped like the domain errors: a custom __init__ that plain pickling cannot replay."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def fail_field(time_limit_s: float | None = None) -> None:
    raise FieldError("tile_m", "must be at least 1")


def slow_optimize(
    request_json: dict[str, object],
    profile_json: dict[str, object] | None,
    prepared: object,
    time_limit_s: float,
) -> object:
    """The real optimize job, after a pause that keeps the worker busy."""
    from app.jobs import optimize_job

    time.sleep(0.8)
    return optimize_job(request_json, profile_json, prepared, time_limit_s)  # type: ignore[arg-type]


def greedy_optimize(
    request_json: dict[str, object],
    profile_json: dict[str, object] | None,
    prepared: object,
    time_limit_s: float,
) -> int:
    """Allocates far beyond any worker memory cap used in the tests."""
    return len(bytearray(4 * 1024**3))


def broken_optimize(
    request_json: dict[str, object],
    profile_json: dict[str, object] | None,
    prepared: object,
    time_limit_s: float,
) -> None:
    raise AssertionError("the cache should have answered; the solver must not run")


def die_optimize(
    request_json: dict[str, object],
    profile_json: dict[str, object] | None,
    prepared: object,
    time_limit_s: float,
) -> None:
    """Kills its worker every time, like a request that triggers a segfault in the solver."""
    os.kill(os.getpid(), signal.SIGKILL)


def encoded_answer(size: int, time_limit_s: float | None = None) -> object:
    """A worker answer as the service's jobs return it: a large encoded body."""
    from app.service import EncodedAnswer

    return EncodedAnswer(bytes(range(256)) * (size // 256), cacheable=True)


def unpicklable(time_limit_s: float | None = None) -> object:
    return lambda: None
