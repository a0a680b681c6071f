"""``kperf table --sweep shapes.csv``: one tuning table per (N, K) line, resumable.

The input is CSV with a header row: ``n`` and ``k`` on every line, and optionally any other
/tuning-table field as a column (``dtype``, ``device``, ``device_name``, ``format``,
``max_distinct_configs``; ``m_values`` as a JSON list); the command's flags give the rest.
Each table is written to the output folder under the engine's file name, and one JSON line
per answered input line goes to the folder's journal (the same journal as ``kperf sweep``:
a rerun skips the lines already answered with the same content, so a killed sweep resumes).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kperf_client.client import KperfClient, KperfError
from kperf_client.sweep.journal import Journal
from kperf_client.sweep.runner import SweepStats
from kperf_client.sweep.shapes import problem_digest

#: the journal's name inside the output folder
JOURNAL_NAME = "kperf-table-sweep.jsonl"
_INTEGER_COLUMNS = ("n", "k", "max_distinct_configs", "shortlist_per_m", "loss_sample_step")
_JSON_COLUMNS = ("m_values", "search_space", "candidates", "block_shape")


@dataclass(frozen=True, slots=True)
class TableLine:
    line: int
    body: dict[str, Any]
    digest: str


def read_table_shapes(
    path: Path, defaults: Mapping[str, Any]
) -> tuple[list[TableLine], list[tuple[int, str]]]:
    """The lines of ``path`` as /tuning-table bodies (``defaults`` under each line's own
    columns), and the lines that cannot be one (line number, reason)."""
    text = path.read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(text))
    good: list[TableLine] = []
    bad: list[tuple[int, str]] = []
    for offset, row in enumerate(reader):
        line = offset + 2  # the header is line 1
        body: dict[str, Any] = dict(defaults)
        try:
            for column, cell in row.items():
                if column is None or cell is None or cell.strip() == "":
                    continue
                name = column.strip()
                if name in _INTEGER_COLUMNS:
                    body[name] = int(cell)
                elif name in _JSON_COLUMNS:
                    body[name] = json.loads(cell)
                else:
                    body[name] = cell.strip()
        except ValueError as exc:
            bad.append((line, f"not a number or JSON: {exc}"))
            continue
        missing = [f for f in ("n", "k") if f not in body]
        if missing:
            bad.append((line, f"missing {', '.join(missing)}"))
            continue
        good.append(TableLine(line, body, problem_digest(body)))
    return good, bad


def write_table(directory: Path, file_name: str, file: Mapping[str, Any]) -> Path:
    """The table as the engines' loaders read it (json.load of a UTF-8 file)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / file_name
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(file, indent=4) + "\n", encoding="utf-8")
    partial.replace(target)  # never a half-written table under the engine's name
    return target


async def run_table_sweep(
    client: KperfClient,
    lines: list[TableLine],
    output: Path,
    *,
    concurrency: int = 2,
    on_progress: Callable[[SweepStats], None] | None = None,
    stop: asyncio.Event | None = None,
) -> SweepStats:
    """Answer every line not answered before; a 4xx is journalled as that line's error."""
    stats = SweepStats(shapes=len(lines))
    started = time.perf_counter()
    gate = asyncio.Semaphore(max(1, concurrency))
    with Journal(output / JOURNAL_NAME) as journal:
        todo = [t for t in lines if journal.done.get((t.line, t.digest)) != "ok"]
        stats.skipped = len(lines) - len(todo)

        async def one(item: TableLine) -> None:
            async with gate:
                if stop is not None and stop.is_set():
                    stats.interrupted = True
                    return
                record: dict[str, Any] = {"line": item.line, "input_digest": item.digest}
                try:
                    answer = await client.tuning_table(item.body)
                except KperfError as exc:
                    if exc.status >= 500 or exc.status == 429:
                        stats.failed += 1  # not journalled: a rerun tries again
                        return
                    record |= {"status": "error", "http_status": exc.status}
                    record["errors"] = [list(e) for e in exc.field_errors]
                    stats.errors += 1
                else:
                    write_table(output, answer.file_name, answer.file)
                    record |= {
                        "status": "ok",
                        "file_name": answer.file_name,
                        "worst_loss": answer.loss_over_range.worst_loss,
                        "elapsed_ms": answer.solver.elapsed_ms,
                        "cpu_ms": answer.solver.cpu_ms,
                    }
                journal.record(record)
                stats.answered += 1
                stats.elapsed_s = time.perf_counter() - started
                if on_progress is not None:
                    on_progress(stats)

        await asyncio.gather(*(one(t) for t in todo))
    stats.elapsed_s = time.perf_counter() - started
    return stats
