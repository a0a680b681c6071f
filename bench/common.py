"""Helpers shared by the bench scripts: repeat-and-median timing and the command line."""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from collections.abc import Callable


def command_line() -> str:
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
