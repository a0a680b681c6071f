"""The SQLite store's row layout: the value last, so a large value is written through blob I/O
without SQLite building it in memory; files of the first layout are rewritten on open."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from app.store.sqlite_store import SqliteStore

REPO = Path(__file__).resolve().parents[3]


def columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[1] for row in db.execute("PRAGMA table_info(store_entries)")]


def test_a_file_of_the_first_layout_is_migrated_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(  # the layout this store shipped with first
            "CREATE TABLE store_entries (namespace TEXT NOT NULL, key TEXT NOT NULL, "
            "value BLOB NOT NULL, expires_unix_s REAL, PRIMARY KEY (namespace, key))"
        )
        db.executemany(
            "INSERT INTO store_entries VALUES (?, ?, ?, ?)",
            [
                ("profiles", "kept", b"\x00profile", None),
                ("results", "live", b"answer", time.time() + 3600),
                ("results", "expired", b"old", time.time() - 1),
            ],
        )
    store = SqliteStore(path)
    assert store.get("profiles", "kept") == b"\x00profile"
    assert store.get("results", "live") == b"answer"
    assert store.get("results", "expired") is None  # its expiry came along too
    assert columns(path) == ["namespace", "key", "expires_unix_s", "value"]
    store.close()
    reopened = SqliteStore(path)  # a second open finds nothing to do
    assert reopened.keys("results") == ["live"]
    reopened.close()


PUT_LARGE = """
import os, resource, sys
from pathlib import Path
from app.store.sqlite_store import SqliteStore

store = SqliteStore(Path(sys.argv[1]))
store.put("x", "warm", b"1")
payload = os.urandom(32 * 1024 * 1024)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store.put_parts("results", "big", [b"header\\n", payload], ttl_s=3600)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_a_large_value_with_an_expiry_is_written_without_a_copy_in_memory(tmp_path: Path) -> None:
    # the service writes results with an expiry (KPERF_CACHE_STORE_TTL_S): with the expiry
    # after the value in the row, SQLite built the 32 MB blob in memory twice (peak +64 MB)
    done = subprocess.run(
        [sys.executable, "-c", PUT_LARGE, str(tmp_path / "store.sqlite3")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    growth_kib = int(done.stdout)
    assert growth_kib < 8 * 1024, f"peak RSS grew {growth_kib} KiB writing a 32 MiB value"
    store = SqliteStore(tmp_path / "store.sqlite3")
    value = store.get("results", "big")
    assert value is not None and len(value) == 7 + 32 * 1024 * 1024
    store.close()
