"""What a person watching ``kperf sweep`` sees: a live progress bar and a summary table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from kperf_client.sweep.runner import ProgressHook, SweepStats


@contextmanager
def progress_bar(stream: TextIO, total: int, enabled: bool) -> Iterator[ProgressHook]:
    """A hook that advances a bar showing rate, ETA, cache-hit ratio and error count."""
    if not enabled:
        yield lambda stats: None
        return
    progress = Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.1f} shapes/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("hits {task.fields[hits]:.0%}  errors {task.fields[errors]}"),
        console=Console(file=stream),
        transient=False,
    )
    task: TaskID = progress.add_task("sweep", total=total, rate=0.0, hits=0.0, errors=0)

    def update(stats: SweepStats) -> None:
        elapsed = progress.tasks[0].elapsed or 0.0
        progress.update(
            task,
            completed=stats.skipped + stats.answered + stats.failed,
            rate=stats.answered / elapsed if elapsed > 0 else 0.0,
            hits=stats.hit_ratio,
            errors=stats.errors + stats.failed,
        )

    with progress:
        yield update


def summary_table(stats: SweepStats, stream: TextIO) -> None:
    table = Table(title="sweep summary", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    rows = [
        ("shapes in the input", stats.shapes),
        ("answered before (resumed)", stats.skipped),
        ("answered now", stats.answered),
        ("  of which cache hits", stats.cache_hits),
        ("  of which errors (4xx per shape)", stats.errors),
        ("not answered (retries exhausted)", stats.failed),
        ("invalid input lines", stats.invalid_lines),
        ("retries", stats.retries),
    ]
    for what, count in rows:
        table.add_row(what, str(count))
    table.add_row("elapsed (s)", f"{stats.elapsed_s:.2f}")
    table.add_row("throughput (shapes/s)", f"{stats.rate_shapes_per_s:.1f}")
    table.add_row("cache-hit ratio", f"{stats.hit_ratio:.1%}")
    Console(file=stream, width=80).print(table)
