"""One node, durable: the store in a single SQLite file (``sqlite:///path/to/file``).

The file is opened on first use (building the app opens nothing). Any database error raises
:class:`StoreUnavailable` and closes the connection, so the next call (after the circuit
breaker's pause, see ``resilient.py``) opens the file again: a table dropped or a disk filled
by someone else is recovered from without a restart. A file that is not a database is left
untouched for inspection. Several processes may share one file: writes take SQLite's lock
(waiting at most ``busy_timeout_s``), and ``put_if_absent`` runs in one write transaction.
Expiry uses wall-clock time, which every process on the node shares.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from app.store.base import Store, StoreUnavailable, check_ttl_s
from app.store.transaction import COUNTERS, Outcome, Parts, Transaction, plan

R = TypeVar("R")

#: ``value`` is the last column: SQLite writes a zero-filled blob (``zeroblob``, then filled by
#: blob I/O) without building it in memory only when nothing follows it in the row; with the
#: expiry after it, each large write cost two 36 MB buffers inside SQLite
_COLUMNS = (
    "namespace TEXT NOT NULL, key TEXT NOT NULL, expires_unix_s REAL, value BLOB NOT NULL, "
    "PRIMARY KEY (namespace, key)"
)
_SCHEMA = f"CREATE TABLE IF NOT EXISTS store_entries ({_COLUMNS})"
_LIVE = "(expires_unix_s IS NULL OR expires_unix_s > ?)"
#: every this many puts, expired rows are deleted
PURGE_EVERY_PUTS = 100
#: values above this go through SQLite's incremental blob I/O: read straight into the one bytes
#: object handed back (a plain SELECT assembles the value in SQLite's memory first), written
#: part by part into a zero-filled blob (a bound parameter is copied into SQLite's memory)
BLOB_IO_ABOVE_BYTES = 1 << 20


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[None]:
    """``begin`` (``BEGIN IMMEDIATE``: take the write lock now), then COMMIT, or ROLLBACK on
    any exception."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _move_value_last(conn: sqlite3.Connection) -> None:
    """Rewrite a table of the first layout (``value`` before ``expires_unix_s``) into the
    current one, rows kept; once, by whichever process opens the file first."""

    def columns() -> list[str]:
        return [str(row[1]) for row in conn.execute("PRAGMA table_info(store_entries)")]

    if columns()[-1] == "value":
        return
    with _transaction(conn, "BEGIN IMMEDIATE"):
        if columns()[-1] == "value":  # another process migrated it while we waited
            return
        conn.execute(f"CREATE TABLE store_entries_migrating ({_COLUMNS})")
        conn.execute(
            "INSERT INTO store_entries_migrating (namespace, key, expires_unix_s, value) "
            "SELECT namespace, key, expires_unix_s, value FROM store_entries"
        )
        conn.execute("DROP TABLE store_entries")
        conn.execute("ALTER TABLE store_entries_migrating RENAME TO store_entries")


def _count(conn: sqlite3.Connection, key: str, now: float) -> int:
    row = conn.execute(
        f"SELECT value FROM store_entries WHERE namespace = ? AND key = ? AND {_LIVE}",
        (COUNTERS, key, now),
    ).fetchone()
    return 0 if row is None else int(bytes(row[0]))


def _expiry(ttl_s: float | None) -> float | None:
    ttl_s = check_ttl_s(ttl_s)
    return None if ttl_s is None else time.time() + ttl_s


class SqliteStore(Store):
    name = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_s: float = 1.0) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._puts = 0

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                check_same_thread=False,
                # autocommit; writes open their own transactions. Statements stay cached: a
                # cached one keeps its last bound parameters, but values above
                # BLOB_IO_ABOVE_BYTES are never bound (blob I/O), so that is at most 1 MiB
                isolation_level=None,
            )
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"open {self.path}: {type(exc).__name__}: {exc}") from exc
        try:
            conn.execute(_SCHEMA)
            _move_value_last(conn)
            # reading a row proves the file is a database, not just that it exists
            conn.execute("SELECT key FROM store_entries LIMIT 1").fetchall()
            # readers do not wait for a writer (several processes may share the file)
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailable(f"open {self.path}: {type(exc).__name__}: {exc}") from exc
        return conn

    def _run(self, fn: Callable[[sqlite3.Connection], R]) -> R:
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                conn, self._conn = self._conn, None
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
                raise StoreUnavailable(f"{self.path}: {type(exc).__name__}: {exc}") from exc

    def ping(self) -> None:
        self._run(lambda conn: conn.execute("SELECT 1").fetchall())

    def get(self, namespace: str, key: str) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            # one snapshot for the row and its blob: a writer replacing the row between the
            # two cannot make the blob handle point at nothing
            with _transaction(conn):
                row = conn.execute(
                    "SELECT rowid, CASE WHEN length(value) <= ? THEN value END "
                    f"FROM store_entries WHERE namespace = ? AND key = ? AND {_LIVE}",
                    (BLOB_IO_ABOVE_BYTES, namespace, key, time.time()),
                ).fetchone()
                if row is None:
                    return None
                rowid, small = row
                if small is not None:
                    return bytes(small)
                with conn.blobopen("store_entries", "value", rowid, readonly=True) as blob:
                    return blob.read()

        return self._run(read)

    def put(self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        self.put_parts(namespace, key, (value,), ttl_s=ttl_s)

    def put_parts(
        self, namespace: str, key: str, parts: Parts, *, ttl_s: float | None = None
    ) -> None:
        expires = _expiry(ttl_s)
        self._puts += 1
        purge = self._puts % PURGE_EVERY_PUTS == 0
        size = sum(len(part) for part in parts)
        insert = (
            "INSERT OR REPLACE INTO store_entries (namespace, key, value, expires_unix_s) "
            "VALUES (?, ?, {value}, ?)"
        )

        def write(conn: sqlite3.Connection) -> None:
            with _transaction(conn, "BEGIN IMMEDIATE"):
                if size <= BLOB_IO_ABOVE_BYTES:
                    conn.execute(
                        insert.format(value="?"), (namespace, key, b"".join(parts), expires)
                    )
                else:
                    cursor = conn.execute(
                        insert.format(value="zeroblob(?)"), (namespace, key, size, expires)
                    )
                    assert cursor.lastrowid is not None  # an INSERT sets it
                    with conn.blobopen("store_entries", "value", cursor.lastrowid) as blob:
                        for part in parts:
                            blob.write(part)
                if purge:  # expired rows are invisible; this gives their space back now and then
                    conn.execute(
                        "DELETE FROM store_entries WHERE expires_unix_s <= ?", (time.time(),)
                    )

        self._run(write)

    def put_if_absent(
        self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None
    ) -> bool:
        expires = _expiry(ttl_s)

        def insert(conn: sqlite3.Connection) -> bool:
            # the write lock: one process decides at a time
            with _transaction(conn, "BEGIN IMMEDIATE"):
                conn.execute(
                    "DELETE FROM store_entries WHERE namespace = ? AND key = ? "
                    "AND expires_unix_s IS NOT NULL AND expires_unix_s <= ?",
                    (namespace, key, time.time()),
                )
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO store_entries (namespace, key, value, expires_unix_s) "
                    "VALUES (?, ?, ?, ?)",
                    (namespace, key, value, expires),
                )
                return cursor.rowcount == 1

        return self._run(insert)

    def delete(self, namespace: str, key: str) -> None:
        self._run(
            lambda conn: conn.execute(
                "DELETE FROM store_entries WHERE namespace = ? AND key = ?", (namespace, key)
            )
        )

    def delete_if_equals(self, namespace: str, key: str, value: bytes) -> bool:
        # one statement: SQLite runs it atomically under its write lock
        return self._run(
            lambda conn: (
                conn.execute(
                    "DELETE FROM store_entries WHERE namespace = ? AND key = ? AND value = ? "
                    f"AND {_LIVE}",
                    (namespace, key, value, time.time()),
                ).rowcount
                == 1
            )
        )

    def expire_if_equals(self, namespace: str, key: str, value: bytes, *, ttl_s: float) -> bool:
        expires = _expiry(ttl_s)
        return self._run(
            lambda conn: (
                conn.execute(
                    "UPDATE store_entries SET expires_unix_s = ? WHERE namespace = ? AND key = ? "
                    f"AND value = ? AND {_LIVE}",
                    (expires, namespace, key, value, time.time()),
                ).rowcount
                == 1
            )
        )

    def commit(self, txn: Transaction) -> Outcome:
        def step(conn: sqlite3.Connection) -> Outcome:
            # the write lock first: no other writer (of any process) reads the counters
            # between this check and these writes
            with _transaction(conn, "BEGIN IMMEDIATE"):
                now = time.time()
                existing: dict[tuple[str, str], int | None] = {}
                for namespace, key in txn.written_slots:
                    row = conn.execute(
                        "SELECT length(value) FROM store_entries "
                        f"WHERE namespace = ? AND key = ? AND {_LIVE}",
                        (namespace, key, now),
                    ).fetchone()
                    existing[(namespace, key)] = None if row is None else int(row[0])
                found: dict[tuple[str, str], bytes | None] = {}
                for e in txn.expects:
                    row = conn.execute(
                        "SELECT value FROM store_entries "
                        f"WHERE namespace = ? AND key = ? AND {_LIVE}",
                        (e.namespace, e.key, now),
                    ).fetchone()
                    found[e.slot] = None if row is None else bytes(row[0])
                current = {c.key: _count(conn, c.key, now) for c in txn.counters}
                totals, writing = plan(txn, current, existing, found)
                conn.executemany(
                    "INSERT OR REPLACE INTO store_entries (namespace, key, value, expires_unix_s) "
                    "VALUES (?, ?, ?, NULL)",
                    [(p.namespace, p.key, p.value) for p in writing]
                    + [(COUNTERS, k, str(t).encode()) for k, t in totals.items() if t],
                )
                # a counter of nothing leaves no row behind
                conn.executemany(
                    "DELETE FROM store_entries WHERE namespace = ? AND key = ?",
                    [d.slot for d in txn.deletes]
                    + [(COUNTERS, k) for k, t in totals.items() if not t],
                )
                return Outcome(totals, frozenset(p.slot for p in writing))

        return self._run(step)

    def counter(self, key: str) -> int:
        return self._run(lambda conn: _count(conn, key, time.time()))

    def keys(self, namespace: str) -> list[str]:
        rows = self._run(
            lambda conn: conn.execute(
                f"SELECT key FROM store_entries WHERE namespace = ? AND {_LIVE} ORDER BY key",
                (namespace, time.time()),
            ).fetchall()
        )
        return [str(row[0]) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
