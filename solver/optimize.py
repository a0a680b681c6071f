"""Find the GeMM-WS tiling with the smallest predicted time, proven optimal by Z3.

Objectives (§3.2), lexicographic: (1) overall execution time, (2) total MATH wait; then a
deterministic tie-break: larger tile_m, larger tile_n, larger tile_k, smaller buffer_depth.
The shortlist is found by solving again with each found configuration blocked, so rank r is the
proven optimum of the space minus ranks 1..r-1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

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
from solver.bounds import TripleBound, summarize, triple_bounds
from solver.encoding import Encoding, encode
from solver.errors import SolverTimeout
from solver.factory import make_solver, z3_version
from solver.lexicographic import Objective, rank_by_blocking
from solver.search_space import MAX_BUFFER_DEPTH, SearchSpace, SearchSummary

_T = TypeVar("_T", int, z3.ArithRef)

__all__ = ["ELEMENT_BYTES", "TilingProblem", "TilingResult", "SolverStatistics", "optimize_tiling"]


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


def optimize_tiling(
    problem: TilingProblem,
    *,
    top_k: int = 5,
    time_limit_s: float = 10.0,
) -> TilingResult:
    """Solve ``problem``; ``top_k`` ranked candidates; raises SolverTimeout if none was found.

    When the time limit cuts the solve short, the answer ("timeout") is the best of what was
    found: the ranks Z3 proved, the configuration it was improving, and the configurations
    the presolve simulated. Every returned :class:`Simulation` carries its per-stage events.
    """
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    if not time_limit_s > 0:
        raise ValueError("time_limit_s must be positive")
    started = time.perf_counter()
    deadline = started + time_limit_s

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
    solver.add(enc.constraints)
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
    if not ranked:
        raise SolverTimeout(time_limit_s)
    # Otherwise already in rank order: each solve is the optimum of what earlier ranks left.
    elapsed_ms = (time.perf_counter() - started) * 1000
    return TilingResult(
        status=status,
        best=ranked[0],
        candidates=tuple(ranked),
        summary=summary,
        statistics=SolverStatistics(
            elapsed_ms=elapsed_ms,
            z3_version=z3_version(),
            checks=checks,
            encoded_tile_triples=len(survivors),
            pruned_tile_triples=len(bounds) - len(survivors),
        ),
    )


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
