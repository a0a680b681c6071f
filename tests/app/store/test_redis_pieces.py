"""Large values in Redis are read in pieces (``PIECE_BYTES``) inside a WATCH: a reader racing a
writer gets one whole value or the other, never a mix of both (real redis-server)."""

from __future__ import annotations

import threading

from app.store.redis_store import PIECE_BYTES, RedisStore
from tests.app.redis_helpers import redis_server, redis_url

__all__ = ["redis_server", "redis_url"]


def test_a_value_rewritten_while_read_in_pieces_is_never_torn(redis_url: str) -> None:
    size = 6 * PIECE_BYTES + 123  # seven pieces
    first, second = b"a" * size, b"b" * size
    writer_store, reader = RedisStore(redis_url, timeout_s=5), RedisStore(redis_url, timeout_s=5)
    writer_store.put("results", "big", first)
    stop = threading.Event()
    writes = 0

    def rewrite() -> None:
        nonlocal writes
        while not stop.is_set():
            writer_store.put("results", "big", second if writes % 2 else first)
            writes += 1
            stop.wait(0.01)  # gaps in which a whole read can succeed

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        seen = [reader.get_buffer("results", "big") for _ in range(30)]
    finally:
        stop.set()
        writer.join()
        writer_store.close()
    whole = [value for value in seen if value is not None]
    assert writes > 10  # the reads really raced the writes
    assert whole, "every read was given up: the retry never succeeded"
    for value in whole:
        assert value in (first, second), "a torn value: pieces of two writes"
    reader.close()


def test_parts_are_written_atomically_as_one_value(redis_url: str) -> None:
    store = RedisStore(redis_url)
    parts = [b"kperf-store 1 results abc\n", bytes(range(256)) * (PIECE_BYTES // 128)]
    store.put_parts("results", "parts", parts, ttl_s=60)
    assert store.get("results", "parts") == b"".join(parts)
    assert store.get_buffer("results", "parts") == b"".join(parts)
    store.close()
