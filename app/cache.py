"""Result cache: a bytes-bounded in-process LRU in front of the shared store.

Keys are SHA-256 digests of a canonical JSON document: the request after validation (defaults
filled, field order irrelevant), the resolved device profile's content digest, and the model
version. Values are the encoded response bodies, exactly the bytes sent to the client: a hit is
answered without validating or serialising anything.

The LRU holds at most ``max_bytes`` of bodies (and ``max_items`` entries); a body larger than
``max_entry_bytes`` is never held in memory, only in the shared store. The shared store
(``app/store``, namespace ``results``) is best-effort by design: when it is unavailable the
lookup is a miss and the write is skipped (the store counts and logs its errors); the service
keeps answering from the LRU and the solver. When the store is the in-process backend the LRU
alone is the cache (an unbounded second copy in the same memory would defeat the bound).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from app.store import Store, StoreUnavailable

#: bump when the stored value format changes, so old entries are never misread
CACHE_FORMAT_VERSION = 2
#: the store namespace of result-cache entries
RESULTS_NAMESPACE = "results"


def canonical_json(document: Any) -> str:
    """Key-order-independent, whitespace-free JSON (floats keep their repr)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


#: strings longer than this (a PTX module) enter the key as their SHA-256 digest
LONG_STRING_CHARS = 1024


def _digest_long_strings(value: Any) -> Any:
    """``value`` with each long string replaced by ``{"$sha256": hex}``: a dict cannot stand
    where a validated request has a string, and hashing 2 MB of PTX once is ~5x cheaper than
    escaping it into canonical JSON (which holds the GIL throughout)."""
    if isinstance(value, str) and len(value) > LONG_STRING_CHARS:
        return {"$sha256": hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()}
    if isinstance(value, Mapping):
        return {k: _digest_long_strings(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_digest_long_strings(v) for v in value]
    return value


def cache_key(kind: str, request: Mapping[str, Any], versions: Mapping[str, str]) -> str:
    """Digest of what determines an answer: job kind, canonical request and versions."""
    document = {
        "format": CACHE_FORMAT_VERSION,
        "kind": kind,
        "request": _digest_long_strings(request),
        "versions": versions,
    }
    return hashlib.sha256(canonical_json(document).encode("ascii")).hexdigest()


class MemoryLRU:
    """Bodies by key, least recently used evicted first, bounded in bytes and in entries.

    ``size_bytes`` counts each body and key; a body above ``max_entry_bytes`` is refused (not
    held), so one huge answer cannot flush every small one. ``max_bytes = 0`` or
    ``max_items = 0`` disables the cache.
    """

    def __init__(self, max_bytes: int, max_entry_bytes: int, max_items: int = 1 << 30) -> None:
        if max_bytes < 0 or max_entry_bytes < 0 or max_items < 0:
            raise ValueError("max_bytes, max_entry_bytes and max_items must be 0 or more")
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        self.max_items = max_items
        self.size_bytes = 0
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    @staticmethod
    def _cost(key: str, body: bytes) -> int:
        return len(key) + len(body)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            body = self._data.get(key)
            if body is not None:
                self._data.move_to_end(key)
            return body

    def put(self, key: str, body: bytes) -> bool:
        """Hold ``body``; False when it is above the per-entry cap (or the cache is off)."""
        cost = self._cost(key, body)
        if self.max_items == 0 or cost > self.max_entry_bytes:
            return False
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.size_bytes -= self._cost(key, old)
            self._data[key] = body
            self.size_bytes += cost
            while self.size_bytes > self.max_bytes or len(self._data) > self.max_items:
                evicted_key, evicted = self._data.popitem(last=False)
                self.size_bytes -= self._cost(evicted_key, evicted)
        return True


class Body:
    """An answer's bytes as the cache hands them out (a read-only view when they came from the
    store inside its envelope: not copied out). While any Body of a key read from the store is
    alive (a response still sending it), lookups of that key share it."""

    __slots__ = ("data", "__weakref__")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data


class ResultCache:
    """LRU first, then the shared store (a store hit small enough is promoted into the LRU).

    Concurrent lookups of one key share one store read, and a body too large for the LRU is
    shared by every response still sending it (a weak reference: it is freed with the last
    one), so ten clients fetching one 36 MB answer hold it once, not ten times.
    """

    def __init__(
        self, memory: MemoryLRU, shared: Store | None, *, store_ttl_s: float | None = None
    ) -> None:
        self.memory = memory
        self.shared = shared
        #: entries expire from the shared store (None: never)
        self.store_ttl_s = store_ttl_s
        self._reading: dict[str, asyncio.Task[Body | None]] = {}
        self._sending: weakref.WeakValueDictionary[str, Body] = weakref.WeakValueDictionary()

    @classmethod
    def in_front_of(
        cls, memory: MemoryLRU, store: Store, *, store_ttl_s: float | None = None
    ) -> ResultCache:
        """The cache for ``store``: no second layer when the store is this process's memory."""
        return cls(memory, None if store.name == "memory" else store, store_ttl_s=store_ttl_s)

    async def get(self, key: str) -> Body | None:
        """The body stored under ``key``, or None (a miss, or the store unavailable)."""
        data = self.memory.get(key)
        if data is not None:
            return Body(data)
        body = self._sending.get(key)
        if body is not None or self.shared is None:
            return body
        reading = self._reading.get(key)
        if reading is None:
            reading = asyncio.create_task(self._read_shared(self.shared, key))
            self._reading[key] = reading
            reading.add_done_callback(lambda _: self._reading.pop(key, None))
        # shielded: a client that hangs up does not cancel the read the others wait for
        return await asyncio.shield(reading)

    async def _read_shared(self, store: Store, key: str) -> Body | None:
        try:
            data = await asyncio.to_thread(store.get_buffer, RESULTS_NAMESPACE, key)
        except StoreUnavailable:
            return None
        if data is None:
            return None
        body = Body(memoryview(data).toreadonly() if isinstance(data, bytearray) else data)
        # a small body is copied out of its envelope for the LRU (a view would pin the
        # envelope); a large one is never copied
        if len(data) > self.memory.max_entry_bytes or not self.memory.put(key, bytes(data)):
            # too large for the LRU: held only while some response still sends it
            self._sending[key] = body
        return body

    async def put(self, key: str, body: bytes) -> None:
        """Keep ``body`` in the LRU (when small enough) and in the shared store (best effort)."""
        self.memory.put(key, body)
        shared = self.shared
        if shared is None:
            return
        try:
            await asyncio.to_thread(
                lambda: shared.put(RESULTS_NAMESPACE, key, body, ttl_s=self.store_ttl_s)
            )
        except StoreUnavailable:
            pass
