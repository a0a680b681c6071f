"""Find the GeMM-WS tiling with the smallest predicted time, proven optimal by Z3.

Objectives (§3.2), lexicographic: (1) overall execution time, (2) total MATH wait; then a
deterministic tie-break: larger tile_m, larger tile_n, larger tile_k, smaller buffer_depth.

Two modes (:class:`SolverMode`):

* ``certified`` (default): the vectorised scorer (perfmodel/gemm_ws_scoring.py) evaluates the
  closed form of eq. (1)-(3) on every feasible configuration and ranks them exactly; the best
  (the incumbent, re-simulated stage by stage) is handed to Z3, which proves over the same
  encoding of eq. (1)-(3) that no configuration is lexicographically better (one UNSAT check).
  Ranks 2..k come straight from the exact scorer. A configuration Z3 finds better than the
  incumbent means the scorer and the encoding disagree: it raises
  :class:`solver.errors.CertificateMismatch` in strict mode (tests), else the answer comes from
  the pure Z3 search and the mismatch is counted in the statistics.
* ``z3-search``: the shortlist is found by solving again with each found configuration blocked,
  so rank r is the proven optimum of the space minus ranks 1..r-1.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfmodel.gemm_ws import ELEMENT_BYTES, Simulation, Tiling, simulate
from perfmodel.pipelines.paper import PaperPipeline
from solver import problem as _problem
from solver.bounds import TripleBound, summarize, triple_bounds
from solver.deadline import Deadline
from solver.encoding import Encoding, encode, encode_text
from solver.errors import CertificateMismatch, SolverTimeout
from solver.factory import make_solver
from solver.lexicographic import Objective, rank_by_blocking
from solver.problem import (
    _KEY_BASE,
    CERTIFICATE_CLAIM,
    MAX_Z3_SEARCH_TILE_TRIPLES,
    Certificate,
    CertificateCheck,
    SolverMode,
    SolverStatistics,
    TilingProblem,
    TilingResult,
    better_than,
    certified_result_of,
    check_arguments,
    check_mode,
    objective_key,
    result_of,
    tie_break_key,
)
from solver.search_space import MAX_BUFFER_DEPTH, SearchSpace, SearchSummary
from solver.z3_session import session

if TYPE_CHECKING:
    # numpy stays out of the service process (tests/test_architecture.py): the scorer is
    # imported where it runs, in the worker
    from perfmodel.gemm_ws_scoring import Configurations, IntArray

__all__ = [
    "ELEMENT_BYTES",
    "better_than",
    "MAX_Z3_SEARCH_TILE_TRIPLES",
    "CertificateCheck",
    "SolverMode",
    "SolverStatistics",
    "TilingProblem",
    "TilingResult",
    "optimize_tiling",
]

_log = logging.getLogger(__name__)


def _objectives(enc: Encoding, space: SearchSpace, triples: list[TripleBound]) -> list[Objective]:
    """§3.2's two objectives, then the tie-break, in lexicographic priority order.

    Probes come from the per-triple bounds: the smallest overall-time floor; given the optimal
    time, the smallest wait floor among triples that can reach it; given both, the best
    tie-break key among triples that can reach them (at the shallowest depth >= 2, as depth 1
    is never faster). They are first guesses only: Z3 still proves each value.
    """

    def wait_probe(fixed: tuple[int, ...]) -> int | None:
        (overall,) = fixed
        floors = [t.total_math_wait_floor_ns for t in triples if t.overall_time_floor_ns <= overall]
        return min(floors, default=None)

    def key_probe(fixed: tuple[int, ...]) -> int | None:
        overall, wait = fixed
        keys = [
            tie_break_key(t.tile_m, t.tile_n, t.tile_k, _probe_depth(t, space))
            for t in triples
            if t.overall_time_floor_ns <= overall and t.total_math_wait_floor_ns <= wait
        ]
        return max(keys, default=None)

    return [
        Objective(enc.overall_time_ns, minimize=True, probe=lambda _: enc.overall_time_floor_ns),
        Objective(enc.total_math_wait_ns, minimize=True, probe=wait_probe),
        Objective(
            tie_break_key(enc.tile_m, enc.tile_n, enc.tile_k, enc.buffer_depth),
            minimize=False,
            probe=key_probe,
        ),
    ]


def _probe_depth(triple: TripleBound, space: SearchSpace) -> int:
    depths = triple.feasible_depths(space.buffer_depth)
    return next((d for d in depths if d >= 2), depths[0])


def optimize_tiling(
    problem: TilingProblem,
    *,
    top_k: int = 5,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> TilingResult:
    """Solve ``problem``; ``top_k`` ranked candidates; raises SolverTimeout if none was found.

    When the time limit cuts the solve short, the answer ("timeout") is the best of what was
    found. Rank 1 carries its per-stage events. The paper's model has its own per-triple
    certificate (below); every other model is solved configuration by configuration
    (solver/per_configuration.py).
    """
    check_arguments(top_k, time_limit_s)
    deadline = Deadline(time_limit_s)
    check_mode(problem.space, mode)
    if not isinstance(problem.model, PaperPipeline):
        from solver.per_configuration import optimize_per_configuration  # numpy: worker side

        return optimize_per_configuration(problem, top_k=top_k, deadline=deadline, mode=mode)
    if SolverMode(mode) is SolverMode.CERTIFIED:
        from perfmodel.gemm_ws_scoring import ScoreOverflow

        try:
            return _certified(problem, top_k, deadline)
        except ScoreOverflow:
            # times beyond int64 ns: only the Python-int path represents them
            _log.info("scorer overflow; answering with the Z3 search")
    return _z3_search(problem, top_k, deadline)


def _z3_search(problem: TilingProblem, top_k: int, deadline: Deadline) -> TilingResult:
    """Rank by rank: each rank is Z3's lexicographic optimum with earlier ranks blocked.

    When the time limit cuts the solve short, the answer ("timeout") is the best of what was
    found: the ranks Z3 proved, the configuration it was improving, and the configurations
    the presolve simulated.
    """
    bounds = triple_bounds(
        problem.shape,
        problem.machine,
        problem.space,
        problem.element_bytes,
        problem.wave_model,
        deadline.check,
    )
    summary = summarize(problem.space, bounds)
    survivors, sampled = _presolve(problem, bounds, top_k)
    enc = encode(survivors, problem.space, problem.machine, problem.wave_model)
    solver = make_solver(timeout_ms=deadline.remaining_ms())
    solver.from_string(enc.smtlib)
    objectives = _objectives(enc, problem.space, survivors)

    ranking = rank_by_blocking(
        solver, objectives, deadline.at, min(top_k, summary.feasible), enc.tiling_of, enc.is_tiling
    )
    # Each solve proved the optimum of what earlier ranks left (blocked by z3.Not).
    ranked = [_simulate(problem, t) for t in ranking.found]
    status, checks = ("optimal" if ranking.proven else "timeout"), ranking.checks
    if status == "timeout":
        # Proven ranks sort first (each beats everything it left); the rest is best effort.
        found_tilings = {s.tiling for s in ranked}
        ranked += [s for s in sampled if s.tiling not in found_tilings]
        ranked = sorted(ranked, key=objective_key)[:top_k]
    # Otherwise already in rank order: each solve is the optimum of what earlier ranks left.
    return result_of(
        status,
        ranked,
        summary,
        deadline,
        checks=checks,
        encoded_tile_triples=len(survivors),
        pruned_tile_triples=len(bounds) - len(survivors),
        mode=SolverMode.Z3_SEARCH,
    )


@dataclass(frozen=True, slots=True)
class _Ranking:
    """The exact scorer's best configurations of a space, in the optimizer's order."""

    configs: Configurations
    overall_time_ns: IntArray
    total_math_wait_ns: IntArray
    scored: int
    #: False when the deadline stopped the enumeration: the ranking covers part of the space
    complete: bool


def _score_space(problem: TilingProblem, top_k: int, deadline: float) -> _Ranking:
    """Enumerate the feasible configurations in chunks and keep the ``top_k`` best by the
    exact scorer; the deadline is checked between chunks (the first chunk always runs)."""
    import numpy as np

    from perfmodel import gemm_ws_scoring as scoring
    from perfmodel.gemm_ws_scoring import Configurations

    space, machine = problem.space, problem.machine
    limit = machine.shared_memory_per_block_bytes if space.enforce_shared_memory else None
    figures = scoring.Figures.of_machine(machine)
    kept: Configurations | None = None
    kept_time = kept_wait = np.zeros(0, dtype=np.int64)
    scored, complete = 0, True
    chunks = scoring.enumerate_configurations(
        space.tile_m,
        space.tile_n,
        space.tile_k,
        space.buffer_depth,
        problem.element_bytes,
        limit,
    )
    for chunk in chunks:
        if scored and time.perf_counter() > deadline:
            complete = False
            break
        scores = scoring.score_configurations(problem.shape, chunk, figures, problem.wave_model)
        times, waits = scores.overall_time_ns[0], scores.total_math_wait_ns[0]
        scored += chunk.count
        if chunk.count > top_k:
            # only configurations no slower than the chunk's k-th best can be in the top k
            kth = np.partition(times, top_k - 1)[top_k - 1]
            index = np.flatnonzero(times <= kth)
            chunk, times, waits = chunk.take(index), times[index], waits[index]
        if kept is not None:
            chunk = Configurations(
                *(
                    np.concatenate([getattr(kept, f), getattr(chunk, f)])
                    for f in ("tile_m", "tile_n", "tile_k", "buffer_depth")
                )
            )
            times = np.concatenate([kept_time, times])
            waits = np.concatenate([kept_wait, waits])
        order = scoring.lexicographic_order(times, waits, chunk)[:top_k]
        kept, kept_time, kept_wait = chunk.take(order), times[order], waits[order]
    if kept is None:
        # every candidate breaks the shared-memory limit: summarize() names it
        kept = Configurations.of([], [], [], [])
    return _Ranking(kept, kept_time, kept_wait, scored, complete)


def _certified(problem: TilingProblem, top_k: int, deadline: Deadline) -> TilingResult:
    """The exact scorer's ranking, its best certified by Z3 (see the module docstring)."""
    ranking = _score_space(problem, top_k, deadline.at)
    ranked = [
        _simulate(problem, Tiling(*(int(a[i]) for a in _columns(ranking.configs))))
        for i in range(ranking.configs.count)
    ]
    if ranking.configs.count and not ranking.complete:
        return _result(problem, deadline, "timeout", ranked, ranking, None, None)
    summary_bounds: list[TripleBound] | None = None
    try:
        summary_bounds = triple_bounds(
            problem.shape,
            problem.machine,
            problem.space,
            problem.element_bytes,
            problem.wave_model,
            deadline.check,
        )
    except SolverTimeout:
        if not ranked:
            raise
        return _result(problem, deadline, "timeout", ranked, ranking, None, None)
    summary = summarize(problem.space, summary_bounds)  # raises on an infeasible space
    incumbent = ranked[0]
    for sim, time_ns, wait_ns in zip(
        ranked, ranking.overall_time_ns, ranking.total_math_wait_ns, strict=True
    ):
        if (sim.overall_time_ns, sim.total_math_wait_ns) != (int(time_ns), int(wait_ns)):
            # the stage-by-stage simulator is the reference: a scorer that disagrees is a bug
            raise CertificateMismatch(
                f"scorer gives {int(time_ns)} ns / {int(wait_ns)} ns for {sim.tiling}, the "
                f"simulator {sim.overall_time_ns} ns / {sim.total_math_wait_ns} ns"
            )
    certificate = certify(problem, incumbent, summary_bounds, deadline.at)
    checks = certificate.checks
    if certificate.better is not None:
        message = (
            f"Z3 found {certificate.better} lexicographically better than the scorer's incumbent "
            f"{incumbent.tiling} ({incumbent.overall_time_ns} ns)"
        )
        if _problem.STRICT_CERTIFICATE:
            raise CertificateMismatch(message)
        _log.error("%s; answering with the Z3 search", message)
        result = _z3_search(problem, top_k, deadline)
        stats = result.statistics
        return dataclasses.replace(
            result,
            statistics=dataclasses.replace(
                stats,
                checks=stats.checks + len(checks),
                mode=SolverMode.CERTIFIED,
                configurations_scored=ranking.scored,
                certificate=checks,
                certificate_mismatches=1,
            ),
        )
    proven = bool(checks) and all(c.outcome == "unsat" for c in checks)
    status = "optimal" if proven else "timeout"
    return _result(problem, deadline, status, ranked, ranking, certificate, summary)


def _columns(configs: Configurations) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    return configs.tile_m, configs.tile_n, configs.tile_k, configs.buffer_depth


def _result(
    problem: TilingProblem,
    deadline: Deadline,
    status: str,
    ranked: list[Simulation],
    ranking: _Ranking,
    certificate: Certificate | None,
    summary: SearchSummary | None,
) -> TilingResult:
    if summary is None:
        # cut short before the per-triple bounds: count what the scorer enumerated
        considered = problem.space.size
        feasible = ranking.scored if ranking.complete else considered
        summary = SearchSummary(
            candidates_considered=considered,
            feasible=feasible,
            rejected={"shared_memory_per_block": considered - feasible},
        )
    return certified_result_of(status, ranked, summary, deadline, certificate, ranking.scored)


def certify(
    problem: TilingProblem,
    incumbent: Simulation,
    bounds: list[TripleBound],
    deadline: float,
) -> Certificate:
    """Ask Z3 whether any configuration of the space beats ``incumbent`` lexicographically
    (§3.2 objectives, then the tie-break) over the encoding of eq. (1)-(3); "unsat" proves
    the incumbent optimal.

    Only triples whose lower bound on the overall time (solver/bounds.py, a sound cut
    independent of the scorer) does not exceed the incumbent's time can hold a better
    configuration, so only they are encoded.
    """
    depths = problem.space.buffer_depth
    candidates = [
        b
        for b in bounds
        if b.feasible_depths(depths) and b.overall_time_floor_ns <= incumbent.overall_time_ns
    ]
    text = encode_text(candidates, problem.space, problem.machine, problem.wave_model)
    outcome = "unknown"
    better = None
    if time.perf_counter() < deadline:
        # this thread's Z3 session: the recurrences' text stays asserted in a solver between
        # requests, the problem's facts and the claim are checked in a scope of their own
        answer = session().check(
            text.shared,
            text.specific + "\n" + better_than_smtlib(incumbent),
            timeout_ms=max(1, int((deadline - time.perf_counter()) * 1000)),
        )
        outcome = answer.outcome
        better = Tiling(*answer.tiling) if answer.tiling is not None else None
    check = CertificateCheck(CERTIFICATE_CLAIM, outcome)
    return Certificate((check,), better, len(candidates), len(bounds) - len(candidates))


def better_than_smtlib(incumbent: Simulation) -> str:
    """:func:`better_than` as an SMT-LIB assertion over solver/encoding.py's names (the same
    formula, tests/solver/test_z3_session.py proves them equivalent): parsed with the
    encoding, it builds no Python-side Z3 object."""
    t = incumbent.tiling
    time_ns, wait_ns = incumbent.overall_time_ns, incumbent.total_math_wait_ns
    key = tie_break_key(t.tile_m, t.tile_n, t.tile_k, t.buffer_depth)
    b = _KEY_BASE
    enc_key = (
        f"(+ (* (+ (* (+ (* tile_m {b}) tile_n) {b}) tile_k) {b}) "
        f"(- {MAX_BUFFER_DEPTH} buffer_depth))"
    )
    return (
        f"(assert (or (< overall_time {time_ns}) "
        f"(and (= overall_time {time_ns}) (< total_math_wait {wait_ns})) "
        f"(and (= overall_time {time_ns}) (= total_math_wait {wait_ns}) (> {enc_key} {key}))))"
    )


def _presolve(
    problem: TilingProblem, bounds: list[TripleBound], top_k: int
) -> tuple[list[TripleBound], list[Simulation]]:
    """Branch-and-bound presolve: drop triples that cannot reach the top ``top_k``.

    Simulating ``top_k`` feasible configurations (the triples with the smallest lower bounds,
    at their deepest feasible buffers, since a deeper buffer is never slower) gives an upper
    bound U on the k-th best time; a triple whose lower bound on the overall time exceeds U
    cannot hold any of the k best configurations. Sound whatever the configurations chosen;
    choosing low bounds and deep buffers keeps U tight. Returns the surviving triples and the
    simulated configurations.
    """
    depths = problem.space.buffer_depth
    feasible = [b for b in bounds if b.feasible_depths(depths)]
    feasible.sort(key=lambda b: b.overall_time_floor_ns)
    # One configuration per triple, at its deepest feasible buffer: distinct configurations.
    sampled = [
        _simulate(problem, Tiling(b.tile_m, b.tile_n, b.tile_k, b.feasible_depths(depths)[-1]))
        for b in feasible[:top_k]
    ]
    if len(sampled) < top_k:
        return feasible, sampled
    upper = max(s.overall_time_ns for s in sampled)
    return [b for b in feasible if b.overall_time_floor_ns <= upper], sampled


def _simulate(problem: TilingProblem, tiling: Tiling) -> Simulation:
    return simulate(problem.shape, tiling, problem.machine, problem.wave_model)
