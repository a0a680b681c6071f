"""The checked envelope: every way a stored value can be wrong is refused, dropped and counted,
on the real backends too (a value written behind the service's back into SQLite or Redis)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.store import CheckedStore, CorruptValue, MemoryStore, Store, make_store, seal, unseal
from app.store.checked import ENVELOPE_VERSION
from app.store.redis_store import RedisStore
from tests.app.redis_helpers import redis_server, redis_url

__all__ = ["redis_server", "redis_url"]

GOOD = seal("results", "k1", b'{"answer": 42}')


def test_round_trip_keeps_any_bytes() -> None:
    payload = bytes(range(256)) * 3 + b"\n\n kperf-store 1 x y\n"
    assert unseal("ns", "key", seal("ns", "key", payload)) == payload
    assert unseal("ns", "key", seal("ns", "key", b"")) == b""


def test_header_is_readable_and_versioned() -> None:
    header = GOOD.split(b"\n", 1)[0].decode()
    magic, version, namespace, digest = header.split(" ")
    assert (magic, int(version), namespace, len(digest)) == (
        "kperf-store",
        ENVELOPE_VERSION,
        "results",
        64,
    )


@pytest.mark.parametrize(
    ("value", "namespace", "key", "reason"),
    [
        # a foreign value: plain JSON another program wrote
        (b'{"answer": 42}', "results", "k1", "not-an-envelope"),
        # nothing at all
        (b"", "results", "k1", "not-an-envelope"),
        # a header line too long to be ours (no newline in the first 512 bytes)
        (b"x" * 600 + b"\n", "results", "k1", "not-an-envelope"),
        # our magic, a mangled header
        (b"kperf-store 1 results\n{}", "results", "k1", "not-an-envelope"),
        # a future (or past) envelope version
        (GOOD.replace(b"kperf-store 1 ", b"kperf-store 2 ", 1), "results", "k1", "version"),
        # a value written for another namespace, copied here
        (GOOD, "profiles", "k1", "namespace"),
        # a value copied under another key
        (GOOD, "results", "k2", "checksum"),
        # truncated payload
        (GOOD[:-3], "results", "k1", "checksum"),
        # one flipped bit in the payload
        (GOOD[:-1] + bytes([GOOD[-1] ^ 1]), "results", "k1", "checksum"),
    ],
)
def test_bad_values_do_not_open(value: bytes, namespace: str, key: str, reason: str) -> None:
    with pytest.raises(CorruptValue) as info:
        unseal(namespace, key, value)
    assert info.value.reason == reason


@pytest.mark.parametrize("namespace", ["", "has space", "tab\there", "caf\u00e9"])
def test_seal_refuses_namespaces_it_could_not_read_back(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        seal(namespace, "k", b"v")


def test_checked_store_drops_and_counts_a_bad_value() -> None:
    inner = MemoryStore()
    failures: list[tuple[str, str]] = []
    store = CheckedStore(
        inner, on_decode_failure=lambda kind, reason: failures.append((kind, reason))
    )
    store.put("measurements:gtx-760", "m1", b"ok")
    inner.put("measurements:gtx-760", "m2", b"written by something else")
    assert store.get("measurements:gtx-760", "m1") == b"ok"
    assert store.get("measurements:gtx-760", "m2") is None
    assert failures == [("measurements", "not-an-envelope")]
    assert inner.get("measurements:gtx-760", "m2") is None, "the bad value was deleted"
    assert store.keys("measurements:gtx-760") == ["m1"]
    # put_if_absent seals too
    assert store.put_if_absent("locks", "l", b"me", ttl_s=5)
    assert store.get("locks", "l") == b"me"


# ------------------------------------------------- bad values behind the service's back


def _sqlite_raw_put(path: Path, namespace: str, key: str, value: bytes) -> None:
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT OR REPLACE INTO store_entries (namespace, key, value) VALUES (?, ?, ?)",
        (namespace, key, value),
    )
    conn.commit()
    conn.close()


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, object]]:
    """(store URL, raw writer) for a real backend."""
    if request.param == "sqlite":
        path = tmp_path / "store.sqlite3"
        yield f"sqlite://{path}", lambda ns, key, value: _sqlite_raw_put(path, ns, key, value)
    else:
        url = request.getfixturevalue("redis_url")
        raw = RedisStore(url)  # the backend alone: writes bytes as given, no envelope
        yield url, raw.put
        raw.close()


def test_corrupt_or_foreign_values_in_a_real_backend_are_dropped_not_served(
    backend: tuple[str, object],
) -> None:
    url, raw_put = backend
    failures: list[tuple[str, str]] = []
    store: Store = make_store(url, on_decode_failure=lambda k, r: failures.append((k, r)))
    try:
        store.put("results", "good", b"{}")  # creates the table / proves the server is up
        raw_put("results", "foreign", b'{"predicted_cycles": 1}')  # type: ignore[operator]
        raw_put("results", "flipped", GOOD[:-1] + b"X")  # type: ignore[operator]
        raw_put("results", "moved", GOOD)  # type: ignore[operator]  # sealed for key k1
        assert store.get("results", "foreign") is None
        assert store.get("results", "flipped") is None
        assert store.get("results", "moved") is None
        assert store.get("results", "good") == b"{}"
        assert sorted(failures) == [
            ("results", "checksum"),
            ("results", "checksum"),
            ("results", "not-an-envelope"),
        ]
        assert store.keys("results") == ["good"], "dropped values are deleted"
    finally:
        store.close()


def test_redis_keys_of_one_namespace_never_list_another(redis_url: str) -> None:
    store = RedisStore(redis_url)
    try:
        store.put("measurements", "a", b"1")
        store.put("measurements:gtx", "b", b"2")
        store.put("measurements:gtx:x", "c", b"3")
        assert store.keys("measurements") == ["a"]
        assert store.keys("measurements:gtx") == ["b"]
        # glob characters in a namespace are literal
        store.put("m*", "d", b"4")
        assert store.keys("m*") == ["d"]
        raw = redis.Redis.from_url(redis_url)
        assert raw.get("kperf:12:measurements:a") == b"1"
        raw.close()
    finally:
        store.close()


def test_a_buffer_is_a_read_only_view_of_the_payload_and_get_a_copy() -> None:
    payload = bytes(range(256)) * 4096
    store = CheckedStore(MemoryStore())
    store.put("results", "k", payload)
    view = store.get_buffer("results", "k")
    assert isinstance(view, memoryview) and view.readonly and view == payload
    copied = store.get("results", "k")
    assert type(copied) is bytes and copied == payload


def test_a_large_value_corrupted_in_sqlite_is_dropped(tmp_path: Path) -> None:
    # read through blob I/O (above 1 MiB): the checksum still covers every byte
    store = make_store(f"sqlite://{tmp_path / 'store.sqlite3'}")
    payload = bytes(range(256)) * 8192
    store.put("results", "big", payload)
    with sqlite3.connect(tmp_path / "store.sqlite3") as db:
        (value,) = db.execute("SELECT value FROM store_entries WHERE key = 'big'").fetchone()
        flipped = value[:-10] + bytes([value[-10] ^ 1]) + value[-9:]
        db.execute("UPDATE store_entries SET value = ? WHERE key = 'big'", (flipped,))
    assert store.get_buffer("results", "big") is None
    assert store.get("results", "big") is None  # and it is gone, not read again
    store.close()
