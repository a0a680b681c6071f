"""Lexicographic minimisation by bound tightening on an incremental Z3 solver.

Each objective is tightened until the solver answers ``unsat`` for "strictly better", which
is the proof that the value is optimal given the higher-priority objectives; it is then fixed
and the next objective is tightened. A check cut short by the deadline ends the search with the
best model so far and ``proven = False``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import z3

_MAX_TIMEOUT_MS = 2**31 - 1


@dataclass(frozen=True)
class Objective:
    term: z3.ArithRef
    minimize: bool
    #: a value worth trying first (e.g. a proven bound), given the optimal values of the
    #: objectives before this one; a good probe saves tightening steps, a bad one costs one
    probe: Callable[[tuple[int, ...]], int | None] | None = None


@dataclass(frozen=True)
class LexResult:
    model: z3.ModelRef | None
    proven: bool
    checks: int


def lexicographic_optimum(
    solver: z3.Solver,
    objectives: Sequence[Objective],
    deadline: float,
    clock: Callable[[], float] = time.perf_counter,
) -> LexResult:
    """Optimum of ``objectives`` in order; leaves ``solver``'s assertions as it found them.

    ``deadline`` is a ``clock()`` reading; each check gets the time remaining until it.
    """
    checks = 0

    def check() -> z3.CheckSatResult:
        nonlocal checks
        # Z3 takes the timeout as an unsigned 32-bit count of milliseconds.
        remaining = int(min((deadline - clock()) * 1000, _MAX_TIMEOUT_MS))
        if remaining <= 0:
            return z3.unknown
        solver.set(timeout=remaining)
        checks += 1
        return solver.check()

    solver.push()
    try:
        first = check()
        if first == z3.unsat:
            return LexResult(None, True, checks)
        if first != z3.sat:
            return LexResult(None, False, checks)
        model = solver.model()
        fixed: list[int] = []

        def improve(claim: z3.BoolRef) -> z3.CheckSatResult:
            """Check ``claim`` in a scope of its own; on "sat" its model is the new best."""
            nonlocal model
            solver.push()
            solver.add(claim)
            outcome = check()
            if outcome == z3.sat:
                model = solver.model()
            solver.pop()
            return outcome

        for objective in objectives:
            term, minimize = objective.term, objective.minimize
            best = model.eval(term, model_completion=True)
            probe = objective.probe(tuple(fixed)) if objective.probe is not None else None
            # a probe worth checking is strictly better than the model's value
            current = int(str(best))
            if probe is not None and (probe < current if minimize else probe > current):
                outcome = improve(term <= probe if minimize else term >= probe)
                best = model.eval(term, model_completion=True)
                if outcome not in (z3.sat, z3.unsat):
                    return LexResult(model, False, checks)
            while (outcome := improve(term < best if minimize else term > best)) == z3.sat:
                best = model.eval(term, model_completion=True)
            if outcome != z3.unsat:
                return LexResult(model, False, checks)
            solver.add(term == best)
            fixed.append(int(str(best)))
        return LexResult(model, True, checks)
    finally:
        solver.pop()


_Found = TypeVar("_Found")


@dataclass(frozen=True)
class Ranking(Generic[_Found]):
    #: in rank order; rank r is the optimum of what ranks 1..r-1 left
    found: list[_Found]
    proven: bool
    checks: int


def rank_by_blocking(
    solver: z3.Solver,
    objectives: Sequence[Objective],
    deadline: float,
    ranks: int,
    read: Callable[[z3.ModelRef], _Found],
    block: Callable[[_Found], z3.BoolRef],
) -> Ranking[_Found]:
    """Up to ``ranks`` lexicographic optima, each found by solving again with every earlier
    one blocked; ``proven`` is False when the deadline cut a solve short."""
    found: list[_Found] = []
    checks = 0
    for _ in range(ranks):
        result = lexicographic_optimum(solver, objectives, deadline)
        checks += result.checks
        if result.model is not None:
            value = read(result.model)
            found.append(value)
            solver.add(z3.Not(block(value)))
        if not result.proven:
            return Ranking(found, False, checks)
        if result.model is None:
            break
    return Ranking(found, True, checks)
