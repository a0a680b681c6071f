"""The Store contract, checked on every backend (backends register in ``BACKENDS``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from app.store import MemoryStore, Store

#: name -> factory; a backend that needs a server adds a fixture-backed factory here
BACKENDS: dict[str, Callable[[], Store]] = {"memory": MemoryStore}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    backend = BACKENDS[request.param]()
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
    assert store.put_if_absent("locks", "solve", b"holder-1", ttl_s=0.2)
    assert not store.put_if_absent("locks", "solve", b"holder-2", ttl_s=0.2)
    assert store.get("locks", "solve") == b"holder-1"
    time.sleep(0.3)
    assert store.get("locks", "solve") is None
    assert store.keys("locks") == []
    assert store.put_if_absent("locks", "solve", b"holder-2", ttl_s=5)
