"""Single-flight: identical concurrent cache misses are solved once, in this process and across
every replica sharing the store.

In this process, the first miss of a key starts a *flight* (a task); an identical request that
misses while it runs awaits it (``coalesced``) for at most its own time limit.

Across replicas (a shared store: SQLite or Redis), a flight first takes a lock in the store,
``put_if_absent(LOCKS, key, holder, ttl_s=lock_ttl_s)``:

* the **holder** reads the result once more (a replica may have finished between our miss and
  our lock), solves, stores the result, then releases its lock (``delete_if_equals``: never
  another holder's). While it solves it renews the lock every ``lock_ttl_s / 3``
  (``expire_if_equals``), so a long solve keeps it and a dead holder's lock expires within
  ``lock_ttl_s``. An answer that may not be cached (a solve that ran out of time) or a failed
  solve leaves a short-lived mark in ``NO_ANSWER`` before the lock goes;
* a **waiter** polls the lock (every 20 ms, doubling to 250 ms). Once the lock is gone it
  reads the result: there, it answers with it (``waited``); absent and marked, the holder had
  nothing cacheable and the waiter solves by itself (``uncacheable``: its own time limit may
  do better); absent and unmarked, the holder died: the waiter takes the lock and solves
  (``took_over``). A replica dying mid-solve so loses that one solve, nothing else;
* a waiter waits at most its own time limit, then solves by itself (``deadline``); whatever
  the store fails at, the flight solves without it (``no_store``): single-flight is an
  optimisation, never a reason to fail a request.

With the in-process store there is no lock: only identical requests of this process coalesce
(``local``). Outcomes are counted per flight (``coalesced`` per request) through ``on_outcome``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

from app.cache import ResultCache
from app.store import Store, StoreUnavailable

log = logging.getLogger("kperf.singleflight")

#: store namespaces: the locks, and the marks of flights that ended without a cacheable answer
LOCKS = "singleflight:lock"
NO_ANSWER = "singleflight:none"
#: waiters poll the lock this often at first, doubling up to the maximum
POLL_INITIAL_S = 0.02
POLL_MAX_S = 0.25
#: every outcome label of ``kperf_singleflight_total``
OUTCOMES = (
    "holder",
    "coalesced",
    "waited",
    "took_over",
    "uncacheable",
    "deadline",
    "no_store",
    "local",
)


class Solved(Protocol):
    """What a solve returns: the encoded body and whether it may be cached and shared."""

    @property
    def body(self) -> bytes: ...

    @property
    def cacheable(self) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class FlightAnswer:
    body: bytes | memoryview
    #: solved for this request (False: another request's solve, here or on another replica)
    computed: bool
    #: a complete answer, which identical requests may be given
    shareable: bool
    #: what must stay alive while the body is sent (the cache's shared copy of a large body)
    holder: object = None


class SingleFlight:
    def __init__(
        self,
        cache: ResultCache,
        *,
        lock_ttl_s: float = 5.0,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        if not lock_ttl_s > 0:
            raise ValueError(f"lock_ttl_s must be positive, got {lock_ttl_s}")
        self.cache = cache
        #: the shared store the locks live in; None: this process only (no lock)
        self.store: Store | None = cache.shared
        self.lock_ttl_s = lock_ttl_s
        self._on_outcome = on_outcome
        self._flights: dict[str, asyncio.Task[FlightAnswer]] = {}
        # names the holder in the lock: host, process, and a count per flight
        self._process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._serial = itertools.count(1)

    def _count(self, outcome: str) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    async def solve(
        self, key: str, compute: Callable[[], Awaitable[Solved]], *, wait_limit_s: float
    ) -> FlightAnswer:
        """The answer for ``key`` after a cache miss (``computed``: this request solved it).

        ``compute`` solves (in the worker pool); ``wait_limit_s`` bounds how long this request
        waits for someone else's solve before it solves by itself.
        """
        flight = self._flights.get(key)
        if flight is not None:
            self._count("coalesced")
            try:
                answer = await asyncio.wait_for(asyncio.shield(flight), wait_limit_s)
            except Exception:  # noqa: BLE001 - the other request's failure, timeout: solve
                answer = None
            if answer is not None and answer.shareable:
                return dataclasses.replace(answer, computed=False)
            # incomplete (its time limit may not be ours), failed, or too slow: solve alone
            return await self._solve_unlocked(key, compute)
        flight = asyncio.create_task(self._fly(key, compute, wait_limit_s))
        self._flights[key] = flight
        flight.add_done_callback(lambda done: self._landed(key, done))
        # shielded: a client that hangs up does not cancel the solve the others wait for
        return await asyncio.shield(flight)

    def _landed(self, key: str, flight: asyncio.Task[FlightAnswer]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved: the request that started it may have gone

    async def _solve_unlocked(
        self, key: str, compute: Callable[[], Awaitable[Solved]]
    ) -> FlightAnswer:
        answer = await compute()
        if answer.cacheable:
            await self.cache.put(key, answer.body)
        return FlightAnswer(answer.body, computed=True, shareable=answer.cacheable)

    async def _fly(
        self, key: str, compute: Callable[[], Awaitable[Solved]], wait_limit_s: float
    ) -> FlightAnswer:
        store = self.store
        if store is None:
            self._count("local")
            return await self._solve_unlocked(key, compute)
        deadline = time.monotonic() + wait_limit_s
        outcome = "holder"
        while True:
            holder = f"{self._process}:{next(self._serial)}".encode()
            try:
                locked = await asyncio.to_thread(
                    store.put_if_absent, LOCKS, key, holder, ttl_s=self.lock_ttl_s
                )
                if locked:
                    break
                waited = await self._wait_without_lock(store, key, deadline)
            except StoreUnavailable:
                # the store failed us (counted and logged by it): solve as if there were none
                self._count("no_store")
                return await self._solve_unlocked(key, compute)
            if isinstance(waited, FlightAnswer):
                return waited
            if waited != "took_over":
                self._count(waited)
                return await self._solve_unlocked(key, compute)
            outcome = waited  # the holder died: its lock expired with no answer; take it
        return await self._hold(store, key, holder, compute, outcome)

    async def _wait_without_lock(
        self, store: Store, key: str, deadline: float
    ) -> FlightAnswer | str:
        """Wait for the lock's holder: its answer, or what to do instead (an outcome)."""
        if not await self._wait_for_unlock(store, key, deadline):
            return "deadline"
        stored = await self.cache.get(key)
        if stored is not None:
            self._count("waited")
            return FlightAnswer(stored.data, computed=False, shareable=True, holder=stored)
        if await asyncio.to_thread(store.get, NO_ANSWER, key) is not None:
            return "uncacheable"
        return "took_over"

    async def _wait_for_unlock(self, store: Store, key: str, deadline: float) -> bool:
        """Poll until the lock is gone (True) or ``deadline`` passes (False)."""
        poll_s = POLL_INITIAL_S
        while True:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return False
            await asyncio.sleep(min(poll_s, left_s))
            poll_s = min(2 * poll_s, POLL_MAX_S)
            if await asyncio.to_thread(store.get, LOCKS, key) is None:
                return True

    async def _hold(
        self,
        store: Store,
        key: str,
        holder: bytes,
        compute: Callable[[], Awaitable[Solved]],
        outcome: str,
    ) -> FlightAnswer:
        """Holding the lock: solve (unless a replica just did), store, mark, release."""
        renewing = asyncio.create_task(self._renew(store, key, holder))
        try:
            stored = await self.cache.get(key)
            if stored is not None:
                self._count("waited")
                return FlightAnswer(stored.data, computed=False, shareable=True, holder=stored)
            self._count(outcome)
            try:
                answer = await compute()
            except Exception:
                await self._mark_no_answer(store, key)
                raise
            if answer.cacheable:
                await self.cache.put(key, answer.body)  # before the lock goes: waiters read it
            else:
                await self._mark_no_answer(store, key)
            return FlightAnswer(answer.body, computed=True, shareable=answer.cacheable)
        finally:
            renewing.cancel()
            with contextlib.suppress(StoreUnavailable):
                await asyncio.to_thread(store.delete_if_equals, LOCKS, key, holder)

    async def _renew(self, store: Store, key: str, holder: bytes) -> None:
        """The holder's heartbeat: keep the lock while solving; stop once it is lost."""
        while True:
            await asyncio.sleep(self.lock_ttl_s / 3)
            try:
                kept = await asyncio.to_thread(
                    store.expire_if_equals, LOCKS, key, holder, ttl_s=self.lock_ttl_s
                )
            except StoreUnavailable:
                continue  # it may come back before the lock expires
            if not kept:
                log.warning(
                    "single-flight lock lost while solving: another replica may solve too",
                    extra={"key": key},
                )
                return

    async def _mark_no_answer(self, store: Store, key: str) -> None:
        with contextlib.suppress(StoreUnavailable):
            await asyncio.to_thread(store.put, NO_ANSWER, key, b"1", ttl_s=self.lock_ttl_s)
