"""The store contract and its in-process backend.

Namespaces keep the kinds of value apart (``results``, ``profiles``, ``measurements:<device>``)
so a backend can list one kind without scanning the others. Keys and namespaces are short ASCII
strings without whitespace; values are bytes.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.store.transaction import (
    COUNTERS,
    Counter,
    Delete,
    Expect,
    Outcome,
    Parts,
    Put,
    Transaction,
    plan,
)


class StoreUnavailable(RuntimeError):
    """The backend cannot be reached or refused the operation; callers degrade, never 5xx
    for a read they can answer without it."""


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs (``redis://:***@host:6379/0``)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if not sep or not at:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{slash}{path}"


def check_ttl_s(ttl_s: float | None) -> float | None:
    """``ttl_s`` unchanged when None (no expiry) or positive; every backend refuses the rest."""
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    return ttl_s


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What /readyz reports of the store: its backend and whether the last attempt worked."""

    backend: str
    ok: bool
    #: the last error while degraded (``ConnectionError: ...``), else None
    reason: str | None = None


class Store(abc.ABC):
    """Namespaced byte values, optionally expiring. Every method may raise StoreUnavailable."""

    #: backend name for /readyz and metrics (``memory``, ``sqlite``, ``redis``)
    name: str = "abstract"

    @abc.abstractmethod
    def get(self, namespace: str, key: str) -> bytes | None:
        """The value stored under ``key``, or None when absent or expired."""

    def get_buffer(self, namespace: str, key: str) -> bytes | bytearray | memoryview | None:
        """As :meth:`get`, but without copying a large value out of whatever holds it: a
        backend may answer the buffer it read into (Redis: a bytearray), a wrapper a
        read-only view (``CheckedStore``: the payload inside its envelope). A 36 MB answer is
        then held once, not twice. For callers that only send or hash it."""
        return self.get(namespace, key)

    def get_many(self, namespace: str, keys: Sequence[str]) -> list[bytes | None]:
        """:meth:`get` of each key, in order; a network backend answers them in few round
        trips (a device's record is thousands of runs, one key each)."""
        return [self.get(namespace, key) for key in keys]

    @abc.abstractmethod
    def put(self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        """Store ``value`` (replacing any), expiring after ``ttl_s`` seconds when given."""

    def put_parts(
        self, namespace: str, key: str, parts: Parts, *, ttl_s: float | None = None
    ) -> None:
        """:meth:`put` of the parts' concatenation; a backend that can write them one after
        the other (SQLite's blob I/O) never joins them: an envelope around a 36 MB answer is
        then not a second copy of it."""
        self.put(namespace, key, b"".join(parts), ttl_s=ttl_s)

    @abc.abstractmethod
    def put_if_absent(
        self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None
    ) -> bool:
        """Store only when no live value exists; True when this call stored it (a lock)."""

    @abc.abstractmethod
    def delete(self, namespace: str, key: str) -> None:
        """Remove ``key``; absent keys are not an error."""

    def delete_if_equals(self, namespace: str, key: str, value: bytes) -> bool:
        """Atomically remove ``key`` only while it holds ``value`` (a lock released by its
        holder, never by someone who took it after it expired); True when removed."""
        raise NotImplementedError(f"the {self.name} store has no compare-and-delete")

    def expire_if_equals(self, namespace: str, key: str, value: bytes, *, ttl_s: float) -> bool:
        """Atomically make ``key`` expire ``ttl_s`` seconds from now only while it holds
        ``value`` (a lock's holder renewing it); True when renewed."""
        raise NotImplementedError(f"the {self.name} store has no compare-and-expire")

    @abc.abstractmethod
    def keys(self, namespace: str) -> list[str]:
        """Every live key of ``namespace``, sorted."""

    def transact(
        self,
        puts: Sequence[Put] = (),
        deletes: Sequence[Delete] = (),
        counters: Sequence[Counter] = (),
        expects: Sequence[Expect] = (),
    ) -> Outcome:
        """Apply ``puts`` then ``deletes`` and update ``counters``, all or nothing, in one
        atomic step of the backend (see ``app/store/transaction.py``); CapExceeded, and
        nothing written, when a counter would pass its cap; Unmet, and nothing written, when
        one of ``expects`` (or a counter's ``expect``) does not hold."""
        return self.commit(Transaction(puts, deletes, counters, expects))

    def commit(self, txn: Transaction) -> Outcome:
        """:meth:`transact` of one :class:`Transaction`: what a backend or wrapper implements."""
        raise NotImplementedError(f"the {self.name} store has no transactions")

    def counter(self, key: str) -> int:
        """A counter kept by :meth:`transact` (0 when it never counted anything)."""
        raise NotImplementedError(f"the {self.name} store has no counters")

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections and files."""

    def ping(self) -> None:  # noqa: B027 - an in-process store is always reachable
        """A cheap round trip; raises StoreUnavailable when the backend cannot be reached."""

    def health(self) -> StoreHealth:
        """The backend's state as last observed (wrappers that watch errors override it)."""
        return StoreHealth(backend=self.name, ok=True)


class MemoryStore(Store):
    """This process only: the embedded default, nothing to start, gone on restart."""

    name = "memory"

    def __init__(self) -> None:
        self._data: dict[tuple[str, str], tuple[bytes, float | None]] = {}
        self._lock = threading.Lock()

    def _live(self, slot: tuple[str, str], now: float) -> bytes | None:
        entry = self._data.get(slot)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at is not None and expires_at <= now:
            del self._data[slot]
            return None
        return value

    @staticmethod
    def _expiry(ttl_s: float | None) -> float | None:
        ttl_s = check_ttl_s(ttl_s)
        return None if ttl_s is None else time.monotonic() + ttl_s

    def get(self, namespace: str, key: str) -> bytes | None:
        with self._lock:
            return self._live((namespace, key), time.monotonic())

    def put(self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        expires_at = self._expiry(ttl_s)
        with self._lock:
            self._data[(namespace, key)] = (bytes(value), expires_at)

    def put_if_absent(
        self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None
    ) -> bool:
        expires_at = self._expiry(ttl_s)
        with self._lock:
            if self._live((namespace, key), time.monotonic()) is not None:
                return False
            self._data[(namespace, key)] = (bytes(value), expires_at)
            return True

    def delete(self, namespace: str, key: str) -> None:
        with self._lock:
            self._data.pop((namespace, key), None)

    def delete_if_equals(self, namespace: str, key: str, value: bytes) -> bool:
        with self._lock:
            if self._live((namespace, key), time.monotonic()) != value:
                return False
            del self._data[(namespace, key)]
            return True

    def expire_if_equals(self, namespace: str, key: str, value: bytes, *, ttl_s: float) -> bool:
        expires_at = self._expiry(ttl_s)
        with self._lock:
            if self._live((namespace, key), time.monotonic()) != value:
                return False
            self._data[(namespace, key)] = (bytes(value), expires_at)
            return True

    def keys(self, namespace: str) -> list[str]:
        now = time.monotonic()
        with self._lock:
            slots = [s for s in self._data if s[0] == namespace]
            return sorted(s[1] for s in slots if self._live(s, now) is not None)

    def commit(self, txn: Transaction) -> Outcome:
        now = time.monotonic()
        with self._lock:
            existing = {}
            for slot in txn.written_slots:
                value = self._live(slot, now)
                existing[slot] = None if value is None else len(value)
            found = {e.slot: self._live(e.slot, now) for e in txn.expects}
            current = {c.key: self._count(c.key, now) for c in txn.counters}
            totals, writing = plan(txn, current, existing, found)
            for put in writing:
                self._data[(put.namespace, put.key)] = (bytes(put.value), None)
            for d in txn.deletes:
                self._data.pop(d.slot, None)
            for key, total in totals.items():
                if total:
                    self._data[(COUNTERS, key)] = (str(total).encode(), None)
                else:  # a counter of nothing leaves no key behind
                    self._data.pop((COUNTERS, key), None)
            return Outcome(totals, frozenset(p.slot for p in writing))

    def _count(self, key: str, now: float) -> int:
        raw = self._live((COUNTERS, key), now)
        return 0 if raw is None else int(raw)

    def counter(self, key: str) -> int:
        with self._lock:
            return self._count(key, time.monotonic())
