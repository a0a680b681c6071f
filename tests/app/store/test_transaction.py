"""Store.transact on every backend: all or nothing, counters that match what is stored, caps
that hold under concurrent writers (the race that broke the caps: 8 writers of 50 against a cap of
100). The oracle is the store's own listing: a counter must equal what ``keys``/``get`` find."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from app.store import CapExceeded, CheckedStore, Counter, Delete, Expect, Put, Store, Unmet
from tests.app.redis_helpers import redis_server
from tests.app.store.test_contract import store

__all__ = ["redis_server", "store"]

RUNS = Counter("runs:dev", "count", ("runs:dev",), cap=100)
BYTES = Counter("bytes:t", "bytes", ("runs:dev", "profiles"))


def test_counts_new_puts_only_and_deletes_subtract(store: Store) -> None:
    out = store.transact(
        [Put("runs:dev", f"r{i}", b"x" * 10, if_absent=True) for i in range(5)], counters=[RUNS]
    )
    assert out.totals["runs:dev"] == 5 == len(store.keys("runs:dev"))
    again = store.transact(
        [Put("runs:dev", f"r{i}", b"y" * 10, if_absent=True) for i in range(3, 8)], counters=[RUNS]
    )
    assert again.totals["runs:dev"] == 8 == len(store.keys("runs:dev"))
    assert store.get("runs:dev", "r3") == b"x" * 10  # if_absent kept the first
    assert again.written == {("runs:dev", f"r{i}") for i in (5, 6, 7)}
    gone = store.transact(
        deletes=[Delete("runs:dev", "r0"), Delete("runs:dev", "nope")], counters=[RUNS]
    )
    assert gone.totals["runs:dev"] == 7 == len(store.keys("runs:dev")) == store.counter("runs:dev")


def test_cap_refuses_whole_step_and_reports_true_total(store: Store) -> None:
    store.transact([Put("runs:dev", f"a{i}", b"1") for i in range(90)], counters=[RUNS])
    with pytest.raises(CapExceeded) as info:
        store.transact(
            [Put("runs:dev", f"b{i}", b"1") for i in range(20)] + [Put("profiles", "p", b"2")],
            counters=[RUNS],
        )
    assert (info.value.total, info.value.adding, info.value.cap) == (90, 20, 100)
    assert store.get("profiles", "p") is None and len(store.keys("runs:dev")) == 90
    # a device over a lowered cap can still shrink
    low = Counter("runs:dev", "count", ("runs:dev",), cap=10)
    assert (
        store.transact(deletes=[Delete("runs:dev", "a0")], counters=[low]).totals["runs:dev"] == 89
    )


def test_bytes_counter_tracks_replacements(store: Store) -> None:
    store.transact([Put("profiles", "p", b"x" * 100)], counters=[BYTES])
    total = store.transact([Put("profiles", "p", b"x" * 40)], counters=[BYTES]).totals["bytes:t"]
    one = store.counter("bytes:t")
    assert total == one
    store.transact(deletes=[Delete("profiles", "p")], counters=[BYTES])
    assert store.counter("bytes:t") == 0 and store.get("profiles", "p") is None
    assert total < 100 + 100  # the replaced 100 bytes were subtracted


def test_concurrent_writers_never_pass_the_cap(store: Store) -> None:
    outcomes: list[object] = []

    def post(writer: int) -> None:
        puts = [Put("runs:dev", f"w{writer}.{i}", b"run") for i in range(50)]
        try:
            outcomes.append(store.transact(puts, counters=[RUNS]).totals["runs:dev"])
        except CapExceeded as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=post, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    accepted = sorted(o for o in outcomes if isinstance(o, int))
    assert accepted == [50, 100]  # the true totals, in order
    refused = [o for o in outcomes if isinstance(o, CapExceeded)]
    assert len(refused) == 6 and all(r.total == 100 for r in refused)
    assert len(store.keys("runs:dev")) == 100 == store.counter("runs:dev")


def test_a_counter_of_nothing_leaves_no_key(store: Store) -> None:
    store.transact([Put("runs:dev", "r", b"1")], counters=[RUNS])
    assert store.keys("counters") == ["runs:dev"]
    store.transact(deletes=[Delete("runs:dev", "r")], counters=[RUNS])
    assert store.keys("counters") == [] and store.counter("runs:dev") == 0


def test_get_many_answers_in_order_with_misses(store: Store) -> None:
    keys = [f"k{i:04d}" for i in range(1203)]  # more than one Redis MGET
    store.transact([Put("runs:dev", k, k.encode()) for k in keys[::2]])
    assert store.get_many("runs:dev", keys) == [
        k.encode() if i % 2 == 0 else None for i, k in enumerate(keys)
    ]


@pytest.mark.parametrize("checked", [False, True], ids=["raw", "checked"])
def test_expectations_hold_or_nothing_is_written(store: Store, checked: bool) -> None:
    """A step planned on a state (a key present, a value, a counter's total) applies only
    while that state holds; the CheckedStore's sealed values compare as their payloads."""
    store = CheckedStore(store) if checked else store
    store.transact([Put("profiles", "p", b"v1")])
    with pytest.raises(Unmet):
        store.transact(
            [Put("runs:dev", "r", b"1")], counters=[RUNS], expects=[Expect("profiles", "q")]
        )
    assert store.keys("runs:dev") == [] and store.counter("runs:dev") == 0
    store.transact([Put("runs:dev", "r", b"1")], counters=[RUNS], expects=[Expect("profiles", "p")])
    with pytest.raises(Unmet):
        store.transact(deletes=[Delete("profiles", "p")], expects=[Expect("profiles", "p", b"v2")])
    with pytest.raises(Unmet):
        store.transact(
            deletes=[Delete("runs:dev", "r"), Delete("profiles", "p")],
            counters=[dataclasses.replace(RUNS, expect=2)],
        )
    assert store.get("profiles", "p") == b"v1" and store.keys("runs:dev") == ["r"]
    store.transact(
        deletes=[Delete("runs:dev", "r"), Delete("profiles", "p")],
        counters=[dataclasses.replace(RUNS, expect=1)],
        expects=[Expect("profiles", "p", b"v1")],
    )
    assert store.get("profiles", "p") is None and store.counter("runs:dev") == 0
