"""A circuit breaker around a store backend: a dead store is not hammered, and comes back alone.

After a failed call the breaker opens: for the next ``backoff_s`` (doubling per consecutive
failure, from ``backoff_initial_s`` up to ``backoff_max_s``) every call fails at once with
:class:`StoreUnavailable`, without touching the backend. Then one call is let through as a
probe (the others still fail fast); its success closes the breaker, its failure opens it
again for longer. Each backend failure is reported through ``on_error(operation)`` (the
store-errors metric); calls refused by the open breaker are not backend errors and are not
counted. The cap is short (2 s) because a probe costs little: one request waits at most about
two socket timeouts, and a store that is back is used again within the cap.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from app.store.base import Store, StoreHealth, StoreUnavailable
from app.store.transaction import Outcome, Parts, Transaction

log = logging.getLogger("kperf.store")

R = TypeVar("R")


#: a host:port, IPv4/IPv6 address or URL in a backend's error text (redis-py: "Error 111
#: connecting to redis:6379. Connection refused.")
_ADDRESS = re.compile(
    r"[a-z][a-z0-9+.-]*://\S+"  # a URL
    r"|\[[0-9a-f:]+\](?::\d+)?"  # [IPv6]:port
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"  # IPv4[:port]
    r"|\b[\w.-]+:\d{1,5}\b",  # host:port
    re.IGNORECASE,
)


def without_address(text: str) -> str:
    """``text`` with every network address replaced by ``<store address>``: a client learns
    that the store failed and why, never where it lives (logs keep the full text)."""
    return _ADDRESS.sub("<store address>", text)


class ResilientStore(Store):
    def __init__(
        self,
        backend: Store,
        *,
        on_error: Callable[[str], None] | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError(
                "need 0 < backoff_initial_s <= backoff_max_s, got "
                f"{backoff_initial_s} and {backoff_max_s}"
            )
        self.backend = backend
        self.name = backend.name
        self._on_error = on_error
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._probing = False
        self._last_error: str | None = None

    def _admit(self) -> bool:
        """Whether the backend may be called now; True when this call is the probe."""
        with self._lock:
            if self._failures == 0:
                return False
            now = self._clock()
            if now < self._retry_at or self._probing:
                wait_s = max(0.0, self._retry_at - now)
                raise StoreUnavailable(
                    f"{self.name} store unavailable ({self._last_error}); "
                    f"next attempt in {wait_s:.1f} s"
                )
            self._probing = True
            return True

    def _call(self, operation: str, fn: Callable[[], R]) -> R:
        probe = self._admit()
        try:
            result = fn()
        except StoreUnavailable as exc:
            self._failed(operation, exc)
            raise
        except BaseException:
            if probe:
                with self._lock:
                    self._probing = False
            raise
        if probe or self._failures:
            self._recovered()
        return result

    def _failed(self, operation: str, exc: StoreUnavailable) -> None:
        with self._lock:
            first = self._failures == 0
            self._failures += 1
            backoff_s = min(
                self._backoff_max_s, self._backoff_initial_s * 2 ** min(self._failures - 1, 30)
            )
            self._retry_at = self._clock() + backoff_s
            self._probing = False
            # what clients may read (/readyz, problem details): without the store's address
            self._last_error = without_address(str(exc))
        if self._on_error is not None:
            self._on_error(operation)
        (log.error if first else log.debug)(
            "store unavailable; answering without it",
            extra={
                "store": self.name,
                "operation": operation,
                "error": str(exc),
                "retry_in_s": backoff_s,
            },
        )

    def _recovered(self) -> None:
        with self._lock:
            was_down = self._failures > 0
            self._failures = 0
            self._probing = False
            self._last_error = None
        if was_down:
            log.warning("store reachable again", extra={"store": self.name})

    def get(self, namespace: str, key: str) -> bytes | None:
        return self._call("get", lambda: self.backend.get(namespace, key))

    def get_buffer(self, namespace: str, key: str) -> bytes | bytearray | memoryview | None:
        return self._call("get", lambda: self.backend.get_buffer(namespace, key))

    def get_many(self, namespace: str, keys: Sequence[str]) -> list[bytes | None]:
        return self._call("get", lambda: self.backend.get_many(namespace, keys))

    def put(self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        self._call("put", lambda: self.backend.put(namespace, key, value, ttl_s=ttl_s))

    def put_parts(
        self, namespace: str, key: str, parts: Parts, *, ttl_s: float | None = None
    ) -> None:
        self._call("put", lambda: self.backend.put_parts(namespace, key, parts, ttl_s=ttl_s))

    def put_if_absent(
        self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None
    ) -> bool:
        return self._call(
            "put_if_absent", lambda: self.backend.put_if_absent(namespace, key, value, ttl_s=ttl_s)
        )

    def delete(self, namespace: str, key: str) -> None:
        self._call("delete", lambda: self.backend.delete(namespace, key))

    def delete_if_equals(self, namespace: str, key: str, value: bytes) -> bool:
        return self._call(
            "delete_if_equals", lambda: self.backend.delete_if_equals(namespace, key, value)
        )

    def expire_if_equals(self, namespace: str, key: str, value: bytes, *, ttl_s: float) -> bool:
        return self._call(
            "expire_if_equals",
            lambda: self.backend.expire_if_equals(namespace, key, value, ttl_s=ttl_s),
        )

    def commit(self, txn: Transaction) -> Outcome:
        return self._call("transact", lambda: self.backend.commit(txn))

    def counter(self, key: str) -> int:
        return self._call("get", lambda: self.backend.counter(key))

    def keys(self, namespace: str) -> list[str]:
        return self._call("keys", lambda: self.backend.keys(namespace))

    def ping(self) -> None:
        self._call("ping", self.backend.ping)

    def close(self) -> None:
        self.backend.close()

    def health(self) -> StoreHealth:
        with self._lock:
            if self._failures == 0:
                return StoreHealth(backend=self.name, ok=True)
            return StoreHealth(backend=self.name, ok=False, reason=self._last_error)
