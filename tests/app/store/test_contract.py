"""The Store contract, checked on every backend (backends register in ``BACKENDS``)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.store import MemoryStore, Store, make_store
from app.store.redis_store import RedisStore
from app.store.sqlite_store import BLOB_IO_ABOVE_BYTES, SqliteStore
from tests.app.redis_helpers import redis_server

__all__ = ["redis_server"]


def _redis_url(request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue("redis_server")
    if server.proc is None:
        server.start()
    server.flush()
    return str(server.url)


def _sqlite_path(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("tmp_path") / "store.sqlite3")


#: name -> factory; a backend that needs a server or a file takes it from the test's fixtures
BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Store]] = {
    "memory": lambda request: MemoryStore(),
    "sqlite": lambda request: SqliteStore(Path(_sqlite_path(request))),
    "redis": lambda request: RedisStore(_redis_url(request)),
    # what the service holds: breaker + checked envelope around the backend
    "memory-service": lambda request: make_store("memory://"),
    "sqlite-service": lambda request: make_store("sqlite://" + _sqlite_path(request)),
    "redis-service": lambda request: make_store(_redis_url(request)),
}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    backend = BACKENDS[request.param](request)
    try:
        yield backend
    finally:
        backend.close()


def test_values_round_trip_per_namespace(store: Store) -> None:
    store.put("results", "k1", b"\x00one")
    store.put("profiles", "k1", b"two")
    assert store.get("results", "k1") == b"\x00one"
    assert store.get("profiles", "k1") == b"two"
    assert store.get("results", "absent") is None
    assert store.keys("results") == ["k1"]


def test_put_replaces_and_delete_removes(store: Store) -> None:
    store.put("ns", "b", b"1")
    store.put("ns", "a", b"2")
    store.put("ns", "b", b"3")
    assert store.keys("ns") == ["a", "b"]
    assert store.get("ns", "b") == b"3"
    store.delete("ns", "b")
    store.delete("ns", "never-there")
    assert store.keys("ns") == ["a"]


def test_put_if_absent_is_a_lock_that_expires(store: Store) -> None:
    # 1 s: the three calls before the sleep must fit in it on a loaded machine
    assert store.put_if_absent("locks", "solve", b"holder-1", ttl_s=1.0)
    assert not store.put_if_absent("locks", "solve", b"holder-2", ttl_s=1.0)
    assert store.get("locks", "solve") == b"holder-1"
    time.sleep(1.1)
    assert store.get("locks", "solve") is None
    assert store.keys("locks") == []
    assert store.put_if_absent("locks", "solve", b"holder-2", ttl_s=5)


def test_compare_and_delete_releases_only_the_holders_lock(store: Store) -> None:
    assert store.put_if_absent("locks", "solve", b"holder-1", ttl_s=5)
    assert not store.delete_if_equals("locks", "solve", b"holder-2")
    assert store.get("locks", "solve") == b"holder-1"
    assert store.delete_if_equals("locks", "solve", b"holder-1")
    assert store.get("locks", "solve") is None
    assert not store.delete_if_equals("locks", "solve", b"holder-1"), "already gone"
    # an expired lock is not released by its late holder after another took it
    assert store.put_if_absent("locks", "solve", b"holder-1", ttl_s=0.2)
    time.sleep(0.3)
    assert not store.delete_if_equals("locks", "solve", b"holder-1")
    assert store.put_if_absent("locks", "solve", b"holder-2", ttl_s=5)
    assert not store.delete_if_equals("locks", "solve", b"holder-1")
    assert store.get("locks", "solve") == b"holder-2"


def test_compare_and_expire_renews_only_the_holders_lock(store: Store) -> None:
    assert store.put_if_absent("locks", "solve", b"holder-1", ttl_s=0.4)
    assert not store.expire_if_equals("locks", "solve", b"holder-2", ttl_s=5)
    assert store.expire_if_equals("locks", "solve", b"holder-1", ttl_s=5)
    time.sleep(0.5)
    assert store.get("locks", "solve") == b"holder-1", "renewed past its first expiry"
    # renewing shortens too: the expiry is ttl_s from now
    assert store.expire_if_equals("locks", "solve", b"holder-1", ttl_s=0.2)
    time.sleep(0.3)
    assert store.get("locks", "solve") is None
    assert not store.expire_if_equals("locks", "solve", b"holder-1", ttl_s=5), "expired"
    assert store.get("locks", "solve") is None, "renewing never brings a value back"
    with pytest.raises(ValueError, match="ttl_s"):
        store.expire_if_equals("locks", "solve", b"holder-1", ttl_s=0)


@pytest.mark.parametrize("delta", [-1, 0, 1, 3 << 20])
def test_values_around_the_blob_io_size_round_trip(store: Store, delta: int) -> None:
    # SQLite switches to incremental blob I/O above BLOB_IO_ABOVE_BYTES, in both directions;
    # every backend must give back the same bytes on either side of that size
    size = BLOB_IO_ABOVE_BYTES + delta
    value = random.Random(size).randbytes(size)
    store.put("results", "big", value)
    assert store.get("results", "big") == value
    buffer = store.get_buffer("results", "big")
    assert buffer is not None and bytes(buffer) == value
    store.put("results", "big", b"small again")  # a large row replaced by a small one
    assert store.get("results", "big") == b"small again"


def test_put_parts_stores_their_concatenation(store: Store) -> None:
    parts = [b"head\n", memoryview(bytes(range(256)) * 9000), b"", b"tail"]
    store.put_parts("results", "parts", parts)
    assert store.get("results", "parts") == b"".join(parts)
    store.put_parts("results", "short", [b"a", b"b"], ttl_s=1.0)
    assert store.get("results", "short") == b"ab"
    time.sleep(1.1)
    assert store.get("results", "short") is None


def test_an_empty_value_is_not_an_absent_one(store: Store) -> None:
    store.put("results", "empty", b"")
    assert store.get("results", "empty") == b""
    assert store.get_buffer("results", "empty") == b""
    assert store.get_buffer("results", "absent") is None
