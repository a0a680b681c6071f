"""Several writes and the counters that bound them, applied all or nothing by the backend.

A cap checked before an awaited write is no cap: eight concurrent posts all pass the check, then all
write (concurrent writers raced past a cap). Here the check and the writes are one step of the
backend itself (SQLite: one ``BEGIN IMMEDIATE`` transaction; Redis: one Lua script; memory: one
lock), so at most the cap is ever stored, and the totals answered are the ones the step saw.

A :class:`Counter` measures the live values of some namespaces, by number of keys or by bytes;
the step adds what its puts newly write (a put ``if_absent`` onto an existing key writes
nothing and counts nothing) and subtracts what its deletes remove. Counters are plain integers
the backend keeps beside the values (never sealed: ``Store.counter`` reads them).

A step may also hold only while the state it was planned on still holds: an :class:`Expect`
(a key is live, or holds exactly some value) and a counter's ``expect`` (its total before the
step). Runs appended to a profile expect the profile, so none lands after its delete; a
delete expects the run count it listed, so none lands between its listing and its step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

#: namespace the backends keep counters in
COUNTERS = "counters"


@dataclass(frozen=True, slots=True)
class Keyed:
    """One key of one namespace: what a put, a delete and an expectation address."""

    namespace: str
    key: str

    @property
    def slot(self) -> tuple[str, str]:
        return (self.namespace, self.key)


@dataclass(frozen=True, slots=True)
class Put(Keyed):
    value: bytes
    #: write only when no value exists (identical content posted twice is stored once)
    if_absent: bool = False


@dataclass(frozen=True, slots=True)
class Delete(Keyed):
    """Remove the key's value (an absent one is no error)."""


@dataclass(frozen=True, slots=True)
class Counter:
    key: str
    #: what is counted: the keys, or the value bytes, of the live entries of ``namespaces``
    measure: Literal["count", "bytes"]
    namespaces: tuple[str, ...]
    #: the step is refused when it would raise the counter above this (None: no cap)
    cap: int | None = None
    #: the step applies only when the counter is this before it (None: whatever it is)
    expect: int | None = None


@dataclass(frozen=True, slots=True)
class Expect(Keyed):
    """The step applies only while ``key`` holds a live value (``value``: exactly that one)."""

    value: bytes | None = None


#: the pieces of one value, written one after the other (``Store.put_parts``)
Parts = Sequence[bytes | memoryview]


@dataclass(frozen=True, slots=True)
class Transaction:
    """One atomic step: ``puts`` then ``deletes``, ``counters`` updated, while ``expects`` hold."""

    puts: Sequence[Put] = ()
    deletes: Sequence[Delete] = ()
    counters: Sequence[Counter] = ()
    expects: Sequence[Expect] = ()

    @property
    def written_slots(self) -> set[tuple[str, str]]:
        """The slots its puts and deletes write: the sizes there decide its counters."""
        return {p.slot for p in self.puts} | {d.slot for d in self.deletes}


class Unmet(Exception):
    """An expectation of the step did not hold (what it was planned on changed meanwhile);
    nothing of it was written."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def check_expects(expects: Sequence[Expect], found: Mapping[tuple[str, str], bytes | None]) -> None:
    """Unmet unless every expectation holds on ``found`` (the live value of each key)."""
    for e in expects:
        value = found.get(e.slot)
        if value is None or (e.value is not None and value != e.value):
            raise Unmet(f"{e.namespace}/{e.key} changed")


class CapExceeded(Exception):
    """A step that would take ``counter`` from ``total`` to ``total + adding`` > ``cap``;
    nothing of it was written."""

    def __init__(self, counter: str, total: int, adding: int, cap: int) -> None:
        super().__init__(f"{counter}: {total} + {adding} > cap {cap}")
        self.counter = counter
        self.total = total
        self.adding = adding
        self.cap = cap


@dataclass(frozen=True, slots=True)
class Outcome:
    #: counter key -> its value after the step
    totals: Mapping[str, int]
    #: (namespace, key) of every put that wrote
    written: frozenset[tuple[str, str]]


def delta(counter: Counter, namespace: str, size: int) -> int:
    """What one value of ``size`` bytes in ``namespace`` adds to ``counter``."""
    if namespace not in counter.namespaces:
        return 0
    return 1 if counter.measure == "count" else size


def plan(
    txn: Transaction,
    current: Mapping[str, int],
    existing: Mapping[tuple[str, str], int | None],
    found: Mapping[tuple[str, str], bytes | None] | None = None,
) -> tuple[dict[str, int], list[Put]]:
    """The counters after the step and the puts that write, given the counters' values and the
    sizes of the existing values (None: absent) of every key the step touches; CapExceeded
    when a counter would pass its cap while growing, Unmet when an expectation fails on
    ``found`` (the live value of each expected key). Shared by the backends that run Python
    inside their atomic step (memory, SQLite); the Redis script is its Lua twin."""
    counters = txn.counters
    check_expects(txn.expects, found or {})
    sizes = dict(existing)
    adds = {c.key: 0 for c in counters}
    writing: list[Put] = []
    for put in txn.puts:
        old = sizes.get((put.namespace, put.key))
        if old is not None and put.if_absent:
            continue
        writing.append(put)
        sizes[(put.namespace, put.key)] = len(put.value)
        for c in counters:
            adds[c.key] += delta(c, put.namespace, len(put.value))
            if old is not None:
                adds[c.key] -= delta(c, put.namespace, old)
    for d in txn.deletes:
        old = sizes.get(d.slot)
        if old is None:
            continue
        sizes[d.slot] = None
        for c in counters:
            adds[c.key] -= delta(c, d.namespace, old)
    totals: dict[str, int] = {}
    for c in counters:
        total, add = current.get(c.key, 0), adds[c.key]
        if c.expect is not None and total != c.expect:
            raise Unmet(f"counter {c.key} is {total}, not {c.expect}")
        if c.cap is not None and add > 0 and total + add > c.cap:
            raise CapExceeded(c.key, total, add, c.cap)
        totals[c.key] = max(0, total + add)
    return totals, writing
