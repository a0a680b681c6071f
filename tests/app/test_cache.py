"""The result cache: canonical keys, LRU, persistence across restarts, corrupt files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import app.jobs
from app.cache import MemoryLRU, ResultCache, SqliteStore, cache_key
from app.client import KperfClient
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
    lru = MemoryLRU(2)
    lru.put("a", "1")
    lru.put("b", "2")
    assert lru.get("a") == "1"  # "b" is now the least recently used
    lru.put("c", "3")
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == ("1", None, "3")
    assert len(lru) == 2


def test_sqlite_store_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    first = ResultCache(0, path)
    first.put("k", {"answer": 42})
    first.close()
    second = ResultCache(0, path)
    assert second.get("k") == {"answer": 42}
    assert second.get("other") is None


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
    cache = ResultCache(4, make_bad_path(tmp_path), on_error=errors.append)
    cache.put("k", {"v": 1})  # still served from memory
    assert cache.get("k") == {"v": 1}
    assert cache.store is not None and not cache.store.available
    assert errors, "the failure was reported"


def test_store_failing_after_open_is_bypassed(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    store = SqliteStore(path)
    assert store.available
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE results")  # e.g. another process wiped the file
    conn.commit()
    conn.close()
    assert store.get("k") is None
    store.put("k", "{}")
    assert not store.available


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# -------------------------------------------------------------------- through the service


def test_repeat_request_is_a_hit_in_header_and_metrics() -> None:
    async def scenario(client: KperfClient) -> None:
        first = await client.optimize(problem(m=2048))
        # same problem, other field order, defaults spelled out, other time limit
        second = await client.optimize(
            {
                "time_limit_s": 3.0,
                "top_k": 5,
                "device": "rtx-a6000",
                "k": 1024,
                "n": 1024,
                "m": 2048,
                "dtype": "fp16",
            }
        )
        different = await client.optimize(problem(m=2048, top_k=2))
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
        assert metric_value(metrics, "kperf_cache_errors_total", operation="open") == 1

    in_app(scenario, make_settings(cache_path=path))
    assert path.read_bytes() == b"\x00garbage" * 1000, "the bad file is left for inspection"
