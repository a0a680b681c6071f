"""Worker side of POST /optimize-tiling's shortlist: Z3's proven optimum, then the explore (or
exploit) shortlist under what is believed about the device's figures (issue 16).

Worker-only: it draws with numpy (perfmodel.belief, solver.explore), which the service's own
process never loads; app/jobs.py imports it inside the optimize job.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

from app.convert.beliefs import gemm_ws_belief
from app.convert.optimize import Solved, dtype_ratios, gemm_ws_machine
from app.schemas.optimize import DEFAULT_TOP_K, OptimizeTilingRequest, ShortlistOut
from device_profiles import DeviceProfile
from perfmodel.belief import FigureBelief
from perfmodel.gemm_ws import DurationTable, GemmWsMachine, simulate, simulate_closed_form
from perfmodel.gemm_ws_async import AsyncDurationTable, simulate_async_closed_form
from perfmodel.gemm_ws_scoring import Configurations
from solver import SolverMode, TilingProblem, TilingResult, optimize_tiling
from solver.candidates import (
    CandidateProblem,
    CandidateRanking,
    rank_candidates,
)
from solver.candidates_async import (
    AsyncCandidateProblem,
    AsyncCandidateRanking,
    rank_candidates_async,
)
from solver.explore import (
    DRAWS,
    MAX_EXPLORE_CONFIGURATIONS,
    async_scorer,
    explore_async_problem,
    explore_problem,
    explore_scored,
    paper_scorer,
)
from solver.optimize_async import (
    AsyncTilingProblem,
    AsyncTilingResult,
    effective_limits,
    optimize_tiling_async,
)
from solver.shortlist import ShortlistMode


def solve(
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    problem: TilingProblem | AsyncTilingProblem,
    time_limit_s: float,
) -> Solved:
    """Z3's proven optimum, then the shortlist: in explore mode the configurations most often
    fastest under the device's belief (rank 1 stays Z3's); both modes carry each candidate's
    probability of being fastest and its interval when the space is small enough to draw.
    Either pipeline model: ``problem``'s type says which (the same steps, its own scorer)."""
    mode = ShortlistMode(request.shortlist)
    started = time.perf_counter()
    solver_mode = SolverMode(request.solver)
    # the pure Z3 search pays a solve per rank, which explore would replace; the certified
    # path ranks the whole space at once, so a partial ("timeout") answer keeps its shortlist
    explore_z3 = mode is ShortlistMode.EXPLORE and solver_mode is SolverMode.Z3_SEARCH
    top_k = request.top_k or DEFAULT_TOP_K

    def optimize(ranks: int) -> TilingResult | AsyncTilingResult:
        if isinstance(problem, AsyncTilingProblem):
            return optimize_tiling_async(
                problem, top_k=ranks, time_limit_s=time_limit_s, mode=solver_mode
            )
        return optimize_tiling(problem, top_k=ranks, time_limit_s=time_limit_s, mode=solver_mode)

    result = optimize(1 if explore_z3 else top_k)
    if result.status != "optimal":
        return Solved(result, None)
    kind, belief, ratios = _belief(request, profile, problem.machine)
    picks = None
    if time.perf_counter() - started < time_limit_s:
        if isinstance(problem, AsyncTilingProblem):
            picks = explore_async_problem(problem, belief, top_k, mode, ratios=ratios)
        else:
            picks = explore_problem(problem, belief, top_k, mode, ratios=ratios)
    if picks is None:
        note = f"more than {MAX_EXPLORE_CONFIGURATIONS} feasible configurations, or no time left"
        if explore_z3:
            result = optimize(top_k)
        return Solved(result, ShortlistOut(mode=mode.value, belief="none", draws=0, note=note))
    if picks.tilings[0] != result.best.tiling:
        raise AssertionError(f"explore's point optimum {picks.tilings[0]} is not Z3's")
    uncertainty = tuple(
        zip(picks.probability_best, picks.interval_low_us, picks.interval_high_us, strict=True)
    )
    shortlist = ShortlistOut(mode=mode.value, belief=kind, draws=DRAWS)
    if isinstance(problem, AsyncTilingProblem) and isinstance(result, AsyncTilingResult):
        limits = effective_limits(problem)
        table = AsyncDurationTable(problem.machine)
        # rank 1 is the certified optimum (with its events); the others in O(1)
        known_ranked = {s.tiling: s for s in result.candidates}
        sims = (result.best,) + tuple(
            known_ranked.get(t)
            or simulate_async_closed_form(
                problem.shape, t, problem.machine, limits, problem.element_bytes, table
            )
            for t in picks.tilings[1:]
        )
        return Solved(
            dataclasses.replace(result, best=sims[0], candidates=sims), shortlist, uncertainty
        )
    assert isinstance(problem, TilingProblem) and isinstance(result, TilingResult)
    # the solve simulated its ranks already: only picks beyond them are simulated here
    known = {s.tiling: s for s in result.candidates}
    candidates = tuple(
        known.get(t) or simulate(problem.shape, t, problem.machine, problem.wave_model)
        for t in picks.tilings
    )
    return Solved(
        dataclasses.replace(result, best=candidates[0], candidates=candidates),
        shortlist,
        uncertainty,
    )


def _belief(
    request: OptimizeTilingRequest, profile: DeviceProfile | None, machine: GemmWsMachine
) -> tuple[Literal["calibration", "priors"], FigureBelief, tuple[float, float]]:
    """What is believed about the device's figures, and the (load, compute) ratios that scale
    its drawn throughputs to the request's dtype: the belief is about the reference (fp16)
    figures, and draws are scaled as the request's ``machine`` was."""
    ratios, reference = (1.0, 1.0), machine
    if profile is not None:
        ratios, reference = dtype_ratios(profile, request.dtype), gemm_ws_machine(profile)
    kind, belief = gemm_ws_belief(profile, reference)
    return kind, belief, ratios


# --- explicit candidate lists (issue 18) ---------------------------------------------------


def solve_candidates(
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    problem: CandidateProblem | AsyncCandidateProblem,
    time_limit_s: float,
) -> tuple[Solved, CandidateRanking | AsyncCandidateRanking]:
    """The candidate list's ranking (rank 1 proven by Z3), then the shortlist as for a space:
    explore or exploit over the feasible distinct candidates, each with its probability of
    being the fastest and its interval under the device's belief (either pipeline model)."""
    mode = ShortlistMode(request.shortlist)
    started = time.perf_counter()
    solver_mode = SolverMode(request.solver)
    # the pure Z3 search pays a solve per rank, which explore would replace
    explore_z3 = mode is ShortlistMode.EXPLORE and solver_mode is SolverMode.Z3_SEARCH

    def rank(top_k: int | None) -> CandidateRanking | AsyncCandidateRanking:
        if isinstance(problem, AsyncCandidateProblem):
            return rank_candidates_async(
                problem, top_k=top_k, time_limit_s=time_limit_s, mode=solver_mode
            )
        return rank_candidates(problem, top_k=top_k, time_limit_s=time_limit_s, mode=solver_mode)

    ranking = rank(1 if explore_z3 else request.top_k)
    result = ranking.result
    if result.status != "optimal":
        return Solved(result, None), ranking
    kind, belief, ratios = _belief(request, profile, problem.machine)
    feasible = list(ranking.members)
    ranks = len(feasible) if request.top_k is None else min(request.top_k, len(feasible))
    picks = None
    if time.perf_counter() - started < time_limit_s:
        configs = Configurations.of(
            *([getattr(t, f) for t in feasible] for f in Configurations.__slots__)
        )
        score = (
            async_scorer(problem.shape, configs, problem.effective_limits, problem.element_bytes)
            if isinstance(problem, AsyncCandidateProblem)
            else paper_scorer(problem.shape, configs, problem.wave_model)
        )
        picks = explore_scored(problem.machine, configs, score, belief, ranks, mode, ratios=ratios)
    if picks is None:
        if explore_z3:
            ranking = rank(request.top_k)
        note = "no time left, or the drawn figures overflow the scorer"
        shortlist = ShortlistOut(mode=mode.value, belief="none", draws=0, note=note)
        return Solved(ranking.result, shortlist), ranking
    if picks.tilings[0] != result.best.tiling:
        raise AssertionError(f"explore's point optimum {picks.tilings[0]} is not Z3's")
    uncertainty = tuple(
        zip(picks.probability_best, picks.interval_low_us, picks.interval_high_us, strict=True)
    )
    shortlist = ShortlistOut(mode=mode.value, belief=kind, draws=DRAWS)
    if isinstance(problem, AsyncCandidateProblem) and isinstance(result, AsyncTilingResult):
        # the ranking simulated its ranks already; only explored picks beyond them are new
        known_async = {s.tiling: s for s in result.candidates}
        limits, table_async = problem.effective_limits, AsyncDurationTable(problem.machine)
        async_candidates = (result.best,) + tuple(
            known_async.get(t)
            or simulate_async_closed_form(
                problem.shape, t, problem.machine, limits, problem.element_bytes, table_async
            )
            for t in picks.tilings[1:]
        )
        solved = Solved(
            dataclasses.replace(result, candidates=async_candidates), shortlist, uncertainty
        )
        return solved, ranking
    assert isinstance(problem, CandidateProblem) and isinstance(result, TilingResult)
    known = {s.tiling: s for s in result.candidates}
    table = DurationTable(problem.machine)
    candidates = (result.best,) + tuple(
        known.get(t)
        or simulate_closed_form(problem.shape, t, problem.machine, problem.wave_model, table)
        for t in picks.tilings[1:]
    )
    solved = Solved(dataclasses.replace(result, candidates=candidates), shortlist, uncertainty)
    return solved, ranking
