"""Constant-cost requests (a tenant's history must not slow it): the same load on a fresh Redis
store and on one holding the outside probe's history (250 calibrated profiles, 1,500 batches of runs
on the device being posted to), then /readyz while Redis is frozen (SIGSTOP).

Load per client, in turn: POST 3 new runs to a device's record (the request whose cost grew
with every batch before the per-device counter), a cached /predict-kernel, GET /devices/{id}.
Acceptance: throughput and p99 with history within 1.3x of the fresh store's (measured in the
same run); /readyz p99 <= 100 ms while Redis is stopped.

    .venv/bin/python bench/bench_tenancy.py --clients 8 --duration-s 10 [--record]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from app.profile_store import ProfileStore  # noqa: E402
from app.store import make_store  # noqa: E402
from bench.bench_large_answers import start_server, stop_server  # noqa: E402
from bench.common import command_line, record_results  # noqa: E402
from bench.load_test import paper_predict_body, percentile  # noqa: E402
from device_profiles import DeviceProfile, default_profiles  # noqa: E402
from tests.app.calibration_helpers import gemm_ws_runs  # noqa: E402
from tests.app.redis_helpers import RedisServer  # noqa: E402

DEVICE = "rtx-a6000"
#: the device's record as the load writes it (authentication off: tenant ``local``)
RECORD = f"local@{DEVICE}"
HISTORY_PROFILES = 250
HISTORY_BATCHES = 1500
RUNS_PER_POST = 3


def _fresh_runs(rng: random.Random) -> list[dict[str, object]]:
    # a new noise draw per post: new content, so every run is stored (no dedup shortcut)
    return rng.sample(gemm_ws_runs(rng.randrange(1 << 30)), RUNS_PER_POST)


def write_history(url: str) -> None:
    """The probe's history, written straight into the store the server uses."""
    store = make_store(url)
    profiles = ProfileStore(store, default_profiles())
    base = default_profiles()[DEVICE].model_dump()
    rng = random.Random(5)
    for i in range(HISTORY_PROFILES):
        copy = DeviceProfile.model_validate({**base, "id": f"{DEVICE}-cal-{i:012x}"})
        profiles.save(copy, "gemm-ws", _fresh_runs(rng), "local")
    for _ in range(HISTORY_BATCHES):
        profiles.append(RECORD, "local", "gemm-ws", _fresh_runs(rng))
    store.close()


async def _timed(samples: dict[str, list[float]], kind: str, request: object) -> None:
    started = time.perf_counter()
    response = await request  # type: ignore[misc]
    if response.status_code == 200:
        samples[kind].append(time.perf_counter() - started)
    else:
        samples[f"{kind} {response.status_code}"].append(time.perf_counter() - started)


async def load(url: str, clients: int, duration_s: float, seed: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = defaultdict(list)
    predict = paper_predict_body()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.post("/predict-kernel", json=predict)).status_code == 200  # warm
        stop_at = time.monotonic() + duration_s

        async def client(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.monotonic() < stop_at:
                body = {"model": "gemm-ws", "measurements": _fresh_runs(rng)}
                post = http.post(f"/devices/{DEVICE}/measurements", json=body)
                await _timed(samples, "post runs", post)
                await _timed(samples, "predict (hit)", http.post("/predict-kernel", json=predict))
                await _timed(samples, "device detail", http.get(f"/devices/{DEVICE}"))

        await asyncio.gather(*(client(i) for i in range(clients)))
    return samples


async def readyz_while_frozen(url: str, redis: RedisServer, duration_s: float) -> list[float]:
    """/readyz every 50 ms while Redis is stopped and clients keep posting runs."""
    samples: list[float] = []
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            stop_at = time.monotonic() + duration_s

            async def poster() -> None:
                rng = random.Random(3)
                while time.monotonic() < stop_at:
                    body = {"model": "gemm-ws", "measurements": _fresh_runs(rng)}
                    await http.post(f"/devices/{DEVICE}/measurements", json=body)

            async def prober() -> None:
                while time.monotonic() < stop_at:
                    started = time.perf_counter()
                    await http.get("/readyz")
                    samples.append(time.perf_counter() - started)
                    await asyncio.sleep(0.05)

            await asyncio.gather(prober(), *(poster() for _ in range(4)))
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    return samples


def summary(samples: dict[str, list[float]], duration_s: float) -> dict[str, tuple[float, ...]]:
    """kind -> (requests/s, p50 ms, p99 ms)."""
    return {
        kind: (len(v) / duration_s, percentile(v, 50) * 1e3, percentile(v, 99) * 1e3)
        for kind, v in sorted(samples.items())
    }


def alternate(
    fresh_url: str, history_url: str, clients: int, duration_s: float, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The same load on both servers, in alternating slices (the order swapped every round):
    a shared machine's other work then weighs on both alike."""
    fresh: dict[str, list[float]] = defaultdict(list)
    history: dict[str, list[float]] = defaultdict(list)
    slice_s = duration_s / rounds
    for r in range(rounds):
        order = [(fresh_url, fresh), (history_url, history)]
        for url, into in order if r % 2 == 0 else reversed(order):
            for kind, values in asyncio.run(load(url, clients, slice_s, 10 + r)).items():
                into[kind].extend(values)
    return fresh, history


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=10.0, help="per store, in total")
    parser.add_argument("--rounds", type=int, default=4, help="alternating slices per store")
    parser.add_argument(
        "--record", action="store_true", help="replace its section of bench/RESULTS.md"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = [RedisServer(Path(tmp) / name) for name in ("fresh", "history")]
        servers = []
        try:
            for r in redis:
                r.directory.mkdir()
                r.start()
            started = time.perf_counter()
            write_history(redis[1].url)
            history_s = time.perf_counter() - started
            for r in redis:
                env = {
                    "KPERF_STORE_URL": r.url,
                    "KPERF_WORKERS": "1",
                    "KPERF_MAX_CALIBRATION_MEASUREMENTS": "1000000",
                }
                servers.append(start_server(env, r.directory / "server.log"))
            (_, fresh_url), (_, history_url) = servers
            for url in (fresh_url, history_url):  # warm-up, unmeasured
                asyncio.run(load(url, args.clients, 2.0, 0))
            fresh_samples, history_samples = alternate(
                fresh_url, history_url, args.clients, args.duration_s, args.rounds
            )
            fresh = summary(fresh_samples, args.duration_s)
            old = summary(history_samples, args.duration_s)
            ready = asyncio.run(readyz_while_frozen(history_url, redis[1], args.duration_s / 2))
        finally:
            for server, _ in servers:
                stop_server(server)
            for r in redis:
                r.kill()
    lines = [
        f"`{command_line()}`: {args.clients} clients, {args.duration_s:g} s per store in "
        f"{args.rounds} alternating slices, one server (1 worker) per Redis store; the history "
        f"store holds {HISTORY_PROFILES} calibrated profiles and {HISTORY_BATCHES} batches of "
        f"{RUNS_PER_POST} runs on the posted device (written in {history_s:.1f} s).",
        "",
        "| request | fresh req/s | fresh p50 ms | fresh p99 ms | history req/s | history p50 ms "
        "| history p99 ms | p99 ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ok = True
    for kind in sorted(set(fresh) | set(old)):
        f, h = fresh.get(kind, (0.0, 0.0, 0.0)), old.get(kind, (0.0, 0.0, 0.0))
        ratio = h[2] / f[2] if f[2] else float("inf")
        lines.append(
            f"| {kind} | {f[0]:.1f} | {f[1]:.1f} | {f[2]:.1f} | {h[0]:.1f} | {h[1]:.1f} | "
            f"{h[2]:.1f} | {ratio:.2f} |"
        )
    total_f = sum(v[0] for v in fresh.values())
    total_h = sum(v[0] for v in old.values())
    ready_p99 = percentile(ready, 99) * 1e3
    ok = total_f / total_h <= 1.3 and ready_p99 <= 100
    lines += [
        "",
        f"Throughput, all requests: fresh {total_f:.1f} req/s, with history {total_h:.1f} req/s "
        f"(ratio {total_f / total_h:.2f}, target <= 1.3). /readyz while Redis is SIGSTOPped "
        f"(4 clients posting runs): {len(ready)} probes, p50 {percentile(ready, 50) * 1e3:.1f} "
        f"ms, p99 {ready_p99:.1f} ms (target <= 100 ms). {'PASS' if ok else 'FAIL'}.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.record:
        record_results("Tenancy", command_line(), text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
