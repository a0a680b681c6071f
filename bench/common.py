"""Helpers shared by the bench scripts: repeat-and-median timing and the command line."""

from __future__ import annotations

import platform
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


def record_results(
    section: str, command: str, text: str, subsection: str | None = None, path: Path | None = None
) -> None:
    """Replace ``### subsection`` of ``## section`` in bench/RESULTS.md (the whole section's
    body when ``subsection`` is None) with ``text`` under its command and today's date, or add
    the subsection at the end of that section: the file is a state, one section per capability
    (tests/test_results_doc.py), so a rerun replaces its figures and never appends a second
    copy. ValueError when the section does not exist (a new capability is added to the file and
    to the test's list by hand)."""
    path = path or Path(__file__).resolve().parent / "RESULTS.md"
    lines = path.read_text(encoding="utf-8").splitlines()
    body = [
        f"Command: `{command}`",
        "",
        f"Measured: {time.strftime('%Y-%m-%d')}, {platform.node() or 'this machine'}",
        "",
        *text.strip("\n").splitlines(),
        "",
    ]
    try:
        start = lines.index(f"## {section}")
    except ValueError:
        raise ValueError(f"bench/RESULTS.md has no section {section!r}") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    if subsection is None:
        lines[start + 1 : end] = ["", *body]
    elif (heading := f"### {subsection}") in lines[start:end]:
        first = lines.index(heading, start, end)
        last = next((i for i in range(first + 1, end) if lines[i].startswith(("## ", "### "))), end)
        lines[first + 1 : last] = ["", *body]
    else:
        lines[end:end] = [heading, "", *body]
    path.write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")
