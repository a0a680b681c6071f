"""The shared store through the service, on a real redis-server: two uvicorn processes share
answers, and identical concurrent requests over both solve once (single-flight); a replica killed
mid-solve costs only that solve; Redis dying mid-load costs no 5xx, /readyz says "degraded:
store", and hits through the store resume by themselves when it returns; a bad value in the
store is never served."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from kperf_client.client import KperfClient
from tests.app.redis_helpers import RedisServer, redis_server, redis_url
from tests.app.service_helpers import (
    clean_environ,
    in_app,
    make_settings,
    metric_value,
    problem,
    servers,
    start_server,
    stop_server,
)

__all__ = ["clean_environ", "redis_server", "redis_url"]


#: single-flight locks of the servers here expire this long after their holder stops renewing
LOCK_TTL_S = 2.0
#: a shape whose solve takes 1-2 s on one worker (65,536 pipeline stages per ranked candidate),
#: so identical requests sent together overlap it
SLOW = problem(k=1 << 20, top_k=5, search_space={"tile_k": [16]}, time_limit_s=60)


@pytest.fixture(scope="module")
def two_instances(redis_server: RedisServer) -> Iterator[tuple[str, str]]:
    """Two `kperf serve` processes on the module's Redis (queue large enough for 16 clients)."""
    env = {
        "KPERF_STORE_URL": redis_server.url,
        "KPERF_QUEUE_SIZE": "64",
        "KPERF_SINGLEFLIGHT_LOCK_TTL_S": str(LOCK_TTL_S),
    }
    with servers(2, env) as (url_a, url_b):
        yield url_a, url_b


def test_a_shape_solved_on_one_instance_is_a_hit_on_the_other(
    two_instances: tuple[str, str], redis_url: str
) -> None:
    url_a, url_b = two_instances
    body = problem(m=1536)
    first = httpx.post(f"{url_a}/optimize-tiling", json=body, timeout=60)
    second = httpx.post(f"{url_b}/optimize-tiling", json=body, timeout=60)
    assert (first.status_code, second.status_code) == (200, 200)
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
    assert second.content == first.content, "B sends the bytes A stored"
    ready = httpx.get(f"{url_b}/readyz", timeout=10).json()
    assert ready["store"] == {"backend": "redis", "status": "ok", "reason": None}


def _counts(url: str) -> dict[str, float]:
    """Solves (complete or not) and single-flight outcomes of one server, from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts = {
        outcome: metric_value(text, "kperf_singleflight_total", outcome=outcome)
        for outcome in ("holder", "waited", "coalesced", "took_over")
    }
    counts["solves"] = sum(
        metric_value(
            text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome=outcome
        )
        for outcome in ("ok", "partial")
    )
    return counts


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after}


def test_eight_identical_concurrent_requests_over_two_instances_solve_once(
    two_instances: tuple[str, str], redis_url: str
) -> None:
    url_a, url_b = two_instances
    before = [_counts(u) for u in two_instances]

    async def eight() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(
                *(http.post(f"{url_a if i % 2 else url_b}/optimize-tiling", json=SLOW)
                  for i in range(8))
            )  # fmt: skip

    responses = asyncio.run(eight())
    assert [r.status_code for r in responses] == [200] * 8
    assert len({r.content for r in responses}) == 1
    # hit: this request caused no solve
    assert sorted(r.headers["x-cache"] for r in responses) == ["hit"] * 7 + ["miss"]
    a, b = (_delta(_counts(u), old) for u, old in zip(two_instances, before, strict=True))
    assert a["solves"] + b["solves"] == 1, (a, b)
    # one flight per instance (the other three requests of each joined it); one held the
    # lock and solved, the other waited for its answer in Redis
    assert {"holder": a["holder"] + b["holder"], "waited": a["waited"] + b["waited"]} == {
        "holder": 1,
        "waited": 1,
    }, (a, b)
    assert a["coalesced"] == b["coalesced"] == 3


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (the fork server, the workers), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    family, todo = [], [pid]
    while todo:
        current = todo.pop()
        family.append(current)
        todo.extend(parents.get(current, []))
    return family


def _kill_family(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_an_instance_killed_mid_solve_costs_only_that_solve(
    redis_server: RedisServer, redis_url: str, two_instances: tuple[str, str]
) -> None:
    _, url_b = two_instances
    body = {**SLOW, "m": 2048}
    raw = redis.Redis.from_url(redis_url)
    c, url_c = start_server(
        {"KPERF_STORE_URL": redis_server.url, "KPERF_SINGLEFLIGHT_LOCK_TTL_S": str(LOCK_TTL_S)}
    )
    try:
        # C takes the lock and starts solving; then C dies with every process it has (as a
        # container does), without a word to Redis
        def ask_c() -> None:
            with contextlib.suppress(httpx.HTTPError):  # C dies before it answers
                httpx.post(f"{url_c}/optimize-tiling", json=body, timeout=30)

        asking_c = threading.Thread(target=ask_c, daemon=True)
        asking_c.start()
        deadline = time.monotonic() + 20
        while not list(raw.scan_iter(match="kperf:17:singleflight:lock:*")):
            assert time.monotonic() < deadline, "C never took the single-flight lock"
            time.sleep(0.01)
        _kill_family(_family(c.pid))
        c.wait(timeout=10)
        asking_c.join(timeout=10)  # its connection was reset
        # B finds C's lock, waits for it to expire (C no longer renews it), takes it, solves
        before = _counts(url_b)
        started = time.monotonic()
        answer = httpx.post(f"{url_b}/optimize-tiling", json=body, timeout=60)
        elapsed_s = time.monotonic() - started
        assert answer.status_code == 200 and answer.headers["x-cache"] == "miss"
        assert answer.json()["status"] == "optimal"
        b = _delta(_counts(url_b), before)
        assert (b["took_over"], b["holder"], b["solves"]) == (1, 0, 1), b
        assert elapsed_s < LOCK_TTL_S + 15, elapsed_s
        assert not list(raw.scan_iter(match="kperf:17:singleflight:lock:*")), "B released it"
    finally:
        _kill_family(_family(c.pid) if c.poll() is None else [])
        stop_server(c)
        raw.close()


async def _client_loop(
    http: httpx.AsyncClient, stop_at: float, index: int, statuses: Counter[int]
) -> None:
    n = 0
    while time.monotonic() < stop_at:
        # mostly repeats (LRU hits), some new shapes (solves that try the store)
        m = 1024 if n % 4 else 64 * (index * 50 + n + 1)
        response = await http.post("/optimize-tiling", json=problem(m=m, k=256, time_limit_s=5))
        statuses[response.status_code] += 1
        n += 1


async def _load_with_outage(
    url: str, server: RedisServer, clients: int, duration_s: float
) -> tuple[Counter[int], dict[str, object], str]:
    statuses: Counter[int] = Counter()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        stop_at = time.monotonic() + duration_s
        load = asyncio.gather(*(_client_loop(http, stop_at, i, statuses) for i in range(clients)))
        await asyncio.sleep(duration_s / 3)
        server.kill()
        await asyncio.sleep(duration_s / 3)
        degraded = (await http.get("/readyz")).json()
        await load
        metrics = (await http.get("/metrics")).text
    return statuses, degraded, metrics


@pytest.mark.slow
def test_redis_killed_mid_load_costs_no_5xx_and_hits_resume(
    redis_server: RedisServer, redis_url: str, two_instances: tuple[str, str]
) -> None:
    url_a, url_b = two_instances
    try:
        statuses, degraded, metrics = asyncio.run(_load_with_outage(url_a, redis_server, 16, 6))
        assert sum(statuses.values()) > 16
        assert [s for s in statuses if s >= 500] == [], statuses
        assert degraded["status"] == "ready"
        assert degraded["store"]["status"] == "degraded: store"
        assert degraded["store"]["backend"] == "redis"
        store_errors = {
            op: metric_value(metrics, "kperf_store_errors_total", operation=op)
            for op in ("get", "put", "ping")
        }
        assert sum(store_errors.values()) >= 1, store_errors
        # Redis returns (empty: it kept nothing on disk); both instances reconnect by themselves
        redis_server.start()
        deadline = time.monotonic() + 15
        while True:
            ready = [httpx.get(f"{u}/readyz", timeout=10).json() for u in (url_a, url_b)]
            if all(r["store"]["status"] == "ok" for r in ready):
                break
            assert time.monotonic() < deadline, ready
            time.sleep(0.2)
        body = problem(m=2304)
        first = httpx.post(f"{url_a}/optimize-tiling", json=body, timeout=60)
        second = httpx.post(f"{url_b}/optimize-tiling", json=body, timeout=60)
        assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
    finally:
        if redis_server.proc is None:
            redis_server.start()


def test_redis_unreachable_at_start_then_reached(redis_server: RedisServer, redis_url: str) -> None:
    redis_server.kill()

    async def scenario(client: KperfClient) -> None:
        ready = await client.readyz()
        assert ready["status"] == "ready"
        assert ready["store"]["status"] == "degraded: store"
        assert "ConnectionError" in ready["store"]["reason"]
        first = await client.optimize(problem(n=1536))
        second = await client.optimize(problem(n=1536))
        assert first.response.status == "optimal"
        assert (first.cache, second.cache) == ("miss", "hit")  # the local LRU
        redis_server.start()
        deadline = time.monotonic() + 15
        while (await client.readyz())["store"]["status"] != "ok":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)

    in_app(scenario, make_settings(store_url=redis_url))


def test_a_corrupt_result_in_redis_is_dropped_counted_and_recomputed(redis_url: str) -> None:
    async def solve(client: KperfClient) -> tuple[str | None, object, str]:
        answer = await client.optimize(problem(k=768))
        metrics = (await client.http.get("/metrics")).text
        return answer.cache, answer.response, metrics

    settings = make_settings(store_url=redis_url)
    cache, before, _ = in_app(solve, settings)
    assert cache == "miss"
    raw = redis.Redis.from_url(redis_url)
    keys = list(raw.scan_iter(match="kperf:7:results:*"))
    assert len(keys) == 1
    # results expire (KPERF_CACHE_STORE_TTL_S, a week): Redis may evict them (volatile-lru)
    assert 6 * 24 * 3600 < raw.ttl(keys[0]) <= 7 * 24 * 3600  # type: ignore[operator]
    raw.set(keys[0], raw.get(keys[0])[:-10] + b"corrupted!")  # type: ignore[index]
    # a new process (empty LRU) reads the bad value: a miss, answered by the solver
    cache, after, metrics = in_app(solve, settings)
    assert cache == "miss" and after.best == before.best  # type: ignore[attr-defined]
    assert (
        metric_value(
            metrics, "kperf_store_decode_failures_total", namespace="results", reason="checksum"
        )
        == 1
    )
    # ...which stored a good value again: the next process hits it
    cache, _, metrics = in_app(solve, settings)
    assert cache == "hit"
    assert metric_value(metrics, "kperf_store_decode_failures_total") == 0
    raw.close()
