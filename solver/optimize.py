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
from solver.lexicographic import Objective, lexicographic_optimum
from solver.search_space import MAX_BUFFER_DEPTH, SearchSpace, SearchSummary

_T = TypeVar("_T", int, z3.ArithRef)

ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


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


def _objectives(enc: Encoding, space: SearchSpace) -> list[Objective]:
    """§3.2's two objectives, then the tie-break, in lexicographic priority order.

    Probes: the overall-time floor of the cuts, and each tie-break's best value in its domain.
    """
    return [
        Objective(enc.overall_time_ns, minimize=True, probe=enc.overall_time_floor_ns),
        Objective(enc.total_math_wait_ns, minimize=True),
        Objective(
            tie_break_key(enc.tile_m, enc.tile_n, enc.tile_k, enc.buffer_depth),
            minimize=False,
            probe=tie_break_key(
                space.tile_m[-1], space.tile_n[-1], space.tile_k[-1], space.buffer_depth[0]
            ),
        ),
    ]


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

    Every returned :class:`Simulation` carries its per-stage events; the caller decides
    whether to show them.
    """
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    if not time_limit_s > 0:
        raise ValueError("time_limit_s must be positive")
    started = time.perf_counter()
    deadline = started + time_limit_s
    bounds = triple_bounds(
        problem.shape, problem.machine, problem.space, problem.element_bytes, problem.wave_model
    )
    summary = summarize(problem.space, bounds)
    survivors = _presolve(problem, bounds, top_k)
    enc = encode(survivors, problem.space, problem.machine, problem.wave_model)
    solver = make_solver(timeout_ms=max(1, int((deadline - time.perf_counter()) * 1000)))
    solver.add(enc.constraints)
    objectives = _objectives(enc, problem.space)

    ranked: list[Simulation] = []
    status = "optimal"
    checks = 0
    for _ in range(min(top_k, summary.feasible)):
        found = lexicographic_optimum(solver, objectives, deadline)
        checks += found.checks
        if found.model is not None:
            tiling = enc.tiling_of(found.model)
            ranked.append(_simulate(problem, tiling))
            # Block this configuration; the next solve proves the next rank.
            solver.add(z3.Not(enc.is_tiling(tiling)))
        if not found.proven:
            status = "timeout"
            break
        if found.model is None:
            break
    if not ranked:
        raise SolverTimeout(time_limit_s)
    # Already in rank order: each solve is the optimum of what earlier ranks left.
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


def _presolve(problem: TilingProblem, bounds: list[TripleBound], top_k: int) -> list[TripleBound]:
    """Branch-and-bound presolve: drop triples that cannot reach the top ``top_k``.

    Simulating ``top_k`` feasible configurations (the triples with the smallest lower bounds,
    at their smallest feasible depths) gives an upper bound U on the k-th best time; a triple
    whose lower bound on the overall time exceeds U cannot hold any of the k best
    configurations. Sound whatever the configurations chosen; choosing low bounds keeps U tight.
    """
    depths = problem.space.buffer_depth
    feasible = [b for b in bounds if b.feasible_depths(depths)]
    feasible.sort(key=lambda b: b.overall_time_floor_ns)
    upper: int | None = None
    sampled = 0
    for bound in feasible:
        for depth in bound.feasible_depths(depths):
            tiling = Tiling(bound.tile_m, bound.tile_n, bound.tile_k, depth)
            time_ns = _simulate(problem, tiling).overall_time_ns
            upper = time_ns if upper is None else max(upper, time_ns)
            sampled += 1
            if sampled == top_k:
                break
        if sampled == top_k:
            break
    assert upper is not None  # summarize() refused spaces without a feasible candidate
    if sampled < top_k:
        return feasible
    return [b for b in feasible if b.overall_time_floor_ns <= upper]


def _simulate(problem: TilingProblem, tiling: Tiling) -> Simulation:
    return simulate(problem.shape, tiling, problem.machine, problem.wave_model)
