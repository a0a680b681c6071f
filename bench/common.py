"""Helpers shared by the bench scripts: repeat-and-median timing and the command line."""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path


def command_line() -> str:
    """The command that reproduces this run, as typed from the repository root."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([head, *(shlex.quote(a) for a in sys.argv[1:])])


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def append_results(title: str, text: str) -> None:
    """Append a section to bench/RESULTS.md (at the end, dated)."""
    path = Path(__file__).resolve().parent / "RESULTS.md"
    with open(path, "a", encoding="utf-8") as results:
        results.write(f"\n## {title}\n\nRun {time.strftime('%Y-%m-%d')}. {text}\n")
