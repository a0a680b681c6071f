"""Z3 state reused across certificate checks in one thread (a worker process, an inline thread).

A certificate check used to build a fresh solver, parse the whole encoding into it, check, and
tear it down; on the small spaces of Table 1 the set-up and parse cost about twice the check
itself (bench/RESULTS.md, "Certified solve"). The encoding's text comes in two parts
(:class:`solver.encoding.EncodingText`): the declarations and the recurrences of eq. (1)-(3)
over the unrolled window, which depend only on the deepest buffer and the window length, and
the problem's own facts. A session keeps one solver per shared text, with that text asserted
at its base level, and checks each problem in a ``push``/``pop`` scope: inside the scope the
solver holds exactly the assertions a fresh solver given the whole text would hold, so an
``unsat`` proves the same claim over the same encoding.

Z3 contexts are not thread-safe: each thread gets a session with a context of its own
(:func:`session`). A solver whose check raised or ended "unknown" (a timeout may interrupt it
in any state) is dropped, not reused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import z3

from solver.factory import make_solver

#: solvers kept per session (one per distinct shared text: deepest depth x window length);
#: the least recently used one beyond this is dropped
MAX_SESSION_SOLVERS = 16
#: the variables a sat model is read at (declared by solver/encoding.py)
_TILING_VARIABLES = ("tile_m", "tile_n", "tile_k", "buffer_depth")


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """What Z3 answered, and for "sat" the model's tiling variables (read inside the scope)."""

    outcome: str
    tiling: tuple[int, int, int, int] | None = None


class Z3Session:
    """A Z3 context and its solvers, one per shared encoding text; use from one thread only."""

    def __init__(self, max_solvers: int = MAX_SESSION_SOLVERS) -> None:
        if max_solvers < 1:
            raise ValueError("max_solvers must be at least 1")
        self.context = z3.Context()
        self.max_solvers = max_solvers
        self._solvers: OrderedDict[str, z3.Solver] = OrderedDict()
        #: checks answered, and solvers built (a reused solver is a check minus a build)
        self.checks = 0
        self.solvers_built = 0

    def check(self, shared: str, specific: str, timeout_ms: int) -> CheckOutcome:
        """Check ``shared`` and ``specific`` (SMT-LIB 2 text) together within ``timeout_ms``.
        An empty ``shared`` leaves nothing to keep: the check gets a solver of its own (the
        declarations of ``specific`` could not be made again in a kept one)."""
        if not shared:
            return self._check_alone(specific, timeout_ms)
        solver = self._solver(shared)
        solver.set(timeout=max(1, timeout_ms))
        keep = False
        try:
            solver.push()
            try:
                solver.from_string(specific)
                result = solver.check()
                tiling = self._tiling(solver.model()) if result == z3.sat else None
            finally:
                solver.pop()
            keep = result in (z3.sat, z3.unsat)
        finally:
            if not keep:
                self._solvers.pop(shared, None)
        self.checks += 1
        return CheckOutcome(str(result), tiling)

    def _check_alone(self, text: str, timeout_ms: int) -> CheckOutcome:
        solver = make_solver(timeout_ms=timeout_ms, ctx=self.context)
        solver.from_string(text)
        result = solver.check()
        self.checks += 1
        return CheckOutcome(str(result), self._tiling(solver.model()) if result == z3.sat else None)

    def _solver(self, shared: str) -> z3.Solver:
        solver = self._solvers.get(shared)
        if solver is not None:
            self._solvers.move_to_end(shared)
            return solver
        solver = make_solver(timeout_ms=1, ctx=self.context)
        solver.from_string(shared)
        self.solvers_built += 1
        self._solvers[shared] = solver
        while len(self._solvers) > self.max_solvers:
            self._solvers.popitem(last=False)
        return solver

    def _tiling(self, model: z3.ModelRef) -> tuple[int, int, int, int]:
        tm, tn, tk, depth = (
            int(model.eval(z3.Int(name, self.context), model_completion=True).as_long())
            for name in _TILING_VARIABLES
        )
        return tm, tn, tk, depth


_local = threading.local()


def session() -> Z3Session:
    """This thread's session (made on first use)."""
    current: Z3Session | None = getattr(_local, "session", None)
    if current is None:
        current = _local.session = Z3Session()
    return current
