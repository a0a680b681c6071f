"""Shared by replicas: the store in Redis (``redis://host:port/db``, ``rediss://`` for TLS).

Each value is one Redis string under ``kperf:<len(namespace)>:<namespace>:<key>``: the length
makes the layout unambiguous (namespace ``measurements`` never lists the keys of namespace
``measurements:gtx-760``), and ``keys`` is a SCAN of one namespace's prefix. Expiry is Redis's
own (``PX``), ``put_if_absent`` is ``SET NX PX``: atomic across every replica, and so are
``delete_if_equals`` and ``expire_if_equals`` (a Lua script each: compare, then act).

Nothing connects until the first call, and every socket operation gives up after
``timeout_s`` (default 0.25 s): a dead or frozen Redis costs a request at most about two
timeouts (one retry on a fresh connection, which is what a Redis restart needs), and the
circuit breaker (``resilient.py``) then stops calling it for a while. Every redis-py or socket
error becomes :class:`StoreUnavailable`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.store.base import Store, StoreUnavailable, check_ttl_s, redact
from app.store.transaction import (
    COUNTERS,
    CapExceeded,
    Outcome,
    Parts,
    Transaction,
    Unmet,
)

R = TypeVar("R")

KEY_PREFIX = "kperf"
#: SCAN batch size for ``keys``
SCAN_COUNT = 1000
#: values above this are read in pieces of this size: redis-py assembles a reply in a growing
#: buffer, which its connection keeps, and copies it out up to three times on the way (a
#: 36 MB answer cost 137 MiB of peak RSS). In pieces, the value is written once, into one
#: buffer, inside a WATCH so that a value replaced meanwhile is never returned half-and-half.
PIECE_BYTES = 1 << 20
#: keys per MGET of ``get_many`` (a record's runs are small: one reply stays well below a MiB)
MGET_KEYS = 500


#: compare-and-delete / compare-and-renew: Redis runs a script atomically
_DELETE_IF_EQUALS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_EXPIRE_IF_EQUALS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

#: ``transaction.plan`` in Lua: Redis runs a script alone, so the counters it reads are the
#: ones it writes. KEYS: counters, then puts, then deletes, then expects. ARGV: the four
#: counts, then per counter (measure, cap or "", namespaces joined by newlines, expected total
#: or ""), per put (namespace, if_absent "1"/"0", value), per delete (namespace), per expect
#: (value given "1"/"0", value). Answers {0, counter index, total, adding, cap} when a cap
#: refuses, {2, expect index} or {3, counter index, total} when an expectation fails (nothing
#: written either way), else {1, {totals}, {indices of the puts written}}.
_TRANSACT = """
local nc, np, nd, ne = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local a = 5
local counters = {}
for i = 1, nc do
  local ns = {}
  for n in string.gmatch(ARGV[a + 2], '[^\\n]+') do ns[n] = true end
  counters[i] = {measure = ARGV[a], cap = ARGV[a + 1], ns = ns, add = 0, expect = ARGV[a + 3]}
  a = a + 4
end
local sizes = {}
local function size_of(k)
  if sizes[k] == nil then
    sizes[k] = false
    if redis.call('EXISTS', k) == 1 then sizes[k] = redis.call('STRLEN', k) end
  end
  return sizes[k]
end
local function bump(ns, size, sign)
  for _, c in ipairs(counters) do
    if c.ns[ns] then
      if c.measure == 'count' then c.add = c.add + sign else c.add = c.add + sign * size end
    end
  end
end
local writes, written = {}, {}
for i = 1, np do
  local k, ns, ifabs, v = KEYS[nc + i], ARGV[a], ARGV[a + 1], ARGV[a + 2]
  a = a + 3
  local old = size_of(k)
  if not (old and ifabs == '1') then
    writes[#writes + 1] = {k, v}
    written[#written + 1] = i
    sizes[k] = string.len(v)
    bump(ns, string.len(v), 1)
    if old then bump(ns, old, -1) end
  end
end
local dels = {}
for i = 1, nd do
  local k, ns = KEYS[nc + np + i], ARGV[a]
  a = a + 1
  local old = size_of(k)
  if old then
    sizes[k] = false
    dels[#dels + 1] = k
    bump(ns, old, -1)
  end
end
for i = 1, ne do
  local found = redis.call('GET', KEYS[nc + np + nd + i])
  if (not found) or (ARGV[a] == '1' and found ~= ARGV[a + 1]) then return {2, i} end
  a = a + 2
end
local totals = {}
for i, c in ipairs(counters) do
  local total = tonumber(redis.call('GET', KEYS[i]) or '0')
  if c.expect ~= '' and total ~= tonumber(c.expect) then return {3, i, total} end
  if c.cap ~= '' and c.add > 0 and total + c.add > tonumber(c.cap) then
    return {0, i, total, c.add, tonumber(c.cap)}
  end
  totals[i] = math.max(0, total + c.add)
end
for _, w in ipairs(writes) do redis.call('SET', w[1], w[2]) end
for _, k in ipairs(dels) do redis.call('DEL', k) end
for i = 1, nc do
  if totals[i] > 0 then redis.call('SET', KEYS[i], tostring(totals[i]))
  else redis.call('DEL', KEYS[i]) end
end
return {1, totals, written}
"""


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _ttl_ms(ttl_s: float | None) -> int | None:
    ttl_s = check_ttl_s(ttl_s)
    return None if ttl_s is None else max(1, round(ttl_s * 1000))


class RedisStore(Store):
    name = "redis"

    def __init__(self, url: str, *, timeout_s: float = 0.25) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.url = url
        try:
            self._client: redis.Redis = redis.Redis.from_url(
                url,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                # one immediate retry on a new connection: a pooled connection to a Redis that
                # restarted fails once, the fresh one works; never a backoff inside a request
                retry=Retry(NoBackoff(), 1),
                health_check_interval=30,
            )
        except ValueError as exc:
            raise ValueError(
                f"bad Redis URL {redact(url)!r} ({exc}); expected redis://host:port/db"
            ) from exc
        # sent by SHA (EVALSHA), loaded again by redis-py when a restarted Redis lost it
        self._delete_if_equals = self._client.register_script(_DELETE_IF_EQUALS)
        self._expire_if_equals = self._client.register_script(_EXPIRE_IF_EQUALS)
        self._transact = self._client.register_script(_TRANSACT)

    def _prefix(self, namespace: str) -> str:
        return f"{KEY_PREFIX}:{len(namespace)}:{namespace}:"

    def _run(self, operation: str, fn: Callable[[], R]) -> R:
        try:
            return fn()
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis {operation}: {type(exc).__name__}: {exc}") from exc

    def ping(self) -> None:
        self._run("ping", self._client.ping)

    def get(self, namespace: str, key: str) -> bytes | None:
        value: Any = self._run("get", lambda: self._client.get(self._prefix(namespace) + key))
        return None if value is None else bytes(value)

    def get_many(self, namespace: str, keys: Sequence[str]) -> list[bytes | None]:
        prefix = self._prefix(namespace)
        values: list[bytes | None] = []
        for start in range(0, len(keys), MGET_KEYS):
            names = [prefix + key for key in keys[start : start + MGET_KEYS]]
            found: Any = self._run("mget", functools.partial(self._client.mget, names))
            values += [None if v is None else bytes(v) for v in found]
        return values

    def get_buffer(self, namespace: str, key: str) -> bytes | bytearray | None:
        name = self._prefix(namespace) + key

        def read() -> bytes | bytearray | None:
            # one round trip when the value is small (the first piece is all of it)
            with self._client.pipeline(transaction=False) as pipeline:
                pipe: Any = pipeline
                pipe.strlen(name)
                pipe.getrange(name, 0, PIECE_BYTES - 1)
                size, first = pipe.execute()
            if size == 0:  # absent, or an empty value: GET tells which
                empty: bytes | None = self._client.get(name)  # type: ignore[assignment]
                return empty
            if size <= PIECE_BYTES:
                return bytes(first)
            for _ in range(3):  # a value rewritten while it was read is read again
                try:
                    return self._read_in_pieces(name)
                except redis.WatchError:
                    continue
            return None  # rewritten on every try: a miss now beats a torn value

        return self._run("get", read)

    def _read_in_pieces(self, name: str) -> bytearray | None:
        with self._client.pipeline(transaction=True) as pipeline:
            pipe: Any = pipeline
            pipe.watch(name)  # immediate mode from here until multi()
            size = int(pipe.strlen(name))
            if size == 0:
                return None
            value = bytearray(size)
            for start in range(0, size, PIECE_BYTES):
                piece = pipe.getrange(name, start, start + PIECE_BYTES - 1)
                value[start : start + len(piece)] = piece
            pipe.multi()
            pipe.execute()  # WatchError when the value changed (or expired) since watch()
            return value

    def put(self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        px = _ttl_ms(ttl_s)
        self._run("set", lambda: self._client.set(self._prefix(namespace) + key, value, px=px))

    def put_parts(
        self, namespace: str, key: str, parts: Parts, *, ttl_s: float | None = None
    ) -> None:
        if len(parts) == 1 or sum(len(part) for part in parts) <= PIECE_BYTES:
            self.put(namespace, key, b"".join(parts), ttl_s=ttl_s)
            return
        name = self._prefix(namespace) + key
        px = _ttl_ms(ttl_s)

        def write() -> None:
            # MULTI/EXEC: no reader sees the first part alone; redis-py sends a large part
            # from its own buffer, without joining it into the command
            with self._client.pipeline(transaction=True) as pipe:
                pipe.set(name, parts[0], px=px)
                for part in parts[1:]:
                    pipe.append(name, part)
                pipe.execute()

        self._run("set", write)

    def put_if_absent(
        self, namespace: str, key: str, value: bytes, *, ttl_s: float | None = None
    ) -> bool:
        px = _ttl_ms(ttl_s)
        stored = self._run(
            "set nx",
            lambda: self._client.set(self._prefix(namespace) + key, value, px=px, nx=True),
        )
        return bool(stored)

    def delete(self, namespace: str, key: str) -> None:
        self._run("del", lambda: self._client.delete(self._prefix(namespace) + key))

    def delete_if_equals(self, namespace: str, key: str, value: bytes) -> bool:
        slot = self._prefix(namespace) + key
        deleted = self._run("del if equals", lambda: self._delete_if_equals([slot], [value]))
        return bool(deleted)

    def expire_if_equals(self, namespace: str, key: str, value: bytes, *, ttl_s: float) -> bool:
        check_ttl_s(ttl_s)
        slot, px = self._prefix(namespace) + key, max(1, round(ttl_s * 1000))
        renewed = self._run("expire if equals", lambda: self._expire_if_equals([slot], [value, px]))
        return bool(renewed)

    def commit(self, txn: Transaction) -> Outcome:
        keys = [self._prefix(COUNTERS) + c.key for c in txn.counters]
        keys += [self._prefix(p.namespace) + p.key for p in txn.puts]
        keys += [self._prefix(d.namespace) + d.key for d in txn.deletes]
        keys += [self._prefix(e.namespace) + e.key for e in txn.expects]
        steps = (txn.counters, txn.puts, txn.deletes, txn.expects)
        args: list[bytes | str | int] = [len(step) for step in steps]
        for c in txn.counters:
            args += [c.measure, "" if c.cap is None else c.cap, "\n".join(c.namespaces)]
            args.append("" if c.expect is None else c.expect)
        for p in txn.puts:
            args += [p.namespace, "1" if p.if_absent else "0", p.value]
        args += [d.namespace for d in txn.deletes]
        for e in txn.expects:
            args += ["0", ""] if e.value is None else ["1", e.value]
        answer: Any = self._run("transact", lambda: self._transact(keys, args))
        if int(answer[0]) == 0:
            _, index, total, adding, cap = (int(x) for x in answer)
            raise CapExceeded(txn.counters[index - 1].key, total, adding, cap)
        if int(answer[0]) == 2:
            missed = txn.expects[int(answer[1]) - 1]
            raise Unmet(f"{missed.namespace}/{missed.key} changed")
        if int(answer[0]) == 3:
            counter = txn.counters[int(answer[1]) - 1]
            raise Unmet(f"counter {counter.key} is {int(answer[2])}, not {counter.expect}")
        totals = {c.key: int(t) for c, t in zip(txn.counters, answer[1], strict=True)}
        written = frozenset((txn.puts[i - 1].namespace, txn.puts[i - 1].key) for i in answer[2])
        return Outcome(totals, written)

    def counter(self, key: str) -> int:
        raw: Any = self._run("get", lambda: self._client.get(self._prefix(COUNTERS) + key))
        return 0 if raw is None else int(raw)

    def keys(self, namespace: str) -> list[str]:
        prefix = self._prefix(namespace)
        pattern = _glob_escape(prefix) + "*"

        def scan() -> list[str]:
            found = self._client.scan_iter(match=pattern, count=SCAN_COUNT)
            return sorted(bytes(k).decode("ascii")[len(prefix) :] for k in found)

        return self._run("scan", scan)

    def close(self) -> None:
        self._client.close()
