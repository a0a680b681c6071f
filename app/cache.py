"""Result cache: an in-process LRU in front of a persistent SQLite file.

Keys are SHA-256 digests of a canonical JSON document: the request after validation (defaults
filled, field order irrelevant), the resolved device profile's content digest, and the model
version. Values are JSON documents (never pickles: a cache file must not be able to run code).

The persistent layer is best-effort by design: a corrupt, unreadable or unwritable file is
logged, counted and bypassed; the service keeps answering from the solver.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("kperf.cache")

#: bump when the stored value format changes, so old entries are never misread
CACHE_FORMAT_VERSION = 1


def canonical_json(document: Any) -> str:
    """Key-order-independent, whitespace-free JSON (floats keep their repr)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cache_key(kind: str, request: Mapping[str, Any], versions: Mapping[str, str]) -> str:
    """Digest of what determines an answer: job kind, canonical request and versions."""
    document = {
        "format": CACHE_FORMAT_VERSION,
        "kind": kind,
        "request": request,
        "versions": versions,
    }
    return hashlib.sha256(canonical_json(document).encode("ascii")).hexdigest()


class CacheBackend(abc.ABC):
    @abc.abstractmethod
    def get(self, key: str) -> str | None:
        """The stored JSON text for ``key``, or None when absent (or unavailable)."""

    @abc.abstractmethod
    def put(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``; failures are swallowed by the implementation."""


class MemoryLRU(CacheBackend):
    """At most ``capacity`` entries; the least recently used is evicted first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be 0 (disabled) or more")
        self.capacity = capacity
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str) -> str | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: str, value: str) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)


class SqliteStore(CacheBackend):
    """One table in one SQLite file; any database error disables the store (logged once)."""

    def __init__(self, path: Path, on_error: Callable[[str], None] | None = None) -> None:
        self.path = path
        self._on_error = on_error
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.disabled_reason: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=1.0, check_same_thread=False)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS results "
                "(key TEXT PRIMARY KEY, value TEXT NOT NULL, created_unix_s REAL NOT NULL)"
            )
            # reading a row proves the file is a database, not just that it exists
            conn.execute("SELECT key FROM results LIMIT 1").fetchall()
            conn.commit()
            self._conn = conn
        except (sqlite3.Error, OSError) as exc:
            self._disable("open", exc)

    @property
    def available(self) -> bool:
        return self._conn is not None

    def _disable(self, operation: str, exc: BaseException) -> None:
        self.disabled_reason = f"{type(exc).__name__}: {exc}"
        log.error(
            "persistent cache bypassed",
            extra={"cache_path": str(self.path), "operation": operation, "error": repr(exc)},
        )
        if self._on_error is not None:
            self._on_error(operation)
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None

    def get(self, key: str) -> str | None:
        with self._lock:
            if self._conn is None:
                return None
            try:
                row = self._conn.execute(
                    "SELECT value FROM results WHERE key = ?", (key,)
                ).fetchone()
            except sqlite3.Error as exc:
                self._disable("get", exc)
                return None
        return None if row is None else str(row[0])

    def put(self, key: str, value: str) -> None:
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.execute(
                    "INSERT OR REPLACE INTO results (key, value, created_unix_s) VALUES (?, ?, ?)",
                    (key, value, time.time()),
                )
                self._conn.commit()
            except sqlite3.Error as exc:
                self._disable("put", exc)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class ResultCache:
    """LRU first, then the persistent store (a persistent hit is promoted into the LRU)."""

    def __init__(
        self,
        memory_items: int,
        path: Path | None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.memory = MemoryLRU(memory_items)
        self.path = path
        self._on_error = on_error
        self._store: SqliteStore | None = None
        self._open_lock = threading.Lock()

    @property
    def store(self) -> SqliteStore | None:
        """The persistent layer, opened on first use (an app that never serves never opens it)."""
        if self.path is None:
            return None
        with self._open_lock:
            if self._store is None:
                self._store = SqliteStore(self.path, self._on_error)
            return self._store

    def status(self) -> tuple[str, str | None]:
        """The persistent layer for /readyz: ``off``, ``ok`` or ``bypassed`` (and why)."""
        store = self.store
        if store is None:
            return "off", None
        return ("ok", None) if store.available else ("bypassed", store.disabled_reason)

    def get(self, key: str) -> dict[str, Any] | None:
        text = self.memory.get(key)
        if text is None and self.store is not None:
            text = self.store.get(key)
            if text is not None:
                self.memory.put(key, text)
        if text is None:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            log.error("cache entry is not JSON; ignored", extra={"key": key})
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        text = canonical_json(value)
        self.memory.put(key, text)
        if self.store is not None:
            self.store.put(key, text)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
