"""Reading a sweep's shapes: CSV with a header row, or JSON lines.

Each data line becomes one /optimize-tiling problem. A line that cannot become one (not JSON,
not an object, a CSV cell that is not a number, a missing m/n/k) is reported with its line
number and the sweep goes on with the rest: one typo must not cost a 100,000-shape run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

InputFormat = Literal["csv", "jsonl"]

#: columns a CSV must have; every other optimize field may be a column too
REQUIRED_FIELDS = ("m", "n", "k")
#: CSV cells parsed as JSON (lists, objects, numbers) rather than kept as text
_JSON_COLUMNS = ("search_space", "device_params")
_INTEGER_COLUMNS = ("m", "n", "k", "top_k")
_FLOAT_COLUMNS = ("time_limit_s",)
_BOOLEAN_COLUMNS = ("include_timeline",)


@dataclass(frozen=True, slots=True)
class Shape:
    """One problem of the sweep, keyed by its 1-based line in the input file."""

    line: int
    problem: dict[str, Any]
    #: digest of the problem: a resumed sweep only skips a line whose content is unchanged
    digest: str


@dataclass(frozen=True, slots=True)
class BadLine:
    line: int
    reason: str


def problem_digest(problem: dict[str, Any]) -> str:
    text = json.dumps(problem, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def detect_format(path: Path) -> InputFormat:
    return "csv" if path.suffix.lower() == ".csv" else "jsonl"


def _checked(line: int, problem: dict[str, Any]) -> Shape | BadLine:
    missing = [f for f in REQUIRED_FIELDS if f not in problem]
    if missing:
        return BadLine(line, f"missing {', '.join(missing)}")
    return Shape(line, problem, problem_digest(problem))


def _jsonl(text: str) -> Iterator[Shape | BadLine]:
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            yield BadLine(number, f"not JSON: {exc.msg} at column {exc.colno}")
            continue
        if not isinstance(value, dict):
            yield BadLine(number, f"expected a JSON object, got {type(value).__name__}")
            continue
        yield _checked(number, value)


def _cell(column: str, text: str) -> Any:
    if column in _JSON_COLUMNS:
        return json.loads(text)
    if column in _INTEGER_COLUMNS:
        return int(text)
    if column in _FLOAT_COLUMNS:
        return float(text)
    if column in _BOOLEAN_COLUMNS:
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise ValueError(f"expected true or false, got {text!r}")
        return lowered == "true"
    return text


def _csv(text: str) -> Iterator[Shape | BadLine]:
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for row in reader:
        number = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip() for cell in row]
            missing = [f for f in REQUIRED_FIELDS if f not in header]
            if missing:
                yield BadLine(number, f"header lacks column(s) {', '.join(missing)}")
                return
            continue
        if len(row) != len(header):
            yield BadLine(number, f"{len(row)} cells, the header has {len(header)}")
            continue
        problem: dict[str, Any] = {}
        try:
            for column, cell in zip(header, row, strict=True):
                if cell.strip():
                    problem[column] = _cell(column, cell.strip())
        except ValueError as exc:
            yield BadLine(number, f"column {column!r}: {exc}")
            continue
        yield _checked(number, problem)


def read_shapes(path: Path, input_format: InputFormat | None = None) -> list[Shape | BadLine]:
    """Every data line of ``path`` in order, parsed or rejected with its reason."""
    text = path.read_text(encoding="utf-8")
    chosen = input_format if input_format is not None else detect_format(path)
    return list(_csv(text) if chosen == "csv" else _jsonl(text))
