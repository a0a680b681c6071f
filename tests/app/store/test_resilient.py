"""The circuit breaker (unit tests with a failing fake backend and a fake clock), the URL
registry, and a real Redis going away and coming back."""

from __future__ import annotations

import os
import signal
import time

import pytest

from app.settings import Settings
from app.store import BACKENDS, MemoryStore, ResilientStore, StoreUnavailable, make_backend
from app.store.base import redact
from app.store.redis_store import RedisStore
from app.store.sqlite_store import SqliteStore
from tests.app.redis_helpers import RedisServer, redis_server, redis_url

__all__ = ["redis_server", "redis_url"]


class FlakyStore(MemoryStore):
    """A memory store that fails while ``down`` is set, counting the calls it received."""

    name = "flaky"

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.calls = 0

    def get(self, namespace: str, key: str) -> bytes | None:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("connection refused")
        return super().get(namespace, key)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_stops_calling_a_dead_store_and_probes_after_the_backoff() -> None:
    flaky, clock, errors = FlakyStore(), Clock(), []
    store = ResilientStore(
        flaky, on_error=errors.append, backoff_initial_s=1.0, backoff_max_s=4.0, clock=clock
    )
    assert store.get("ns", "k") is None and store.health().ok
    flaky.down = True
    with pytest.raises(StoreUnavailable, match="connection refused"):
        store.get("ns", "k")
    assert errors == ["get"] and flaky.calls == 2
    health = store.health()
    assert (health.backend, health.ok, health.reason) == ("flaky", False, "connection refused")
    # within the back-off: refused at once, the backend is not called, nothing counted
    for _ in range(5):
        with pytest.raises(StoreUnavailable, match="next attempt in"):
            store.get("ns", "k")
    assert flaky.calls == 2 and errors == ["get"]
    # after it: one probe, which fails: the next back-off doubles (2 s), capped at 4 s
    clock.now += 1.0
    with pytest.raises(StoreUnavailable, match="connection refused"):
        store.get("ns", "k")
    assert flaky.calls == 3
    clock.now += 1.5
    with pytest.raises(StoreUnavailable, match="next attempt in 0.5 s"):
        store.get("ns", "k")
    for _ in range(3):  # 4 s, 4 s, 4 s: the cap
        clock.now += 4.0
        with pytest.raises(StoreUnavailable):
            store.get("ns", "k")
    assert flaky.calls == 6
    # the store comes back: the next probe closes the breaker
    flaky.down = False
    clock.now += 4.0
    assert store.get("ns", "k") is None
    assert store.health().ok and store.health().reason is None
    assert store.get("ns", "k") is None and flaky.calls == 8


def test_only_one_probe_at_a_time() -> None:
    flaky, clock = FlakyStore(), Clock()
    store = ResilientStore(flaky, backoff_initial_s=1.0, clock=clock)
    flaky.down = True
    with pytest.raises(StoreUnavailable):
        store.get("ns", "k")
    clock.now += 2
    assert store._admit() is True  # a probe is under way (the call has not returned)
    with pytest.raises(StoreUnavailable, match="unavailable"):
        store.get("ns", "k")  # another caller meanwhile: refused without a call
    assert flaky.calls == 1


def test_a_bug_in_the_caller_is_not_a_store_error() -> None:
    errors: list[str] = []
    store = ResilientStore(MemoryStore(), on_error=errors.append)
    with pytest.raises(ValueError, match="ttl_s"):
        store.put("ns", "k", b"v", ttl_s=-1)
    assert errors == [] and store.health().ok


@pytest.mark.parametrize("backoff", [(0.0, 1.0), (2.0, 1.0)])
def test_breaker_refuses_nonsense_backoffs(backoff: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        ResilientStore(MemoryStore(), backoff_initial_s=backoff[0], backoff_max_s=backoff[1])


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory://", MemoryStore),
        ("sqlite:///tmp/kperf-never-opened.sqlite3", SqliteStore),
        ("redis://127.0.0.1:1/0", RedisStore),  # nothing connects until the first call
        ("rediss://cache.example:6380/2", RedisStore),
    ],
)
def test_urls_name_their_backend(url: str, kind: type) -> None:
    backend = make_backend(url)
    assert isinstance(backend, kind)
    backend.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://db/kperf", "scheme must be one of memory, redis, rediss, sqlite"),
        ("/var/cache/kperf.sqlite3", "scheme must be one of"),
        ("sqlite://", "no file"),
        ("memory://somewhere", "takes no location"),
        ("redis://host:port/db", "bad Redis URL"),
    ],
)
def test_bad_urls_are_refused_with_the_valid_forms(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_backend(url)


@pytest.mark.parametrize(
    "url", ["redis://:s3cret@cache:port/0", "postgres://admin:s3cret@db/kperf"]
)
def test_messages_never_show_a_password(url: str) -> None:
    with pytest.raises(ValueError) as info:
        make_backend(url)
    assert "s3cret" not in str(info.value) and ":***@" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h/0", "redis://user:***@h/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("sqlite:///data/a@b.sqlite3", "sqlite:///data/a@b.sqlite3"),  # @ in a path is no user
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_registry_lists_every_scheme_the_settings_accept() -> None:
    assert sorted(BACKENDS) == ["memory", "redis", "rediss", "sqlite"]


def test_store_url_setting(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for key in list(os.environ):
        if key.startswith("KPERF_"):
            monkeypatch.delenv(key)
    assert Settings().effective_store_url == "memory://"
    monkeypatch.setenv("KPERF_CACHE_PATH", str(tmp_path / "c.sqlite3"))
    assert Settings().effective_store_url == f"sqlite://{tmp_path / 'c.sqlite3'}"
    monkeypatch.setenv("KPERF_STORE_URL", "redis://127.0.0.1:6379/0")
    assert Settings().effective_store_url == "redis://127.0.0.1:6379/0"  # the URL wins
    monkeypatch.setenv("KPERF_STORE_URL", "mongodb://x")
    with pytest.raises(ValueError, match="store_url") as info:
        Settings()
    assert "memory, redis, rediss, sqlite" in str(info.value)


# ----------------------------------------------------------------- a real Redis outage


def test_redis_down_fails_fast_and_reconnects_by_itself(
    redis_server: RedisServer, redis_url: str
) -> None:
    store = ResilientStore(RedisStore(redis_url), backoff_initial_s=0.2, backoff_max_s=0.2)
    try:
        store.put("results", "k", b"v")
        redis_server.kill()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.get("results", "k")
        assert time.monotonic() - started < 1.0
        assert not store.health().ok
        redis_server.start()  # same port, empty (no persistence)
        time.sleep(0.25)  # the back-off
        assert store.get("results", "k") is None  # reached again: the data died with it
        assert store.health().ok
        store.put("results", "k", b"w")
        assert store.get("results", "k") == b"w"
    finally:
        store.close()


def test_a_frozen_redis_costs_at_most_about_two_timeouts(
    redis_server: RedisServer, redis_url: str
) -> None:
    store = RedisStore(redis_url, timeout_s=0.2)
    try:
        store.put("results", "k", b"v")
        assert redis_server.proc is not None
        os.kill(redis_server.proc.pid, signal.SIGSTOP)  # alive, accepting, never answering
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="Timeout"):
                store.get("results", "k")
            assert time.monotonic() - started < 1.0
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        assert store.get("results", "k") == b"v"
    finally:
        store.close()
