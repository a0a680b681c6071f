"""Redis outage under load: two ``kperf serve`` instances on one real redis-server, 16 clients.

Each client loop solves a new shape on instance A, then asks instance B for the same shape: a
hit on B can only come through the shared store. Redis is killed (SIGKILL) a quarter of the
way through the run and started again (empty, on the same port) at three quarters. Reported per
phase (before, outage, after): requests, statuses, and B's hit ratio; /readyz of A is sampled
every 0.5 s.

Acceptance (a store outage degrades, never fails): zero 5xx; /readyz says "degraded: store"
(and 200) during the outage; B's hits resume after Redis returns. Exit status 1 when a check fails.

    .venv/bin/python bench/bench_store_outage.py --clients 16 --duration-s 20 [--record]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.bench_large_answers import start_server, stop_server  # noqa: E402
from bench.common import command_line, record_results  # noqa: E402
from bench.load_test import percentile  # noqa: E402
from tests.app.redis_helpers import RedisServer  # noqa: E402

PHASES = ("before", "outage", "after")


class Run:
    def __init__(self, duration_s: float) -> None:
        self.start = time.monotonic()
        self.kill_at = self.start + duration_s / 4
        self.restart_at = self.start + 3 * duration_s / 4
        self.stop_at = self.start + duration_s
        self.statuses: dict[str, Counter[int]] = defaultdict(Counter)
        self.b_cache: dict[str, Counter[str]] = defaultdict(Counter)
        self.latency_s: dict[str, list[float]] = defaultdict(list)
        self.ready: list[tuple[float, int, str]] = []

    def phase(self, at: float) -> str:
        if at < self.kill_at:
            return "before"
        return "outage" if at < self.restart_at else "after"


async def _timed(
    http: httpx.AsyncClient, url: str, body: dict[str, object], run: Run
) -> httpx.Response:
    started = time.monotonic()
    response = await http.post(f"{url}/optimize-tiling", json=body)
    phase = run.phase(started)
    run.statuses[phase][response.status_code] += 1
    run.latency_s[phase].append(time.monotonic() - started)
    return response


async def _client(http: httpx.AsyncClient, a: str, b: str, index: int, run: Run) -> None:
    n = 0
    while time.monotonic() < run.stop_at:
        n += 1
        # a new shape per iteration: small enough to solve in a fraction of a second
        body = {"m": 64 * (index * 1000 + n), "n": 1024, "k": 256, "device": "rtx-a6000"}
        first = await _timed(http, a, body, run)
        second = await _timed(http, b, body, run)
        if first.status_code == 200 and second.status_code == 200:
            run.b_cache[run.phase(time.monotonic())][second.headers["x-cache"]] += 1


async def _watch_ready(http: httpx.AsyncClient, a: str, run: Run) -> None:
    while time.monotonic() < run.stop_at:
        response = await http.get(f"{a}/readyz")
        store = response.json()["store"]["status"]
        run.ready.append((time.monotonic() - run.start, response.status_code, store))
        await asyncio.sleep(0.5)


async def _outage(redis: RedisServer, run: Run) -> None:
    await asyncio.sleep(run.kill_at - time.monotonic())
    redis.kill()
    await asyncio.sleep(run.restart_at - time.monotonic())
    redis.start()


async def main_async(a: str, b: str, redis: RedisServer, clients: int, duration_s: float) -> Run:
    run = Run(duration_s)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:
        await asyncio.gather(
            _outage(redis, run),
            _watch_ready(http, a, run),
            *(_client(http, a, b, i, run) for i in range(clients)),
        )
    return run


def report(run: Run, command: str, args: argparse.Namespace) -> tuple[str, bool]:
    lines = [
        f"Command: `{command}` (two `kperf serve` instances, KPERF_WORKERS=2, "
        "KPERF_QUEUE_SIZE=64, KPERF_STORE_URL=redis://127.0.0.1:<port>/0; redis-server 7 "
        "without persistence, SIGKILLed at 1/4 of the run and restarted at 3/4; clients on the "
        f"same 2-core machine, load average {os.getloadavg()[0]:.1f} at the end)",
        "",
        "| phase | requests | statuses | p50 ms | p99 ms | B answers from the store (hit/all) |",
        "|---|---|---|---|---|---|",
    ]
    fivexx = 0
    for phase in PHASES:
        statuses = run.statuses[phase]
        fivexx += sum(n for s, n in statuses.items() if s >= 500)
        cache = run.b_cache[phase]
        lines.append(
            f"| {phase} | {sum(statuses.values())} | {dict(sorted(statuses.items()))} | "
            f"{percentile(run.latency_s[phase], 50) * 1000:.0f} | "
            f"{percentile(run.latency_s[phase], 99) * 1000:.0f} | "
            f"{cache['hit']}/{sum(cache.values())} |"
        )
    outage_ready = [r for t, c, r in run.ready if run.phase(run.start + t) == "outage"]
    ready_codes = Counter(c for _, c, _ in run.ready)
    degraded_seen = outage_ready.count("degraded: store")
    first_ok_after = next(
        (t for t, _, r in run.ready if run.start + t >= run.restart_at and r == "ok"), None
    )
    restart_s = run.restart_at - run.start
    lines += [
        "",
        f"- /readyz of A every 0.5 s: statuses {dict(ready_codes)}; during the outage "
        f'{degraded_seen}/{len(outage_ready)} samples said "degraded: store"; back to "ok" '
        + (
            f"{first_ok_after - restart_s:.1f} s after Redis restarted"
            if first_ok_after is not None
            else "NEVER"
        ),
    ]
    resumed = run.b_cache["after"]["hit"] > 0
    ok = fivexx == 0 and degraded_seen > 0 and resumed and 200 in ready_codes
    lines.append(
        f"\nAcceptance: zero 5xx {'yes' if fivexx == 0 else f'NO ({fivexx})'}; /readyz degraded "
        f"(200) during the outage {'yes' if degraded_seen else 'NO'}; hits through the store "
        f"resume after it {'yes' if resumed else 'NO'}."
    )
    return "\n".join(lines), ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument(
        "--record", action="store_true", help="replace its section of bench/RESULTS.md"
    )
    args = parser.parse_args()
    command = command_line()
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        env = {"KPERF_STORE_URL": redis.url, "KPERF_WORKERS": "2", "KPERF_QUEUE_SIZE": "64"}
        try:
            a, url_a = start_server(env, Path(tmp) / "a.log")
            try:
                b, url_b = start_server(env, Path(tmp) / "b.log")
                try:
                    run = asyncio.run(
                        main_async(url_a, url_b, redis, args.clients, args.duration_s)
                    )
                finally:
                    stop_server(b)
            finally:
                stop_server(a)
        finally:
            redis.kill()
    text, ok = report(run, command, args)
    print(text)
    if args.record:
        record_results("Recovery", command, text, "Shared store: Redis killed under load")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
