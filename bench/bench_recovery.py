"""Worker deaths (crash containment): how long until /readyz is ready again, and what requests see.

Against a real ``kperf serve`` (2 workers, in-memory cache off), ``--rounds`` times each:

* one idle worker SIGKILLed, no request sent: seconds until /readyz is 200 with two loaded
  workers, the dead one gone (the pool must notice by itself);
* both idle workers SIGKILLed, then two new problems sent at once: their statuses and latency,
  and seconds until ready;
* the busy worker SIGKILLed in the middle of a ~1 s solve: the request's status and latency
  (it is retried on another worker).

    .venv/bin/python -m bench.bench_recovery [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time
from collections import Counter
from typing import Any

import httpx

from bench.bench_deadline import fast_body, slow_body
from bench.common import command_line
from tests.app.service_helpers import start_server, stop_server


def workers(url: str, state: str) -> list[int]:
    body = httpx.get(f"{url}/readyz", timeout=10).json()
    return [w["pid"] for w in body["workers"] if w["state"] == state]


def seconds_until_ready(url: str, killed: list[int], started: float, cap_s: float = 30) -> float:
    while time.monotonic() - started < cap_s:
        response = httpx.get(f"{url}/readyz", timeout=10)
        body = response.json()
        pids = {w["pid"] for w in body["workers"]}
        if response.status_code == 200 and body["workers_alive"] == 2 and not pids & set(killed):
            return time.monotonic() - started
        time.sleep(0.01)
    return float("inf")


async def post(url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, float]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:

        async def one(body: dict[str, Any]) -> tuple[int, float]:
            started = time.monotonic()
            response = await http.post("/optimize-tiling", json=body)
            return response.status_code, time.monotonic() - started

        return await asyncio.gather(*(one(b) for b in bodies))


async def kill_busy_mid_solve(url: str, index: int) -> tuple[int, float]:
    request = asyncio.ensure_future(post(url, [slow_body(index, time_limit_s=8.0)]))
    end = time.monotonic() + 20
    while not (busy := await asyncio.to_thread(workers, url, "busy")):
        if time.monotonic() > end:
            raise RuntimeError("no worker became busy")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # well inside the solve
    os.kill(busy[0], signal.SIGKILL)
    [answer] = await request
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    proc, url = start_server({"KPERF_WORKERS": "2", "KPERF_CACHE_MEMORY_ITEMS": "0"})
    one_idle: list[float] = []
    both_idle: list[float] = []
    both_requests: list[tuple[int, float]] = []
    busy: list[tuple[int, float]] = []
    normal: list[tuple[int, float]] = []
    try:
        for r in range(args.rounds):
            base = 10_000 * (r + 1)
            seconds_until_ready(url, [], time.monotonic())
            victim = workers(url, "idle")[:1]
            started = time.monotonic()
            os.kill(victim[0], signal.SIGKILL)
            one_idle.append(seconds_until_ready(url, victim, started))

            victims = workers(url, "idle")
            started = time.monotonic()
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            both_requests += asyncio.run(post(url, [fast_body(base), fast_body(base + 1)]))
            both_idle.append(seconds_until_ready(url, victims, started))

            normal += asyncio.run(post(url, [slow_body(base + 2, time_limit_s=8.0)]))
            busy.append(asyncio.run(kill_busy_mid_solve(url, base + 3)))
            seconds_until_ready(url, [], time.monotonic())
    finally:
        stop_server(proc)

    def statuses(answers: list[tuple[int, float]]) -> str:
        return ", ".join(f"{s}: {n}" for s, n in sorted(Counter(s for s, _ in answers).items()))

    def median_ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:.0f}"

    print(f"command: `{command_line()}`\n")
    print(f"`kperf serve`, 2 workers, {args.rounds} rounds; medians (max)\n")
    print("| fault | /readyz ready again after ms | requests | their latency ms |")
    print("|---|---|---|---|")
    print(
        f"| one idle worker killed, no request | {median_ms(one_idle)} "
        f"({max(one_idle) * 1e3:.0f}) | - | - |"
    )
    both_latency = [t for _, t in both_requests]
    print(
        f"| both idle workers killed, 2 new problems sent at once | {median_ms(both_idle)} "
        f"({max(both_idle) * 1e3:.0f}) | {statuses(both_requests)} | {median_ms(both_latency)} "
        f"({max(both_latency) * 1e3:.0f}) |"
    )
    busy_latency = [t for _, t in busy]
    normal_latency = [t for _, t in normal]
    print(
        f"| busy worker killed 0.2 s into a solve (retried) | - | {statuses(busy)} "
        f"| {median_ms(busy_latency)} ({max(busy_latency) * 1e3:.0f}); the same solve "
        f"undisturbed: {median_ms(normal_latency)} |"
    )


if __name__ == "__main__":
    main()
