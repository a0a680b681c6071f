"""Speed of POST /tuning-table and of ``kperf table --sweep``, the result cache off.

Usage: python -m bench.bench_tuning_table [--repeats R] [--pairs P] [--concurrency C]

1. One 18-key table (vLLM's keys, the default space: 160 tilings of vLLM's ranges) per
   (N, K) on h100, fp8, through an in-process service (one worker, no cache): median wall
   time of R requests after a warm-up. Baseline in the same run: the same 18 keys as 18
   POST /optimize-tiling requests ranking the same 160 tilings as a candidate list (what a
   script does without the table route; no loss bound, no file). The result cache is off
   for both (no SQLite file, no in-process LRU). The worker's own wall and CPU time of the
   table (``solver.elapsed_ms``, ``solver.cpu_ms``) are printed too: on a machine shared with
   other work the CPU time is what one table costs.
2. P random (N, K) pairs (multiples of 64 in 256..16384) through ``kperf table --sweep``
   as a user runs it (a fresh process, in-process service, C workers): wall time including
   the service's start. Targets: <= 1 s per table, <= 60 s for 100 pairs; exit 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.schemas.tuning_table import DEFAULT_M_VALUES
from bench.common import command_line
from kperf_client.client import KperfClient

SHAPES = [(1536, 7168), (7168, 2048), (4096, 7168)]
TILES = [
    {"tile_m": tm, "tile_n": tn, "tile_k": tk, "buffer_depth": d}
    for tm in (16, 32, 64, 128, 256)
    for tn in (32, 64, 128, 256)
    for tk in (64, 128)
    for d in (2, 3, 4, 5)
]
TARGET_TABLE_S = 1.0
TARGET_SWEEP_S = 60.0


async def one_table(repeats: int) -> list[tuple[int, int, float, float, float, float]]:
    rows = []
    settings = {"workers": 1, "cache_path": None, "cache_memory_items": 0}
    async with KperfClient(settings=settings) as client:
        for n, k in SHAPES:
            body = {"n": n, "k": k, "device": "h100", "dtype": "fp8"}

            async def table(body: dict[str, object] = body) -> None:
                await client.tuning_table(body)

            async def per_key(n: int = n, k: int = k) -> None:
                for m in DEFAULT_M_VALUES:
                    await client.optimize(
                        {"m": m, "n": n, "k": k, "device": "h100", "dtype": "fp8",
                         "candidates": TILES, "shortlist": "exploit"}
                    )  # fmt: skip

            timings = {}
            for name, fn in (("table", table), ("per_key", per_key)):
                await fn()  # warm-up
                samples = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    await fn()
                    samples.append(time.perf_counter() - started)
                timings[name] = statistics.median(samples)
            answer = await client.tuning_table(body)
            solver = answer.solver
            rows.append((n, k, timings["table"], timings["per_key"], solver.elapsed_ms,
                         solver.cpu_ms))  # fmt: skip
    return rows


def sweep(pairs: int, concurrency: int) -> tuple[float, dict[str, object]]:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as folder:
        shapes = Path(folder) / "shapes.csv"
        lines = ["n,k"] + [
            f"{rng.randrange(256, 16385, 64)},{rng.randrange(256, 16385, 64)}" for _ in range(pairs)
        ]
        shapes.write_text("\n".join(lines) + "\n", encoding="utf-8")
        command = [sys.executable, "-m", "kperf_client.cli", "table", "--sweep", str(shapes),
                   "--device", "h100", "-o", str(Path(folder) / "out"), "--json",
                   "--concurrency", str(concurrency)]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
        stats = json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr[-500:]}
        stats["tables_written"] = len(list((Path(folder) / "out").glob("N=*.json")))
        journal = Path(folder) / "out" / "kperf-table-sweep.jsonl"
        records = [json.loads(r) for r in journal.read_text(encoding="utf-8").splitlines()]
        stats["worker_cpu_s"] = sum(r.get("cpu_ms", 0.0) for r in records) / 1000
        stats["worker_wall_s"] = sum(r.get("elapsed_ms", 0.0) for r in records) / 1000
    return elapsed, stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    rows = asyncio.run(one_table(args.repeats))
    print(f"command: {command_line()}")
    print(
        "| N x K | table, median s | 18 /optimize-tiling, median s | table / 18 requests | "
        "worker wall ms | worker CPU ms |"
    )
    print("|---|---|---|---|---|---|")
    for n, k, table, per_key, worker_ms, cpu_ms in rows:
        print(f"| {n} x {k} | {table:.3f} | {per_key:.3f} | {table / per_key:.2f} | "
              f"{worker_ms:.0f} | {cpu_ms:.0f} |")  # fmt: skip
    if args.pairs == 0:  # the single tables only
        return 0 if max(r[2] for r in rows) <= TARGET_TABLE_S else 1
    elapsed, stats = sweep(args.pairs, args.concurrency)
    print(
        f"\nsweep: {args.pairs} pairs in {elapsed:.1f} s wall (process start included), "
        f"{stats.get('answered')} answered, {stats.get('errors')} errors, "
        f"{stats.get('tables_written')} files; the workers' CPU time "
        f"{stats.get('worker_cpu_s'):.1f} s (their wall time {stats.get('worker_wall_s'):.1f} s)"
    )
    ok = max(r[2] for r in rows) <= TARGET_TABLE_S and elapsed <= TARGET_SWEEP_S
    ok = ok and stats.get("answered") == args.pairs
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
