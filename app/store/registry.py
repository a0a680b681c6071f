"""Store URL -> backend: ``memory://``, ``sqlite:///path/to/file``, ``redis://host:port/db``.

:func:`make_store` builds what the service holds: the backend behind the circuit breaker
(``resilient.py``) behind the checked envelope (``checked.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.store.base import MemoryStore, Store, redact
from app.store.checked import CheckedStore
from app.store.resilient import ResilientStore

#: seconds a network store may take per socket operation before the call counts as failed
DEFAULT_TIMEOUT_S = 0.25


def _memory(url: str, timeout_s: float) -> Store:
    if url.rstrip("/") != "memory:":
        raise ValueError(
            f"the in-process store takes no location: write memory://, got {redact(url)!r}"
        )
    return MemoryStore()


def _sqlite(url: str, timeout_s: float) -> Store:
    from app.store.sqlite_store import SqliteStore

    path = url[len("sqlite://") :]
    if not path:
        raise ValueError(
            f"no file in {redact(url)!r}: write sqlite:///absolute/path/to/file.sqlite3"
        )
    return SqliteStore(Path(path))


def _redis(url: str, timeout_s: float) -> Store:
    from app.store.redis_store import RedisStore  # redis-py is imported only when used

    return RedisStore(url, timeout_s=timeout_s)


#: URL scheme -> factory(url, timeout_s)
BACKENDS: dict[str, Callable[[str, float], Store]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "redis": _redis,
    "rediss": _redis,
}
EXAMPLES = "memory://, sqlite:///path/to/file.sqlite3, redis://host:6379/0"


def scheme_of(url: str) -> str:
    """The URL's scheme; ValueError listing the valid ones when it is not a known backend."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in BACKENDS:
        raise ValueError(
            f"unknown store URL {redact(url)!r}: the scheme must be one of "
            f"{', '.join(sorted(BACKENDS))} (for example {EXAMPLES})"
        )
    return scheme


def make_backend(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Store:
    """The bare backend named by ``url`` (nothing is opened or connected yet)."""
    return BACKENDS[scheme_of(url)](url, timeout_s)


def make_store(
    url: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_error: Callable[[str], None] | None = None,
    on_decode_failure: Callable[[str, str], None] | None = None,
    backoff_initial_s: float = 0.5,
    backoff_max_s: float = 2.0,
) -> CheckedStore:
    """The backend of ``url`` with the circuit breaker and the checked envelope around it.

    ``on_error(operation)`` is called per failed backend call, ``on_decode_failure(kind,
    reason)`` per dropped value (the metrics).
    """
    backend = make_backend(url, timeout_s=timeout_s)
    guarded = ResilientStore(
        backend,
        on_error=on_error,
        backoff_initial_s=backoff_initial_s,
        backoff_max_s=backoff_max_s,
    )
    return CheckedStore(guarded, on_decode_failure=on_decode_failure)
