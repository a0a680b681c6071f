"""The one place Z3 solvers are made: fixed seeds, a wall-clock budget, an optional rlimit."""

from __future__ import annotations

import z3

RANDOM_SEED = 0


def make_solver(timeout_ms: int, rlimit: int = 0, ctx: z3.Context | None = None) -> z3.Solver:
    """An incremental solver with pinned seeds; ``rlimit`` 0 means unlimited; ``ctx`` the Z3
    context it lives in (None: Z3's main context; solver/z3_session.py gives each thread its
    own, as a context must not be used by two threads at once).

    Pinning the seeds makes repeated solves of the same request take the same path, so the
    answer, the tie-break and the solve time are reproducible.
    """
    solver = z3.SolverFor("QF_AUFLIA", ctx=ctx)
    solver.set(random_seed=RANDOM_SEED)
    solver.set(timeout=max(1, timeout_ms))
    if rlimit:
        solver.set(rlimit=rlimit)
    return solver


def z3_version() -> str:
    return str(z3.get_version_string())
