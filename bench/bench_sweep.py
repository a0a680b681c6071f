"""Scale-out sweep: distinct GEMM shapes through 1 and then 2 replicas sharing one Redis.

Every replica is a ``kperf serve`` process with ONE solver worker (``KPERF_WORKERS=1``), so 1
vs 2 replicas compares one solver process with two (on a 2-core machine the sweep client, the
two event loops and Redis share the cores with them). The sweep is the library behind
``kperf sweep`` (batches of 16 shapes, 4 batches in flight, round-robin over the URLs).

1. pass 1, 1 replica, fresh Redis: every shape is solved;
2. FLUSHALL, two fresh replicas, pass 1 again: every shape solved once (single-flight);
3. pass 2 through the same 2 replicas: every shape must be a hit (from the replica's LRU or
   from Redis, whichever replica answers).

Reported: shapes/s per pass, the 2-replica / 1-replica ratio of pass 1 (same run), pass 2's hit
ratio (acceptance: 100 %) and rate, and the solves the servers counted (/metrics). Exit status 1
when pass 2 is not all hits or some shape failed.

    .venv/bin/python bench/bench_sweep.py [--shapes 10000] [--record]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.bench_large_answers import start_server, stop_server  # noqa: E402
from bench.common import command_line, record_results  # noqa: E402
from kperf_client.sweep import Journal, Shape, Sweep, SweepOptions, SweepStats  # noqa: E402
from kperf_client.sweep.shapes import problem_digest  # noqa: E402
from tests.app.redis_helpers import RedisServer  # noqa: E402
from tests.app.service_helpers import metric_value  # noqa: E402


def make_shapes(count: int) -> list[Shape]:
    """``count`` distinct (m, n, k) on the A6000, default search space (multiples of 64)."""
    shapes = []
    for i in range(count):
        problem = {
            "m": 64 * (1 + i % 64),
            "n": 64 * (1 + (i // 64) % 64),
            "k": 64 * (1 + i // 4096),
            "device": "rtx-a6000",
        }
        shapes.append(Shape(i + 1, problem, problem_digest(problem)))
    return shapes


def solves(urls: list[str]) -> int:
    total = 0.0
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        for outcome in ("ok", "partial"):
            total += metric_value(
                text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome=outcome
            )
    return int(total)


def sweep(urls: list[str], shapes: list[Shape], journal_path: Path) -> SweepStats:
    options = SweepOptions(urls=tuple(urls), batch_size=16, concurrency=4)

    async def run() -> SweepStats:
        with Journal(journal_path) as journal:
            return await Sweep(options, journal).run(shapes)

    return asyncio.run(run())


def start_replicas(count: int, redis_url: str, logs: Path) -> list[tuple[Any, str]]:
    env = {"KPERF_STORE_URL": redis_url, "KPERF_WORKERS": "1", "KPERF_QUEUE_SIZE": "64"}
    return [start_server(env, logs / f"replica-{count}-{i}.log") for i in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=10_000, help="distinct shapes (10,000)")
    parser.add_argument(
        "--record", action="store_true", help="replace its section of bench/RESULTS.md"
    )
    args = parser.parse_args()
    command = command_line()
    shapes = make_shapes(args.shapes)
    rows: list[tuple[str, SweepStats, int]] = []
    with tempfile.TemporaryDirectory(prefix="kperf-bench-sweep-") as folder:
        work = Path(folder)
        redis_server = RedisServer(work)
        redis_server.start()
        try:
            for replicas, passes in ((1, 1), (2, 2)):
                redis_server.flush()
                servers = start_replicas(replicas, redis_server.url, work)
                urls = [url for _, url in servers]
                try:
                    for n in range(1, passes + 1):
                        before = solves(urls)
                        journal = work / f"journal-{replicas}-{n}.jsonl"
                        stats = sweep(urls, shapes, journal)
                        name = f"pass {n}, {replicas} replica{'s' if replicas > 1 else ''}"
                        rows.append((name, stats, solves(urls) - before))
                        print(
                            f"{rows[-1][0]}: {stats.answered} answered in {stats.elapsed_s:.1f} s "
                            f"({stats.rate_shapes_per_s:.1f} shapes/s), hits {stats.cache_hits}, "
                            f"errors {stats.errors}, failed {stats.failed}, solves {rows[-1][2]}",
                            flush=True,
                        )
                finally:
                    for server, _ in servers:
                        stop_server(server)
        finally:
            redis_server.kill()
    one, two, again = (row[1] for row in rows)
    ratio = two.rate_shapes_per_s / one.rate_shapes_per_s
    hit_ratio = again.hit_ratio
    ok = hit_ratio == 1.0 and all(s.failed == 0 and s.errors == 0 for s in (one, two, again))
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    table = "\n".join(
        f"| {name} | {s.answered} | {s.elapsed_s:.1f} | {s.rate_shapes_per_s:.1f} | "
        f"{s.cache_hits / max(1, s.answered):.1%} | {solved} | {s.errors} / {s.failed} |"
        for name, s, solved in rows
    )
    text = (
        f"Command: `{command}` ({args.shapes:,} distinct shapes, default search space, "
        "rtx-a6000; each replica a `kperf serve` with KPERF_WORKERS=1 and "
        "KPERF_STORE_URL=redis://127.0.0.1:<port>/0, redis-server without persistence; the "
        "sweep library (`kperf sweep`: batches of 16, 4 in flight, round-robin) on the same "
        f"2-core machine; load average at the end {load})\n\n"
        "| pass | shapes | seconds | shapes/s | hits | solves (servers' /metrics) | "
        "errors / failed |\n|---|---|---|---|---|---|---|\n"
        f"{table}\n\n"
        f"- pass 1 throughput, 2 replicas / 1 replica: **{ratio:.2f}x**\n"
        f"- pass 2 hit ratio: **{hit_ratio:.2%}** (acceptance: 100 %), "
        f"{again.rate_shapes_per_s:.0f} shapes/s\n"
    )
    print(text)
    if args.record:
        record_results(
            "Service load",
            command_line(),
            text,
            "Scale-out: a sweep through 1 and 2 replicas sharing Redis",
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
