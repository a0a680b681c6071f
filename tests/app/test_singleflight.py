"""Single-flight (app/singleflight.py) on a store shared by two in-process "replicas" (each its
own SingleFlight and LRU, one MemoryStore between them), with a counting fake solve: identical
misses solve once; a dead holder's lock expires and a waiter takes over; a long solve keeps its
lock; incomplete or failed answers, a dead store and a waiter's own deadline never block.
The real thing, two `kperf serve` processes on a real Redis: tests/app/test_shared_store.py."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from app.cache import MemoryLRU, ResultCache
from app.singleflight import LOCKS, FlightAnswer, SingleFlight
from app.store import MemoryStore, ResilientStore, Store, StoreUnavailable, make_store

KEY = "k" * 64


@dataclass(frozen=True)
class Answer:
    body: bytes
    cacheable: bool = True


class Replica:
    """One service's view: its own LRU and flights, the store shared with the others."""

    def __init__(self, store: Store | None, *, lock_ttl_s: float = 2.0) -> None:
        self.outcomes: Counter[str] = Counter()
        cache = ResultCache(MemoryLRU(1 << 20, 1 << 20), store)
        self.flights = SingleFlight(
            cache, lock_ttl_s=lock_ttl_s, on_outcome=lambda outcome: self.outcomes.update([outcome])
        )


class Solver:
    """The fake solve: counts its calls, takes ``seconds``, may fail or be incomplete."""

    def __init__(self, seconds: float = 0.3, *, cacheable: bool = True, fail: bool = False):
        self.seconds, self.cacheable, self.fail = seconds, cacheable, fail
        self.calls = 0

    async def __call__(self) -> Answer:
        self.calls += 1
        await asyncio.sleep(self.seconds)
        if self.fail:
            raise ValueError("the solve failed")
        return Answer(b'{"best": 1}', self.cacheable)


async def _ask(
    replica: Replica, solver: Solver, wait_limit_s: float = 10.0, delay_s: float = 0.0
) -> FlightAnswer:
    await asyncio.sleep(delay_s)
    return await replica.flights.solve(KEY, solver, wait_limit_s=wait_limit_s)


def _shared() -> Store:
    return make_store("memory://")  # breaker + envelope, as the service holds a store


def test_identical_misses_in_one_process_solve_once() -> None:
    a, solver = Replica(_shared()), Solver()

    async def scenario() -> list[FlightAnswer]:
        return await asyncio.gather(*(_ask(a, solver) for _ in range(8)))

    answers = asyncio.run(scenario())
    assert solver.calls == 1
    assert [x.computed for x in answers].count(True) == 1, "one request solved, 7 were given it"
    assert {x.body for x in answers} == {b'{"best": 1}'}
    assert a.outcomes == {"holder": 1, "coalesced": 7}
    assert a.flights.store is not None and a.flights.store.get(LOCKS, KEY) is None, "released"


def test_identical_misses_on_two_replicas_solve_once() -> None:
    store = _shared()
    a, b, solver = Replica(store), Replica(store), Solver()

    async def scenario() -> list[FlightAnswer]:
        return await asyncio.gather(
            *(_ask(r, solver, delay_s=0.01 * i) for i in range(4) for r in (a, b))
        )

    answers = asyncio.run(scenario())
    assert solver.calls == 1
    assert [x.computed for x in answers].count(True) == 1
    assert a.outcomes + b.outcomes == {"holder": 1, "waited": 1, "coalesced": 6}


def test_a_dead_holders_lock_expires_and_a_waiter_takes_over() -> None:
    store = _shared()
    # what a replica killed mid-solve leaves: its lock, soon expiring, and no answer
    assert store.put_if_absent(LOCKS, KEY, b"dead-replica:1", ttl_s=0.5)
    b, solver = Replica(store), Solver(0.05)
    started = time.monotonic()
    answer = asyncio.run(_ask(b, solver))
    assert answer.computed and solver.calls == 1
    assert 0.45 <= time.monotonic() - started < 3.0
    assert b.outcomes == {"took_over": 1}


def test_a_long_solve_keeps_its_lock() -> None:
    store = _shared()
    a, b, solver = Replica(store, lock_ttl_s=0.6), Replica(store, lock_ttl_s=0.6), Solver(1.8)

    async def scenario() -> list[FlightAnswer]:
        return await asyncio.gather(_ask(a, solver), _ask(b, solver, delay_s=0.1))

    answers = asyncio.run(scenario())
    # without the holder renewing its lock, it would expire at 0.6 s and B would solve too
    assert solver.calls == 1
    assert [x.computed for x in answers] == [True, False]
    assert (a.outcomes, b.outcomes) == ({"holder": 1}, {"waited": 1})


@pytest.mark.parametrize(
    "solver",
    [Solver(cacheable=False), Solver(fail=True)],
    ids=["incomplete-answer", "failed-solve"],
)
def test_without_a_cacheable_answer_every_waiter_solves_by_itself(solver: Solver) -> None:
    store = _shared()
    a, b = Replica(store), Replica(store)

    async def scenario() -> list[FlightAnswer | BaseException]:
        return await asyncio.gather(
            _ask(a, solver), _ask(a, solver, delay_s=0.05), _ask(b, solver, delay_s=0.05),
            return_exceptions=True,
        )  # fmt: skip

    started = time.monotonic()
    results = asyncio.run(scenario())
    # the holder's own request gets its answer (or error); the others do not wait for a lock
    # to expire, nor share an incomplete answer their time limit might improve
    assert solver.calls == 3
    assert time.monotonic() - started < 1.5
    if solver.fail:
        assert all(isinstance(r, ValueError) for r in results)
    else:
        assert all(isinstance(r, FlightAnswer) and r.computed for r in results)
    assert a.outcomes == {"holder": 1, "coalesced": 1}
    assert b.outcomes == {"uncacheable": 1}


class DeadStore(MemoryStore):
    name = "dead"

    def put_if_absent(self, *args: object, **kwargs: object) -> bool:
        raise StoreUnavailable("connection refused")

    def get(self, namespace: str, key: str) -> bytes | None:
        raise StoreUnavailable("connection refused")


def test_a_dead_store_means_solving_without_single_flight() -> None:
    a, solver = Replica(ResilientStore(DeadStore())), Solver(0.05)
    answer = asyncio.run(_ask(a, solver))
    assert answer.computed and solver.calls == 1
    assert a.outcomes == {"no_store": 1}


def test_waiters_wait_no_longer_than_their_own_limit() -> None:
    store = _shared()
    assert store.put_if_absent(LOCKS, KEY, b"slow-replica:1", ttl_s=30)  # a very slow holder
    b, solver = Replica(store), Solver(1.0)

    async def scenario() -> tuple[FlightAnswer, FlightAnswer]:
        # the first waits for the slow holder 0.3 s; the second, an identical request of
        # this process, waits for the first 0.2 s at most, then solves by itself
        first = asyncio.create_task(_ask(b, solver, wait_limit_s=0.3))
        second = await _ask(b, solver, wait_limit_s=0.2, delay_s=0.05)
        return await first, second

    started = time.monotonic()
    first, second = asyncio.run(scenario())
    assert first.computed and second.computed and solver.calls == 2
    assert time.monotonic() - started < 1.5 + 0.3
    assert b.outcomes == {"deadline": 1, "coalesced": 1}


def test_an_in_process_store_only_coalesces() -> None:
    a, solver = Replica(None), Solver()

    async def scenario() -> list[FlightAnswer]:
        return await asyncio.gather(*(_ask(a, solver) for _ in range(3)))

    asyncio.run(scenario())
    assert solver.calls == 1 and a.outcomes == {"local": 1, "coalesced": 2}
