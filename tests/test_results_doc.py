"""bench/RESULTS.md is a state, not a log: one section per capability, each once.

Each `## ` section gives the current figures of one capability with the command that produced
them and the date and machine of the measurement. A rerun replaces its section; an appended
pass (a second "## Large answers ..." at the end) fails here.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "RESULTS.md"

#: The sections, in the order the file keeps them. A new capability adds its name here.
ALLOWED_SECTIONS = (
    "Solver speed",
    "Service load",
    "Memory bounds",
    "Calibration",
    "Real-GPU fidelity",
    "Many-BSP on real kernels",
    "Tuning tables",
    "Tenancy",
    "Recovery",
    "Pictures",
    "PTX analysis",
    "Container",
    "Kernel Tuner",
    "Triton",
    "H100 measurements",
)

_COMMAND = re.compile(r"^Commands?:", re.MULTILINE)
_MEASURED = re.compile(r"^Measured: .*?\b(\d{4}-\d{2}-\d{2})\b", re.MULTILINE)


def _sections(text: str) -> list[tuple[str, str]]:
    """(header, body) of every `## ` section, fenced code blocks skipped."""
    sections: list[tuple[str, str]] = []
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            sections.append((line[3:].strip(), ""))
        elif sections:
            header, body = sections[-1]
            sections[-1] = (header, body + line + "\n")
    return sections


def problems(text: str) -> list[str]:
    """What makes `text` not a RESULTS state: empty when it is one."""
    found: list[str] = []
    sections = _sections(text)
    headers = [header for header, _ in sections]
    for header in sorted(set(headers)):
        if headers.count(header) > 1:
            found.append(f"{header!r} appears {headers.count(header)} times")
    for header in headers:
        if header not in ALLOWED_SECTIONS:
            found.append(f"{header!r} is not an allowed section")
    known = [header for header in dict.fromkeys(headers) if header in ALLOWED_SECTIONS]
    if known != sorted(known, key=ALLOWED_SECTIONS.index):
        found.append(f"sections out of order: {known}")
    for header, body in sections:
        if not _COMMAND.search(body):
            found.append(f"{header!r} has no 'Command:' line")
        dates = _MEASURED.findall(body)
        if not dates:
            found.append(f"{header!r} has no 'Measured: <ISO date>, <machine>' line")
        for date in dates:
            try:
                datetime.date.fromisoformat(date)
            except ValueError:
                found.append(f"{header!r}: {date} is not a date")
    return found


def test_results_is_one_section_per_capability() -> None:
    assert problems(RESULTS.read_text(encoding="utf-8")) == []


def test_every_allowed_section_is_there() -> None:
    headers = [header for header, _ in _sections(RESULTS.read_text(encoding="utf-8"))]
    assert set(headers) == set(ALLOWED_SECTIONS)


_GOOD = """# Benchmark results

## Solver speed

Command: `python -m bench.bench_solver`

Measured: 2026-11-22, shared 2-core machine

```
## not a header inside a fence
```

## Service load

Commands:
- `python bench/load_test.py`

Measured: 2026-11-23, shared 2-core machine
"""


def test_a_well_formed_state_passes() -> None:
    assert problems(_GOOD) == []


def test_an_appended_pass_fails() -> None:
    appended = _GOOD + "\n## Solver speed\n\nCommand: `x`\n\nMeasured: 2026-11-30, m\n"
    assert problems(appended) == ["'Solver speed' appears 2 times"]


def test_a_log_style_header_fails() -> None:
    log = _GOOD + (
        "\n## Large answers: 10 concurrent cache hits (detail=auto, store memory)\n\n"
        "Command: `x`\n\nMeasured: 2026-11-23, m\n"
    )
    assert any("is not an allowed section" in problem for problem in problems(log))


def test_a_section_without_command_or_date_fails() -> None:
    missing = _GOOD.replace("Command: `python -m bench.bench_solver`", "Script: bench_solver")
    assert problems(missing) == ["'Solver speed' has no 'Command:' line"]
    undated = _GOOD.replace("Measured: 2026-11-23, shared", "Measured: yesterday, shared")
    assert problems(undated) == ["'Service load' has no 'Measured: <ISO date>, <machine>' line"]
    bad_date = _GOOD.replace("2026-11-23", "2026-13-45")
    assert problems(bad_date) == ["'Service load': 2026-13-45 is not a date"]


def test_sections_out_of_order_fail() -> None:
    swapped = _GOOD.replace("## Solver speed", "## TMP")
    swapped = swapped.replace("## Service load", "## Solver speed")
    swapped = swapped.replace("## TMP", "## Service load")
    assert problems(swapped) == ["sections out of order: ['Service load', 'Solver speed']"]


def test_a_recorded_rerun_replaces_its_subsection(tmp_path: Path) -> None:
    """bench.common.record_results, the benches' --record: a rerun replaces the subsection (or
    the whole section) it measures, so the state stays one copy of each figure."""
    from bench.common import record_results

    path = tmp_path / "RESULTS.md"
    path.write_text(RESULTS.read_text(encoding="utf-8"), encoding="utf-8")
    for run in ("first", "second"):
        record_results(
            "Recovery", "bench x", f"{run} figures", "Shared store: Redis killed under load", path
        )
        record_results("Tenancy", "bench y", f"{run} tenancy", path=path)
        record_results("Tuning tables", "bench z", f"{run} new table", "A new subsection", path)
    text = path.read_text(encoding="utf-8")
    assert problems(text) == []
    for run, count in (("first", 0), ("second", 1)):
        assert text.count(f"{run} figures") == count
        assert text.count(f"{run} tenancy") == count
        assert text.count(f"{run} new table") == count
    assert text.count("### Shared store: Redis killed under load") == 1
    assert text.count("### A new subsection") == 1
    assert "### Worker deaths" in text  # the section's other subsections stay
