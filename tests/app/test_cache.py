"""The result cache: canonical keys, LRU, persistence across restarts, corrupt files."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

import app.jobs
from app.cache import Body, MemoryLRU, ResultCache, cache_key
from app.store import MemoryStore, StoreUnavailable, make_store
from app.store.sqlite_store import PURGE_EVERY_PUTS, SqliteStore
from kperf_client.client import KperfClient
from tests.app import pool_jobs
from tests.app.service_helpers import (
    clean_environ,
    in_app,
    make_settings,
    metric_value,
    problem,
)

__all__ = ["clean_environ"]

VERSIONS = {"model": "1", "profile": "rtx-a6000@abc"}


def test_key_ignores_field_order_but_not_values_or_versions() -> None:
    a = cache_key("optimize-tiling", {"m": 1, "n": 2, "ss": {"x": [1, 2], "y": 3}}, VERSIONS)
    b = cache_key("optimize-tiling", {"ss": {"y": 3, "x": [1, 2]}, "n": 2, "m": 1}, VERSIONS)
    assert a == b
    assert a != cache_key(
        "optimize-tiling", {"m": 1, "n": 3, "ss": {"x": [1, 2], "y": 3}}, VERSIONS
    )
    assert a != cache_key(
        "optimize-tiling", {"m": 1, "n": 2, "ss": {"x": [1, 2], "y": 3}}, {**VERSIONS, "model": "2"}
    )
    assert a != cache_key("predict-kernel", {"m": 1, "n": 2, "ss": {"x": [1, 2], "y": 3}}, VERSIONS)


def test_lru_evicts_the_least_recently_used() -> None:
    lru = MemoryLRU(max_bytes=1000, max_entry_bytes=1000, max_items=2)
    lru.put("a", b"1")
    lru.put("b", b"2")
    assert lru.get("a") == b"1"  # "b" is now the least recently used
    lru.put("c", b"3")
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == (b"1", None, b"3")
    assert len(lru) == 2


def test_lru_is_bounded_in_bytes() -> None:
    lru = MemoryLRU(max_bytes=100, max_entry_bytes=60)
    for key in "abcdefgh":
        assert lru.put(key, b"x" * 29)  # 30 bytes with its key: three fit in 100
        assert lru.size_bytes <= 100
    assert len(lru) == 3
    assert [lru.get(k) is not None for k in "efgh"] == [False, True, True, True]
    # replacing an entry accounts for the old size, not both
    lru.put("h", b"y" * 9)
    assert lru.size_bytes == 30 + 30 + 10


def test_entry_above_the_cap_is_not_held_and_evicts_nothing() -> None:
    lru = MemoryLRU(max_bytes=1000, max_entry_bytes=100)
    lru.put("small", b"s" * 50)
    assert not lru.put("huge", b"h" * 200)
    assert lru.get("huge") is None
    assert lru.get("small") == b"s" * 50
    assert lru.size_bytes == 55


@pytest.mark.parametrize("bounds", [(0, 100, 10), (1000, 100, 0)])
def test_zero_bytes_or_items_disables_the_lru(bounds: tuple[int, int, int]) -> None:
    lru = MemoryLRU(*bounds)
    assert not lru.put("k", b"v")
    assert lru.get("k") is None and lru.size_bytes == 0


def test_sqlite_store_survives_reopen(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'cache.sqlite3'}"
    first = ResultCache(MemoryLRU(0, 0), make_store(url))
    asyncio.run(first.put("k", b'{"answer":42}'))
    assert first.shared is not None
    first.shared.close()
    second = ResultCache(MemoryLRU(1000, 1000), make_store(url))
    assert _data(asyncio.run(second.get("k"))) == b'{"answer":42}'
    assert second.memory.get("k") == b'{"answer":42}', "a store hit is promoted into the LRU"
    assert asyncio.run(second.get("other")) is None


def test_the_in_process_store_is_not_a_second_copy() -> None:
    cache = ResultCache.in_front_of(MemoryLRU(100, 100), make_store("memory://"))
    assert cache.shared is None
    asyncio.run(cache.put("k", b"x" * 500))  # above the entry cap: not held anywhere
    assert asyncio.run(cache.get("k")) is None


class CountingStore(MemoryStore):
    """A stand-in for a network store: counts reads; ``down`` makes every call fail."""

    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.down = False

    def get(self, namespace: str, key: str) -> bytes | None:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("down")
        return super().get(namespace, key)

    def put(self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        if self.down:
            raise StoreUnavailable("down")
        super().put(namespace, key, value, ttl_s=ttl_s)


def test_concurrent_lookups_share_one_read_and_one_copy_of_a_large_body() -> None:
    store = CountingStore()
    cache = ResultCache(MemoryLRU(1000, 100), store)
    big = b"x" * 5000  # above the LRU's entry cap: lives in the store only

    async def five_at_once() -> None:
        bodies = await asyncio.gather(*(cache.get("k") for _ in range(5)))
        assert store.reads == 1
        assert all(b is bodies[0] for b in bodies) and _data(bodies[0]) == big
        again = await cache.get("k")  # a response still holds it: shared, no read
        assert again is bodies[0] and store.reads == 1

    async def scenario() -> None:
        await cache.put("k", big)
        await asyncio.create_task(five_at_once())  # its references die with it
        assert _data(await cache.get("k")) == big  # nobody held it: read again
        assert store.reads == 2
        assert cache.memory.size_bytes == 0, "never entered the LRU"

    asyncio.run(scenario())


def test_results_expire_from_the_shared_store(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = SqliteStore(path)
    cache = ResultCache(MemoryLRU(0, 0), store, store_ttl_s=3600)
    asyncio.run(cache.put("k", b"v"))
    conn = sqlite3.connect(path)
    (expires,) = conn.execute("SELECT expires_unix_s FROM store_entries").fetchone()
    assert time.time() + 3500 < expires <= time.time() + 3600
    store.put("results", "old", b"v", ttl_s=0.05)
    time.sleep(0.1)
    assert asyncio.run(cache.get("old")) is None
    # the expired row is deleted by a later put (every PURGE_EVERY_PUTS puts)
    for i in range(PURGE_EVERY_PUTS):
        store.put("other", str(i), b"x")
    assert conn.execute("SELECT count(*) FROM store_entries WHERE key = 'old'").fetchone() == (0,)
    conn.close()


def test_an_unavailable_store_is_a_miss_not_an_error() -> None:
    store = CountingStore()
    cache = ResultCache(MemoryLRU(1000, 100), store)
    store.down = True
    asyncio.run(cache.put("k", b"v"))  # kept in the LRU, the store write skipped
    assert _data(asyncio.run(cache.get("k"))) == b"v"
    assert asyncio.run(cache.get("absent")) is None


@pytest.mark.parametrize(
    "make_bad_path",
    [
        # not a database at all
        lambda tmp: _write(tmp / "garbage.sqlite3", b"this is not sqlite" * 100),
        # a valid header followed by garbage pages
        lambda tmp: _write(tmp / "truncated.sqlite3", b"SQLite format 3\x00" + b"\xff" * 4000),
        # the parent "directory" is a file: cannot be created
        lambda tmp: _write(tmp / "file", b"x") / "cache.sqlite3",
    ],
)
def test_bad_cache_file_is_bypassed(tmp_path: Path, make_bad_path) -> None:
    errors: list[str] = []
    store = make_store(f"sqlite://{make_bad_path(tmp_path)}", on_error=errors.append)
    cache = ResultCache(MemoryLRU(1000, 1000), store)
    asyncio.run(cache.put("k", b"{}"))  # still served from memory
    assert _data(asyncio.run(cache.get("k"))) == b"{}"
    assert errors == ["put"], "the failure was reported once (then the breaker holds off)"
    assert not store.health().ok
    assert "open" in (store.health().reason or "")


def test_store_failing_after_open_recovers_by_itself(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    store = SqliteStore(path)
    store.put("results", "k", b"v")
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE store_entries")  # e.g. another process wiped the file
    conn.commit()
    conn.close()
    with pytest.raises(StoreUnavailable):
        store.get("results", "k")
    # the next call opens the file again and recreates the table
    assert store.get("results", "k") is None
    store.put("results", "k", b"w")
    assert store.get("results", "k") == b"w"


def _data(body: Body | None) -> bytes | None:
    return None if body is None else body.data


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# -------------------------------------------------------------------- through the service


def test_repeat_request_is_a_hit_in_header_and_metrics() -> None:
    async def scenario(client: KperfClient) -> None:
        first = await client.optimize({"m": 2048, "n": 1024, "k": 1024, "device": "rtx-a6000"})
        # same problem, other field order, defaults spelled out (the memory model the default
        # resolves to included), other time limit
        second = await client.optimize(
            {
                "time_limit_s": 3.0,
                "top_k": 5,
                "device": "rtx-a6000",
                "memory_model": "l2-reuse",
                "k": 1024,
                "n": 1024,
                "m": 2048,
                "dtype": "fp16",
            }
        )
        different = await client.optimize(
            {"m": 2048, "n": 1024, "k": 1024, "device": "rtx-a6000", "top_k": 2}
        )
        assert (first.cache, second.cache, different.cache) == ("miss", "hit", "miss")
        assert second.response == first.response
        metrics = (await client.http.get("/metrics")).text
        assert metric_value(metrics, "kperf_cache_lookups_total", result="hit") == 1
        assert metric_value(metrics, "kperf_cache_lookups_total", result="miss") == 2

    in_app(scenario)


def test_persistent_cache_survives_a_restart(tmp_path: Path, monkeypatch) -> None:
    settings = make_settings(cache_path=tmp_path / "kperf.sqlite3")

    async def solve(client: KperfClient) -> tuple[str | None, object]:
        answer = await client.optimize(problem(n=3072))
        return answer.cache, answer.response

    cache_state, before = in_app(solve, settings)
    assert cache_state == "miss"
    # a restarted service answers without solving: the solver is now broken on purpose
    monkeypatch.setattr(app.jobs, "optimize_job", pool_jobs.broken_optimize)
    cache_state, after = in_app(solve, settings)
    assert cache_state == "hit"
    assert after == before


def test_corrupt_cache_file_does_not_stop_the_service(tmp_path: Path) -> None:
    path = _write(tmp_path / "kperf.sqlite3", b"\x00garbage" * 1000)

    async def scenario(client: KperfClient) -> None:
        assert (await client.readyz())["status"] == "ready"
        first = await client.optimize(problem(k=512))
        second = await client.optimize(problem(k=512))
        assert first.response.status == "optimal"
        assert (first.cache, second.cache) == ("miss", "hit")  # the LRU still works
        metrics = (await client.http.get("/metrics")).text
        # reaching the store at start-up failed, and was counted
        assert metric_value(metrics, "kperf_store_errors_total", operation="ping") >= 1
        assert (await client.readyz())["store"]["status"] == "degraded: store"

    in_app(scenario, make_settings(cache_path=path))
    assert path.read_bytes() == b"\x00garbage" * 1000, "the bad file is left for inspection"
