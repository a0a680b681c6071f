"""Find the GeMM-WS tiling with the smallest predicted time, proven optimal by Z3.

Objectives (§3.2), lexicographic: (1) overall execution time, (2) total MATH wait; then a
deterministic tie-break: larger tile_m, larger tile_n, larger tile_k, smaller buffer_depth.

Two modes (:class:`SolverMode`), written once for every pipeline model in
solver/per_configuration.py:

* ``certified`` (default): the model's vectorised scorer (for the paper's eq. (1)-(3),
  perfmodel/gemm_ws_scoring.py) evaluates every feasible configuration and ranks them exactly;
  the best (the incumbent, re-simulated stage by stage) is handed to Z3, which proves over the
  model's encoding that no configuration is lexicographically better (one UNSAT check).
  Ranks 2..k come straight from the exact scorer. A configuration Z3 finds better than the
  incumbent means the scorer and the encoding disagree: it raises
  :class:`solver.errors.CertificateMismatch` in strict mode (tests), else the answer comes from
  the pure Z3 search and the mismatch is counted in the statistics.
* ``z3-search``: the shortlist is found by solving again with each found configuration blocked,
  so rank r is the proven optimum of the space minus ranks 1..r-1.
"""

from __future__ import annotations

from solver.deadline import Deadline
from solver.problem import SolverMode, TilingProblem, TilingResult, check_arguments, check_mode


def optimize_tiling(
    problem: TilingProblem,
    *,
    top_k: int = 5,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> TilingResult:
    """Solve ``problem``; ``top_k`` ranked candidates; raises SolverTimeout if none was found.

    When the time limit cuts the solve short, the answer ("timeout") is the best of what was
    found. Rank 1 carries its per-stage events.
    """
    check_arguments(top_k, time_limit_s)
    deadline = Deadline(time_limit_s)
    check_mode(problem.space, mode)
    # numpy and Z3 stay out of the service process (tests/test_architecture.py): imported
    # where the solve runs, in the worker
    from solver.per_configuration import optimize_per_configuration

    return optimize_per_configuration(problem, top_k=top_k, deadline=deadline, mode=mode)
