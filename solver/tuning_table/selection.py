"""Which configuration each M key gets, under at most ``max_distinct`` distinct configurations.

Without a limit every key takes its own certified optimum (loss 0 at the key). With one, the
choice minimises the worst per-key loss ``t(c, M) / t*(M) - 1`` over the keys: a set of at most
D configurations covers a key when one of them is within the threshold of that key's optimum,
so "is there a choice of worst loss <= theta" is a set cover of the keys with at most D sets.
Z3 decides it (pseudo-Boolean at-most-D over one Boolean per configuration; configurations
whose covered keys are a subset of another's are dropped first, which never changes the
answer); a binary search over the finitely many loss values finds the least feasible one.
The optimum is exact when every check answered; a check out of time leaves an interval:
``worst_key_loss`` is achieved, ``lower_bound_loss`` is proven (no choice does better).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import z3

from solver.factory import make_solver


@dataclass(frozen=True, slots=True)
class Selection:
    """Per key (in the order given) the index of its configuration."""

    chosen: tuple[int, ...]
    #: the largest ``t(chosen, M) / t*(M) - 1`` over the keys
    worst_key_loss: float
    #: no choice of at most max_distinct configurations has a worst key loss below this
    #: (equal to worst_key_loss when ``exact``)
    lower_bound_loss: float
    distinct: int
    exact: bool
    z3_checks: int


def _loss(times: Sequence[Sequence[int]]) -> list[list[float]]:
    out = []
    for row in times:
        best = min(row)
        out.append([t / best - 1.0 for t in row])
    return out


def select(
    times: Sequence[Sequence[int]],
    preferred: Sequence[int],
    max_distinct: int | None,
    *,
    timeout_ms: int = 2000,
) -> Selection:
    """``times[k][c]``: predicted ns of configuration c at key k (every key has every
    configuration); ``preferred[k]``: key k's certified optimum (a minimum of ``times[k]``)."""
    if len(times) != len(preferred) or not times:
        raise ValueError("one preferred configuration per key, at least one key")
    if max_distinct is not None and max_distinct < 1:
        raise ValueError("max_distinct must be at least 1")
    for row, best in zip(times, preferred, strict=True):
        if row[best] != min(row):
            raise ValueError("a preferred configuration is not its key's optimum")
    own = tuple(preferred)
    if max_distinct is None or len(set(own)) <= max_distinct:
        return Selection(own, 0.0, 0.0, len(set(own)), True, 0)
    loss = _loss(times)
    thresholds = sorted({value for row in loss for value in row})
    low, high = 0, len(thresholds) - 1  # the largest threshold lets any one configuration do
    proven_below = 0.0
    checks = 0
    exact = True
    best_cover: list[int] | None = None
    while low < high:
        middle = (low + high) // 2
        checks += 1
        outcome, cover = _cover(loss, thresholds[middle], max_distinct, timeout_ms)
        if outcome == "sat":
            best_cover = cover
            high = middle
        else:
            if outcome == "unsat":
                proven_below = max(proven_below, thresholds[middle + 1])
            else:  # unknown: not proven either way
                exact = False
            low = middle + 1
    if best_cover is None or _worst(loss, best_cover) > thresholds[low]:
        checks += 1
        outcome, cover = _cover(loss, thresholds[low], max_distinct, timeout_ms)
        if outcome != "sat":
            # only reached when every check at this threshold ran out of time: the largest
            # threshold is always covered by one configuration (the best at the worst key)
            cover = [_single_best(loss)]
            exact = False
        best_cover = cover
    chosen = tuple(_fastest(best_cover, row) for row in times)
    worst = max(loss[k][c] for k, c in enumerate(chosen))
    return Selection(
        chosen=chosen,
        worst_key_loss=worst,
        lower_bound_loss=worst if exact else min(proven_below, worst),
        distinct=len(set(chosen)),
        exact=exact,
        z3_checks=checks,
    )


def _fastest(cover: list[int], row: Sequence[int]) -> int:
    """The configuration of ``cover`` fastest at this key (the lower index on a tie)."""
    return min(cover, key=lambda c: (row[c], c))


def _worst(loss: list[list[float]], cover: list[int]) -> float:
    return max(min(row[c] for c in cover) for row in loss)


def _single_best(loss: list[list[float]]) -> int:
    configurations = range(len(loss[0]))
    return min(configurations, key=lambda c: (max(row[c] for row in loss), c))


def _cover(
    loss: list[list[float]], threshold: float, most: int, timeout_ms: int
) -> tuple[Literal["sat", "unsat", "unknown"], list[int]]:
    """At most ``most`` configurations, each key within ``threshold`` of its optimum by one
    of them: ("sat", the configurations), ("unsat", []) when none exists, ("unknown", [])
    when Z3 ran out of time."""
    masks: dict[int, int] = {}
    for c in range(len(loss[0])):
        mask = sum(1 << k for k, row in enumerate(loss) if row[c] <= threshold)
        if mask and mask not in masks:
            masks[mask] = c
    # a configuration covering a subset of another's keys is never needed
    kept = [m for m in masks if not any(m != o and m | o == o for o in masks)]
    everything = (1 << len(loss)) - 1
    union = 0
    for mask in kept:
        union |= mask
    if union != everything:
        return "unsat", []
    if len(kept) <= most:
        return "sat", [masks[m] for m in kept]
    solver = make_solver(timeout_ms)
    picks = [z3.Bool(f"use_{i}") for i in range(len(kept))]
    solver.add(z3.AtMost(*picks, most))
    for k in range(len(loss)):
        solver.add(z3.Or([p for p, m in zip(picks, kept, strict=True) if m >> k & 1]))
    outcome = solver.check()
    if outcome == z3.unknown:
        return "unknown", []
    if outcome == z3.unsat:
        return "unsat", []
    model = solver.model()
    used = [masks[m] for p, m in zip(picks, kept, strict=True) if z3.is_true(model.eval(p, True))]
    return "sat", used
