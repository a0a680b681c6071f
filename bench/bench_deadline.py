"""Short time limits: how far past its limit a solve answers, and a burst of them.

1. Overrun: the real optimize job (a search space the solver cannot finish, so every job uses
   its whole limit) through the worker pool, one and two at a time, with a hard deadline far
   away so nothing is killed: round trip minus the limit the job was given. This is what the
   pool must reserve between a job's limit and the request's bound (app/pool.py,
   ``INITIAL_OVERRUN_S`` and :class:`OverrunEstimate`).
2. Bursts against a real ``kperf serve`` (2 workers): 8 identical requests with
   ``time_limit_s`` 0.3 (the issue's report), and 16 requests with ``time_limit_s`` 0.1-0.5
   (half of them solvable in time, half not), each repeated ``--rounds`` times: statuses,
   answers past their bound, workers killed, and how the metrics counted the outcomes.

    .venv/bin/python -m bench.bench_deadline [--jobs 24] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from typing import Any

import httpx

from app.jobs import optimize_job
from app.main import WORKER_PRELOAD
from app.pool import WorkerPool
from bench.common import command_line
from bench.load_test import SLOW_SPACE, percentile
from tests.app.service_helpers import metric_value, start_server, stop_server

DEVICE = "rtx-a6000"


def slow_body(index: int, **extra: Any) -> dict[str, Any]:
    """A problem the solver cannot finish within a second (48^3 tile shapes x 8 depths)."""
    return {
        "m": 100_003 + index,
        "n": 99_991,
        "k": 65_537,
        "device": DEVICE,
        "search_space": SLOW_SPACE,
        # the paper's loads: no raster dimensions, so 48^3 x 8 stays under the space limit
        "memory_model": "dram-stream",
        **extra,
    }


def fast_body(index: int, **extra: Any) -> dict[str, Any]:
    """A problem the solver proves optimal in well under 0.1 s (the default search space)."""
    return {"m": 1000 + index, "n": 1024, "k": 1024, "device": DEVICE, **extra}


async def measure_overrun(jobs: int, concurrency: int) -> list[float]:
    """Seconds past the given limit at which each job's answer arrived."""
    pool = WorkerPool(2, jobs, preload=WORKER_PRELOAD, nice=5)
    await pool.start()
    overruns: list[float] = []
    try:

        async def one(index: int) -> None:
            limit_s = 0.1 + 0.1 * (index % 4)
            started = time.monotonic()
            try:
                await pool.run(
                    optimize_job,
                    {"request_json": slow_body(index), "profile_json": None},
                    time_limit_s=limit_s,
                    hard_deadline_s=60.0,
                )
            except Exception:  # noqa: BLE001 - SolverTimeout: the job used its whole limit
                pass
            overruns.append(time.monotonic() - started - limit_s)

        for first in range(0, jobs, concurrency):
            await asyncio.gather(*(one(i) for i in range(first, min(jobs, first + concurrency))))
    finally:
        await pool.stop()
    return overruns


def restarts(text: str) -> float:
    return sum(
        metric_value(text, "kperf_worker_restarts_total", reason=r)
        for r in ("idle", "crash", "timeout", "memory")
    )


def outcomes(text: str) -> Counter[str]:
    return Counter(
        {
            o: metric_value(
                text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome=o
            )
            for o in ("ok", "partial", "timeout", "crash", "memory", "error")
        }
    )


async def burst(url: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        before = (await http.get("/metrics")).text

        async def one(body: dict[str, Any]) -> tuple[int, str, bool, float]:
            response = await http.post("/optimize-tiling", json=body)
            timing = response.headers.get("server-timing", "dur=nan")
            server_s = float(timing.split("dur=")[1]) / 1000
            bound_s = body["time_limit_s"] * 1.2 + 0.1
            answer = response.json()
            kind = answer.get("status", "?") if response.status_code == 200 else ""
            # a 504 should name the limit the client sent, not what queueing left of it
            names_limit = f"{body['time_limit_s']} s" in str(answer.get("detail", ""))
            return response.status_code, kind, names_limit, server_s - bound_s

        answers = await asyncio.gather(*(one(b) for b in bodies))
        after = (await http.get("/metrics")).text
    statuses = Counter(
        f"{status} {kind}".strip() if status == 200 else str(status)
        for status, kind, _, _ in answers
    )
    timeouts = [names for status, _, names, _ in answers if status == 504]
    return {
        "statuses": statuses,
        "named": f"{sum(timeouts)}/{len(timeouts)}",
        "late": sum(over > 0 for *_, over in answers),
        "worst_over_bound_s": max(over for *_, over in answers),
        "killed": restarts(after) - restarts(before),
        "outcomes": outcomes(after) - outcomes(before),
        "refused_before_start": metric_value(
            after, "kperf_rejected_requests_total", reason="deadline"
        )
        - metric_value(before, "kperf_rejected_requests_total", reason="deadline"),
    }


def burst_rounds(rounds: int) -> dict[str, list[dict[str, Any]]]:
    proc, url = start_server(
        {"KPERF_WORKERS": "2", "KPERF_CACHE_MEMORY_ITEMS": "0", "KPERF_QUEUE_SIZE": "32"}
    )
    results: dict[str, list[dict[str, Any]]] = {"8 x 0.3 s": [], "16 x 0.1-0.5 s": []}
    try:
        for r in range(rounds):
            base = 1000 * (r + 1)
            same = [slow_body(base, time_limit_s=0.3)] * 8
            results["8 x 0.3 s"].append(asyncio.run(burst(url, same)))
            mixed = [
                (slow_body if i % 2 else fast_body)(
                    base + i, time_limit_s=round(0.1 + 0.4 * i / 15, 3)
                )
                for i in range(16)
            ]
            results["16 x 0.1-0.5 s"].append(asyncio.run(burst(url, mixed)))
    finally:
        stop_server(proc)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=24, help="jobs per overrun measurement")
    parser.add_argument("--rounds", type=int, default=5, help="repetitions of each burst")
    args = parser.parse_args()
    print(f"command: `{command_line()}`\n")
    print("### Overrun: answer arrival past the job's time limit (real optimize job, pool)\n")
    print("| jobs at a time | jobs | median ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for concurrency in (1, 2):
        values = asyncio.run(measure_overrun(args.jobs, concurrency))
        print(
            f"| {concurrency} | {len(values)} | {statistics.median(values) * 1e3:.0f} "
            f"| {percentile(values, 90) * 1e3:.0f} | {percentile(values, 99) * 1e3:.0f} "
            f"| {max(values) * 1e3:.0f} |"
        )
    print(f"\n### Bursts against `kperf serve` (2 workers), {args.rounds} rounds each\n")
    print(
        "| burst | round | statuses | answers past their bound | worst vs bound ms "
        "| workers killed | metric outcomes | refused before start | 504s naming the limit |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rounds in burst_rounds(args.rounds).items():
        for index, result in enumerate(rounds, start=1):
            counted = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(result["outcomes"].items()))
            statuses = ", ".join(f"{k}: {v}" for k, v in sorted(result["statuses"].items()))
            print(
                f"| {name} | {index} | {statuses} | {result['late']} "
                f"| {result['worst_over_bound_s'] * 1e3:+.0f} | {result['killed']:.0f} "
                f"| {counted} | {result['refused_before_start']:.0f} "
                f"| {result['named']} |"
            )
        worst = statistics.median(r["worst_over_bound_s"] for r in rounds) * 1e3
        killed = sum(r["killed"] for r in rounds)
        print(
            f"| {name} | median / total | | | {worst:+.0f} (median) | {killed:.0f} (total) | | | |"
        )


if __name__ == "__main__":
    main()
