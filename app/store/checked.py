"""The checked envelope every stored value travels in, and the wrapper that applies it.

A stored value is one ASCII header line, then the caller's payload, unchanged::

    kperf-store 1 <namespace> <sha256 hex>\\n<payload bytes>

``1`` is :data:`ENVELOPE_VERSION`; the SHA-256 covers the namespace, the key and the payload
(``namespace NUL key NUL payload``), so a value that was truncated, bit-flipped, written by
something else, or copied under another key or namespace fails to open. :class:`CheckedStore`
drops such a value (deletes it), reports it through ``on_decode_failure`` and answers None, as
if it were absent: a bad entry is never served and never a 500.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence

from app.store.base import Store, StoreHealth, StoreUnavailable
from app.store.transaction import Expect, Outcome, Put, Transaction

log = logging.getLogger("kperf.store")

#: bump when the envelope changes; a value of another version is dropped, never misread
ENVELOPE_VERSION = 1
MAGIC = b"kperf-store"
#: the header is short; a value without a newline this early is not ours
MAX_HEADER_BYTES = 512


class CorruptValue(ValueError):
    """A stored value that does not open: ``reason`` is one of ``REASONS``."""

    REASONS = ("not-an-envelope", "version", "namespace", "checksum")

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _digest(namespace: str, key: str, payload: bytes | memoryview) -> str:
    h = hashlib.sha256()
    h.update(namespace.encode("ascii") + b"\0" + key.encode("ascii") + b"\0")
    h.update(payload)  # no copy of a large payload: hashlib reads it in place
    return h.hexdigest()


def sealed_parts(namespace: str, key: str, payload: bytes) -> tuple[bytes, bytes]:
    """The envelope's header line and ``payload``: what :func:`seal` joins."""
    if any(c.isspace() for c in namespace) or not namespace.isascii() or not namespace:
        raise ValueError(f"namespace must be non-empty ASCII without whitespace, got {namespace!r}")
    header = b"%s %d %s %s\n" % (
        MAGIC,
        ENVELOPE_VERSION,
        namespace.encode("ascii"),
        _digest(namespace, key, payload).encode("ascii"),
    )
    return header, payload


def seal(namespace: str, key: str, payload: bytes) -> bytes:
    """``payload`` inside the envelope, bound to ``namespace`` and ``key``."""
    return b"".join(sealed_parts(namespace, key, payload))


def unseal_view(namespace: str, key: str, value: bytes | bytearray) -> memoryview:
    """The payload of a sealed ``value`` as a read-only view into it (no copy); raises
    :class:`CorruptValue` when it does not open."""
    end = value.find(b"\n", 0, MAX_HEADER_BYTES)
    if end < 0:
        raise CorruptValue("not-an-envelope", "no envelope header line")
    parts = value[:end].split(b" ")
    if len(parts) != 4 or parts[0] != MAGIC:
        raise CorruptValue("not-an-envelope", f"header {value[: min(end, 60)]!r}")
    if parts[1] != str(ENVELOPE_VERSION).encode():
        raise CorruptValue("version", f"envelope version {parts[1]!r}, expected {ENVELOPE_VERSION}")
    if parts[2] != namespace.encode("ascii"):
        raise CorruptValue("namespace", f"written for {parts[2]!r}, read from {namespace!r}")
    payload = memoryview(value).toreadonly()[end + 1 :]
    if parts[3] != _digest(namespace, key, payload).encode("ascii"):
        raise CorruptValue("checksum", "SHA-256 of namespace, key and payload does not match")
    return payload


def unseal(namespace: str, key: str, value: bytes) -> bytes:
    """The payload of a sealed ``value``, as bytes (a copy); see :func:`unseal_view`."""
    return bytes(unseal_view(namespace, key, value))


class CheckedStore(Store):
    """Seals what it stores, verifies what it reads; a value that fails is dropped and counted.

    ``on_decode_failure(namespace_kind, reason)`` is called once per dropped value, with the
    namespace's part before any ``:`` (``measurements:gtx-760`` -> ``measurements``) so metric
    labels stay few.
    """

    def __init__(
        self,
        inner: Store,
        on_decode_failure: Callable[[str, str], None] | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._on_decode_failure = on_decode_failure

    def get(self, namespace: str, key: str) -> bytes | None:
        payload = self.get_buffer(namespace, key)
        return None if payload is None else bytes(payload)

    def get_buffer(self, namespace: str, key: str) -> memoryview | None:
        value = self.inner.get_buffer(namespace, key)
        if value is None:
            return None
        if isinstance(value, memoryview):  # no backend answers one; unseal needs find()
            value = value.tobytes()
        try:
            return unseal_view(namespace, key, value)
        except CorruptValue as exc:
            self._drop(namespace, key, exc)
            return None

    def get_many(self, namespace: str, keys: Sequence[str]) -> list[bytes | None]:
        values: list[bytes | None] = []
        for key, value in zip(keys, self.inner.get_many(namespace, keys), strict=True):
            try:
                values.append(None if value is None else unseal(namespace, key, value))
            except CorruptValue as exc:
                self._drop(namespace, key, exc)
                values.append(None)
        return values

    def _drop(self, namespace: str, key: str, exc: CorruptValue) -> None:
        log.warning(
            "stored value dropped: it does not open",
            extra={"namespace": namespace, "key": key, "reason": str(exc)},
        )
        if self._on_decode_failure is not None:
            self._on_decode_failure(namespace.split(":", 1)[0], exc.reason)
        try:
            self.inner.delete(namespace, key)
        except StoreUnavailable:
            pass  # dropped on a later read; it is never served either way

    def put(self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        self.inner.put_parts(namespace, key, sealed_parts(namespace, key, value), ttl_s=ttl_s)

    def put_if_absent(
        self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None
    ) -> bool:
        return self.inner.put_if_absent(namespace, key, seal(namespace, key, value), ttl_s=ttl_s)

    def delete(self, namespace: str, key: str) -> None:
        self.inner.delete(namespace, key)

    def delete_if_equals(self, namespace: str, key: str, value: bytes) -> bool:
        # sealing is deterministic: the stored envelope of ``value`` is this one
        return self.inner.delete_if_equals(namespace, key, seal(namespace, key, value))

    def expire_if_equals(self, namespace: str, key: str, value: bytes, *, ttl_s: float) -> bool:
        return self.inner.expire_if_equals(namespace, key, seal(namespace, key, value), ttl_s=ttl_s)

    def commit(self, txn: Transaction) -> Outcome:
        # counters are the backend's own integers, never sealed; values are, like any put's
        sealed = [
            Put(p.namespace, p.key, seal(p.namespace, p.key, p.value), p.if_absent)
            for p in txn.puts
        ]
        # sealing is deterministic: an expected value's envelope is the stored one
        expected = [
            e if e.value is None else Expect(e.namespace, e.key, seal(e.namespace, e.key, e.value))
            for e in txn.expects
        ]
        return self.inner.commit(Transaction(sealed, txn.deletes, txn.counters, expected))

    def counter(self, key: str) -> int:
        return self.inner.counter(key)

    def keys(self, namespace: str) -> list[str]:
        return self.inner.keys(namespace)

    def close(self) -> None:
        self.inner.close()

    def ping(self) -> None:
        self.inner.ping()

    def health(self) -> StoreHealth:
        return self.inner.health()
