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
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import z3

from perfmodel.gemm_ws import (
    ELEMENT_BYTES,
    GemmShape,
    GemmWsMachine,
    Simulation,
    Tiling,
    WaveTimeModel,
    simulate,
)
from perfmodel.gemm_ws_async import AsyncSimulation
from solver.bounds import TripleBound, summarize, triple_bounds
from solver.encoding import Encoding, encode, encode_text
from solver.errors import CertificateMismatch, InvalidSearchSpace, SolverTimeout
from solver.factory import make_solver, z3_version
from solver.lexicographic import Objective, rank_by_blocking
from solver.search_space import MAX_BUFFER_DEPTH, SearchSpace, SearchSummary
from solver.z3_session import session

if TYPE_CHECKING:
    # numpy stays out of the service process (tests/test_architecture.py): the scorer is
    # imported where it runs, in the worker
    from perfmodel.gemm_ws_scoring import Configurations, IntArray

_T = TypeVar("_T", int, z3.ArithRef)

__all__ = [
    "ELEMENT_BYTES",
    "MAX_Z3_SEARCH_TILE_TRIPLES",
    "CertificateCheck",
    "SolverMode",
    "TilingProblem",
    "TilingResult",
    "SolverStatistics",
    "optimize_tiling",
]

_log = logging.getLogger(__name__)

#: largest space (tile triples) the pure Z3 search takes: it encodes every triple, and at the
#: 110,592-triple limit its encoding alone outgrows a worker's memory and time (issue 19)
MAX_Z3_SEARCH_TILE_TRIPLES = 4096

#: raise CertificateMismatch instead of answering from Z3's model (set by the test suite: a
#: disagreement between the scorer and the encoding must fail loudly there)
STRICT_CERTIFICATE = False


class SolverMode(StrEnum):
    #: exact scorer over the whole space, then one Z3 certificate check of its best
    CERTIFIED = "certified"
    #: lexicographic Z3 search per rank (the path of releases up to 0.x)
    Z3_SEARCH = "z3-search"


@dataclass(frozen=True, slots=True)
class CertificateCheck:
    """One Z3 check of the certificate: what it asked and what Z3 answered."""

    #: the claim refuted by "unsat", e.g. "lexicographically better than the incumbent"
    claim: str
    #: "unsat" (proven), "sat" (Z3 found a better configuration), "unknown" (out of time)
    outcome: str


@dataclass(frozen=True, slots=True)
class TilingProblem:
    shape: GemmShape
    machine: GemmWsMachine
    space: SearchSpace
    element_bytes: int = 2
    wave_model: WaveTimeModel = WaveTimeModel.PAPER

    def __post_init__(self) -> None:
        if self.element_bytes not in (1, 2, 4, 8):
            raise ValueError("element_bytes must be 1, 2, 4 or 8")


@dataclass(frozen=True, slots=True)
class SolverStatistics:
    elapsed_ms: float
    z3_version: str
    checks: int
    #: tile triples given to Z3 after the bound-based presolve, and those it left out
    encoded_tile_triples: int
    pruned_tile_triples: int
    mode: SolverMode = SolverMode.Z3_SEARCH
    #: configurations the exact scorer evaluated (certified mode)
    configurations_scored: int = 0
    certificate: tuple[CertificateCheck, ...] = ()
    #: 1 when Z3 refuted the scorer's incumbent and the answer came from the Z3 search
    certificate_mismatches: int = 0


@dataclass(frozen=True, slots=True)
class TilingResult:
    """``status`` is "optimal" when Z3 proved every ranked entry, else "timeout"."""

    status: str
    best: Simulation
    candidates: tuple[Simulation, ...]
    summary: SearchSummary
    statistics: SolverStatistics


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


_KEY_BASE = 1 << 17  # > MAX_TILE and > MAX_BUFFER_DEPTH, so the digits never overlap


def tie_break_key(tile_m: _T, tile_n: _T, tile_k: _T, buffer_depth: _T) -> _T:
    """One integer ordering larger tile_m, then larger tile_n, larger tile_k, smaller depth.

    Mixed-radix digits with a base above every allowed value, so maximising the key is the
    four-level lexicographic tie-break in one objective (fewer solver checks).
    """
    return ((tile_m * _KEY_BASE + tile_n) * _KEY_BASE + tile_k) * _KEY_BASE + (
        MAX_BUFFER_DEPTH - buffer_depth
    )


def check_mode(space: SearchSpace, mode: SolverMode) -> None:
    """Refuse a space the mode cannot solve within a worker's means (InvalidSearchSpace)."""
    triples = len(space.tile_m) * len(space.tile_n) * len(space.tile_k)
    if SolverMode(mode) is SolverMode.Z3_SEARCH and triples > MAX_Z3_SEARCH_TILE_TRIPLES:
        raise InvalidSearchSpace(
            "search_space",
            f"{triples} (tile_m, tile_n, tile_k) combinations exceed the z3-search limit of "
            f"{MAX_Z3_SEARCH_TILE_TRIPLES}; use solver 'certified' or coarser ranges",
        )


def optimize_tiling(
    problem: TilingProblem,
    *,
    top_k: int = 5,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> TilingResult:
    """Solve ``problem``; ``top_k`` ranked candidates; raises SolverTimeout if none was found.

    When the time limit cuts the solve short, the answer ("timeout") is the best of what was
    found. Every returned :class:`Simulation` carries its per-stage events.
    """
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    if not time_limit_s > 0:
        raise ValueError("time_limit_s must be positive")
    started = time.perf_counter()
    deadline = started + time_limit_s
    check_mode(problem.space, mode)
    if SolverMode(mode) is SolverMode.CERTIFIED:
        from perfmodel.gemm_ws_scoring import ScoreOverflow

        try:
            return _certified(problem, top_k, time_limit_s, started)
        except ScoreOverflow:
            # times beyond int64 ns: only the Python-int path represents them
            _log.info("scorer overflow; answering with the Z3 search")
    return _z3_search(problem, top_k, time_limit_s, started, deadline)


def _z3_search(
    problem: TilingProblem, top_k: int, time_limit_s: float, started: float, deadline: float
) -> TilingResult:
    """Rank by rank: each rank is Z3's lexicographic optimum with earlier ranks blocked.

    When the time limit cuts the solve short, the answer ("timeout") is the best of what was
    found: the ranks Z3 proved, the configuration it was improving, and the configurations
    the presolve simulated.
    """

    def check_deadline() -> None:
        if time.perf_counter() > deadline:
            raise SolverTimeout(time_limit_s)

    bounds = triple_bounds(
        problem.shape,
        problem.machine,
        problem.space,
        problem.element_bytes,
        problem.wave_model,
        check_deadline,
    )
    summary = summarize(problem.space, bounds)
    survivors, sampled = _presolve(problem, bounds, top_k)
    enc = encode(survivors, problem.space, problem.machine, problem.wave_model)
    solver = make_solver(timeout_ms=max(1, int((deadline - time.perf_counter()) * 1000)))
    solver.from_string(enc.smtlib)
    objectives = _objectives(enc, problem.space, survivors)

    ranking = rank_by_blocking(
        solver, objectives, deadline, min(top_k, summary.feasible), enc.tiling_of, enc.is_tiling
    )
    # Each solve proved the optimum of what earlier ranks left (blocked by z3.Not).
    ranked = [_simulate(problem, t) for t in ranking.found]
    status, checks = ("optimal" if ranking.proven else "timeout"), ranking.checks
    if status == "timeout":
        # Proven ranks sort first (each beats everything it left); the rest is best effort.
        found_tilings = {s.tiling for s in ranked}
        ranked += [s for s in sampled if s.tiling not in found_tilings]
        ranked = sorted(ranked, key=_objective_key)[:top_k]
    # Otherwise already in rank order: each solve is the optimum of what earlier ranks left.
    return _tiling_result(
        status,
        ranked,
        summary,
        started,
        time_limit_s,
        checks=checks,
        encoded_tile_triples=len(survivors),
        pruned_tile_triples=len(bounds) - len(survivors),
        mode=SolverMode.Z3_SEARCH,
    )


def _tiling_result(
    status: str,
    ranked: list[Simulation],
    summary: SearchSummary,
    started: float,
    time_limit_s: float,
    **statistics: Any,
) -> TilingResult:
    """The answer in rank order; SolverTimeout when nothing was found in time."""
    if not ranked:
        raise SolverTimeout(time_limit_s)
    return TilingResult(
        status=status,
        best=ranked[0],
        candidates=tuple(ranked),
        summary=summary,
        statistics=SolverStatistics(
            elapsed_ms=(time.perf_counter() - started) * 1000,
            z3_version=z3_version(),
            **statistics,
        ),
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


def _certified(
    problem: TilingProblem, top_k: int, time_limit_s: float, started: float
) -> TilingResult:
    """The exact scorer's ranking, its best certified by Z3 (see the module docstring)."""
    deadline = started + time_limit_s
    ranking = _score_space(problem, top_k, deadline)
    ranked = [
        _simulate(problem, Tiling(*(int(a[i]) for a in _columns(ranking.configs))))
        for i in range(ranking.configs.count)
    ]
    if ranking.configs.count and not ranking.complete:
        return _result(problem, time_limit_s, "timeout", ranked, started, ranking, None, None)
    summary_bounds: list[TripleBound] | None = None
    try:
        summary_bounds = triple_bounds(
            problem.shape,
            problem.machine,
            problem.space,
            problem.element_bytes,
            problem.wave_model,
            lambda: _check(deadline, time_limit_s),
        )
    except SolverTimeout:
        if not ranked:
            raise
        return _result(problem, time_limit_s, "timeout", ranked, started, ranking, None, None)
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
    certificate = certify(problem, incumbent, summary_bounds, deadline)
    checks = certificate.checks
    if certificate.better is not None:
        message = (
            f"Z3 found {certificate.better} lexicographically better than the scorer's incumbent "
            f"{incumbent.tiling} ({incumbent.overall_time_ns} ns)"
        )
        if STRICT_CERTIFICATE:
            raise CertificateMismatch(message)
        _log.error("%s; answering with the Z3 search", message)
        result = _z3_search(problem, top_k, time_limit_s, started, deadline)
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
    return _result(problem, time_limit_s, status, ranked, started, ranking, certificate, summary)


def _columns(configs: Configurations) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    return configs.tile_m, configs.tile_n, configs.tile_k, configs.buffer_depth


def _check(deadline: float, time_limit_s: float) -> None:
    if time.perf_counter() > deadline:
        raise SolverTimeout(time_limit_s)


def _result(
    problem: TilingProblem,
    time_limit_s: float,
    status: str,
    ranked: list[Simulation],
    started: float,
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
    checks = certificate.checks if certificate is not None else ()
    return _tiling_result(
        status,
        ranked,
        summary,
        started,
        time_limit_s,
        checks=len(checks),
        encoded_tile_triples=certificate.encoded_tile_triples if certificate else 0,
        pruned_tile_triples=certificate.pruned_tile_triples if certificate else 0,
        mode=SolverMode.CERTIFIED,
        configurations_scored=ranking.scored,
        certificate=checks,
    )


#: what the certificate's one check refutes
CERTIFICATE_CLAIM = (
    "some configuration has a smaller overall time, or the same time and a smaller total MATH "
    "wait, or both equal and a better tie-break"
)


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


def better_than(enc: Encoding, incumbent: Simulation | AsyncSimulation) -> z3.BoolRef:
    """The encoded configuration beats ``incumbent`` in the optimizer's lexicographic order."""
    t = incumbent.tiling
    time_ns, wait_ns = incumbent.overall_time_ns, incumbent.total_math_wait_ns
    key = tie_break_key(t.tile_m, t.tile_n, t.tile_k, t.buffer_depth)
    enc_key = tie_break_key(enc.tile_m, enc.tile_n, enc.tile_k, enc.buffer_depth)
    # One check for the whole lexicographic order: strictly faster, or as fast with less MATH
    # wait (§3.2's second objective), or equal on both with a better tie-break key.
    return z3.Or(
        enc.overall_time_ns < time_ns,
        z3.And(enc.overall_time_ns == time_ns, enc.total_math_wait_ns < wait_ns),
        z3.And(
            enc.overall_time_ns == time_ns,
            enc.total_math_wait_ns == wait_ns,
            enc_key > key,
        ),
    )


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


@dataclass(frozen=True, slots=True)
class Certificate:
    checks: tuple[CertificateCheck, ...]
    #: a configuration Z3 found lexicographically better than the incumbent (a bug), or None
    better: Tiling | None
    #: tile triples encoded (bound <= the incumbent's time) and left out
    encoded_tile_triples: int
    pruned_tile_triples: int


def _objective_key(sim: Simulation) -> tuple[int, int, int]:
    """The solver's lexicographic order, for ordering simulated configurations."""
    t = sim.tiling
    tie_break = tie_break_key(t.tile_m, t.tile_n, t.tile_k, t.buffer_depth)
    return (sim.overall_time_ns, sim.total_math_wait_ns, -tie_break)


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
