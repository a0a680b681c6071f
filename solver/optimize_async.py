"""The tiling optimizer under the async-copy pipeline variant, proven optimal by Z3.

Same objectives and tie-break as solver/optimize.py (§3.2, lexicographic): overall time, total
MATH wait, then larger tile_m, tile_n, tile_k, smaller depth; ranks by blocking each found
configuration. The presolve evaluates every configuration's time with the O(1) closed form
(perfmodel/gemm_ws_async.py) and encodes only those no slower than the top_k-th: the
others cannot hold a rank. Z3 then proves the order over the encoded (A1)-(A3) arrays.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import z3

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, stage_count, us_to_ns
from perfmodel.gemm_ws_async import (
    AsyncDurationTable,
    AsyncSimulation,
    SmLimits,
    overall_time_async_closed_form_ns,
    simulate_async,
)
from solver.encoding import Encoding
from solver.encoding_async import AsyncConfig, encode_async
from solver.errors import InfeasibleSearchSpace, SolverTimeout
from solver.factory import make_solver, z3_version
from solver.lexicographic import Objective, Ranking, rank_by_blocking
from solver.optimize import SolverMode, SolverStatistics, check_mode, tie_break_key
from solver.search_space import SearchSpace, SearchSummary


@dataclass(frozen=True, slots=True)
class AsyncTilingProblem:
    shape: GemmShape
    machine: GemmWsMachine
    space: SearchSpace
    limits: SmLimits
    element_bytes: int = 2


@dataclass(frozen=True, slots=True)
class AsyncTilingResult:
    """``status`` is "optimal" when Z3 proved every ranked entry, else "timeout"."""

    status: str
    best: AsyncSimulation
    candidates: tuple[AsyncSimulation, ...]
    summary: SearchSummary
    statistics: SolverStatistics


def effective_limits(problem: AsyncTilingProblem) -> SmLimits:
    # Without the shared-memory constraint, only the block/thread/register caps limit residency.
    if problem.space.enforce_shared_memory:
        return problem.limits
    return dataclasses.replace(problem.limits, shared_memory_per_sm_bytes=None)


def optimize_tiling_async(
    problem: AsyncTilingProblem,
    *,
    top_k: int = 5,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> AsyncTilingResult:
    """Solve ``problem``; ``top_k`` ranked candidates; SolverTimeout if none was found.

    ``certified`` (default): the exact vectorised scorer ranks the whole space and one Z3
    check proves its best (solver/certify_async.py, numpy: imported here, in the worker);
    ``z3-search``: :func:`z3_search_async`, Z3 rank by rank.
    """
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    if not time_limit_s > 0:
        raise ValueError("time_limit_s must be positive")
    check_mode(problem.space, mode)
    if SolverMode(mode) is SolverMode.CERTIFIED:
        from perfmodel.gemm_ws_scoring import ScoreOverflow
        from solver.certify_async import optimize_tiling_async_certified

        try:
            return optimize_tiling_async_certified(problem, top_k=top_k, time_limit_s=time_limit_s)
        except ScoreOverflow:
            pass  # times beyond int64 ns: only the Python-int path represents them
    return z3_search_async(problem, top_k=top_k, time_limit_s=time_limit_s)


def z3_search_async(
    problem: AsyncTilingProblem, *, top_k: int = 5, time_limit_s: float = 10.0
) -> AsyncTilingResult:
    """The pure Z3 search: rank by rank, each Z3's lexicographic optimum with earlier ranks
    blocked, over the encoding of the presolve's survivors."""
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    if not time_limit_s > 0:
        raise ValueError("time_limit_s must be positive")
    started = time.perf_counter()
    deadline = started + time_limit_s
    machine, limits = problem.machine, effective_limits(problem)
    tilings = list(problem.space.tilings())
    summary, feasible = _summary(problem, limits, tilings)
    table = AsyncDurationTable(machine)
    times = {
        t: overall_time_async_closed_form_ns(
            problem.shape, t, machine, limits, problem.element_bytes, table
        )
        for t in feasible
    }
    # Presolve: the top_k-th smallest time bounds every rank; ties at it are kept.
    kth = sorted(times.values())[min(top_k, len(times)) - 1]
    survivors = [t for t in feasible if times[t] <= kth]
    sims = {t: _simulate(problem, limits, t, table) for t in survivors}
    configs = [_config(problem, t, table, sims[t]) for t in survivors]
    ranking = rank_encoded(
        configs,
        sims,
        (us_to_ns(machine.t_epilogue_us), us_to_ns(machine.t_init_us)),
        deadline,
        min(top_k, summary.feasible),
    )
    ranked = [sims[t] for t in ranking.found]
    status, checks = ("optimal" if ranking.proven else "timeout"), ranking.checks
    if status == "timeout":
        # Best effort: the presolve's closed-form times order the survivors exactly.
        done = {s.tiling for s in ranked}
        ranked += [sims[t] for t in survivors if t not in done]
        ranked = sorted(ranked, key=objective_key)[:top_k]
    if not ranked:
        raise SolverTimeout(time_limit_s)
    return async_result(
        status,
        ranked,
        summary,
        started,
        checks=checks,
        encoded_tile_triples=len(survivors),
        pruned_tile_triples=summary.feasible - len(survivors),
        mode=SolverMode.Z3_SEARCH,
    )


def async_result(
    status: str,
    ranked: Sequence[AsyncSimulation],
    summary: SearchSummary,
    started: float,
    **statistics: Any,
) -> AsyncTilingResult:
    """The answer in rank order, with the elapsed time since ``started`` and ``statistics``
    (the other SolverStatistics fields)."""
    return AsyncTilingResult(
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


def objective_key(sim: AsyncSimulation) -> tuple[int, int, int]:
    """The solver's lexicographic order, for ordering simulated configurations."""
    t = sim.tiling
    return (
        sim.overall_time_ns,
        sim.total_math_wait_ns,
        -tie_break_key(t.tile_m, t.tile_n, t.tile_k, t.buffer_depth),
    )


def _summary(
    problem: AsyncTilingProblem, limits: SmLimits, tilings: list[Tiling]
) -> tuple[SearchSummary, list[Tiling]]:
    """Count what each shared-memory limit rejects; the feasible tilings; refuse none."""
    per_block = problem.machine.shared_memory_per_block_bytes
    if not problem.space.enforce_shared_memory:
        per_block = None
    feasible, over_block, over_sm = [], 0, 0
    for t in tilings:
        smem = t.shared_memory_bytes(problem.element_bytes)
        if per_block is not None and smem > per_block:
            over_block += 1
        elif limits.ctas_per_sm(smem) < 1:
            over_sm += 1
        else:
            feasible.append(t)
    summary = SearchSummary(
        candidates_considered=len(tilings),
        feasible=len(feasible),
        rejected={"shared_memory_per_block": over_block, "shared_memory_per_sm": over_sm},
    )
    if not feasible:
        raise InfeasibleSearchSpace(
            f"all {len(tilings)} candidates need more shared memory per CTA than the device "
            "allows; allow smaller tiles or buffer depths, or set "
            "search_space.enforce_shared_memory to false",
            summary.rejected,
        )
    return summary, feasible


def _config(
    problem: AsyncTilingProblem, tiling: Tiling, table: AsyncDurationTable, sim: AsyncSimulation
) -> AsyncConfig:
    return AsyncConfig(
        tiling=tiling,
        stages=stage_count(problem.shape, tiling),
        full_waves=sim.full_waves,
        ctas_per_sm=sim.ctas_per_sm,
        partial_wave_ctas=sim.partial_wave_ctas,
        full=table.durations(tiling, sim.ctas_per_sm),
        partial=table.durations(tiling, max(1, sim.partial_wave_ctas)),
    )


#: tie_break_key is below this (four digits of base 2^17), so it is the last digit
_KEY_SPAN = 1 << 68


def rank_encoded(
    configs: Sequence[AsyncConfig],
    sims: dict[Tiling, AsyncSimulation],
    epilogue_and_init_ns: tuple[int, int],
    deadline: float,
    ranks: int,
) -> Ranking[Tiling]:
    """Up to ``ranks`` lexicographic optima among ``configs`` (simulated in ``sims``), each
    found by Z3 over their (A1)-(A3) encoding with the earlier ones blocked."""
    enc = encode_async(configs, *epilogue_and_init_ns)
    solver = make_solver(timeout_ms=max(1, int((deadline - time.perf_counter()) * 1000)))
    solver.from_string(enc.smtlib)
    blocked: set[Tiling] = set()

    def read(model: z3.ModelRef) -> Tiling:
        tiling = enc.tiling_of(model)
        blocked.add(tiling)
        return tiling

    return rank_by_blocking(
        solver, _objectives(enc, sims, blocked), deadline, ranks, read, enc.is_tiling
    )


def _objectives(
    enc: Encoding, sims: dict[Tiling, AsyncSimulation], blocked: set[Tiling]
) -> list[Objective]:
    """§3.2's overall time, then total MATH wait, then the tie-break of solver/optimize.py,
    as ONE integer: (time x WAIT_BASE + wait) x 2^68 + (2^68 - 1 - tie_break_key), with
    WAIT_BASE above every encoded configuration's wait. Minimising it is the lexicographic
    order exactly (each digit stays below its base over the encoded survivors), and proving
    one objective takes a third of the checks of three.

    The probe is the best survivor not yet ranked (earlier ranks are blocked in the solver):
    a first guess only; Z3 still proves "strictly better" unsat.
    """
    wait_base = max(s.total_math_wait_ns for s in sims.values()) + 1

    def rank_value(key: tuple[int, int, int]) -> int:
        overall, wait, negated_tie_break = key
        return (overall * wait_base + wait) * _KEY_SPAN + _KEY_SPAN - 1 + negated_tie_break

    values = {t: rank_value(objective_key(s)) for t, s in sims.items()}

    def probe(_: tuple[int, ...]) -> int | None:
        return min((v for t, v in values.items() if t not in blocked), default=None)

    tie_break = tie_break_key(enc.tile_m, enc.tile_n, enc.tile_k, enc.buffer_depth)
    term = (enc.overall_time_ns * wait_base + enc.total_math_wait_ns) * _KEY_SPAN + (
        _KEY_SPAN - 1 - tie_break
    )
    return [Objective(term, minimize=True, probe=probe)]


def _simulate(
    problem: AsyncTilingProblem, limits: SmLimits, tiling: Tiling, table: AsyncDurationTable
) -> AsyncSimulation:
    return simulate_async(
        problem.shape, tiling, problem.machine, limits, problem.element_bytes, table
    )


__all__ = [
    "AsyncTilingProblem",
    "AsyncTilingResult",
    "objective_key",
    "async_result",
    "effective_limits",
    "optimize_tiling_async",
    "z3_search_async",
]
