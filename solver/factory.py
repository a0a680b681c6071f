"""The one place Z3 solvers are made: fixed seeds, a wall-clock budget, an optional rlimit."""

from __future__ import annotations

import z3

RANDOM_SEED = 0


def make_solver(timeout_ms: int, rlimit: int = 0) -> z3.Solver:
    """An incremental solver with pinned seeds; ``rlimit`` 0 means unlimited.

    Pinning the seeds makes repeated solves of the same request take the same path, so the
    answer, the tie-break and the solve time are reproducible.
    """
    solver = z3.SolverFor("QF_AUFLIA")
    solver.set(random_seed=RANDOM_SEED)
    solver.set(timeout=max(1, timeout_ms))
    if rlimit:
        solver.set(rlimit=rlimit)
    return solver


def z3_version() -> str:
    return str(z3.get_version_string())
