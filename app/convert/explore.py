"""Worker side of POST /optimize-tiling's shortlist: Z3's proven optimum, then the explore (or
exploit) shortlist under what is believed about the device's figures.

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
from perfmodel.gemm_ws import GemmWsMachine
from perfmodel.gemm_ws_scoring import Configurations
from perfmodel.pipeline import Prediction
from solver import SolverMode, TilingProblem, TilingResult, optimize_tiling
from solver.candidates import rank_candidates
from solver.explore import (
    DRAWS,
    MAX_EXPLORE_CONFIGURATIONS,
    ExploredShortlist,
    explore_problem,
    explore_scored,
    scorer,
)
from solver.problem import CandidateProblem, CandidateRanking
from solver.shortlist import ShortlistMode


def solve(
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    problem: TilingProblem,
    time_limit_s: float,
) -> Solved:
    """Z3's proven optimum, then the shortlist: in explore mode the configurations most often
    fastest under the device's belief (rank 1 stays Z3's); both modes carry each candidate's
    probability of being fastest and its interval when the space is small enough to draw.
    The same steps under every pipeline model (``problem.model``: its scorer, its closed form)."""
    mode = ShortlistMode(request.shortlist)
    started = time.perf_counter()
    solver_mode = SolverMode(request.solver)
    # the pure Z3 search pays a solve per rank, which explore would replace; the certified
    # path ranks the whole space at once, so a partial ("timeout") answer keeps its shortlist
    explore_z3 = mode is ShortlistMode.EXPLORE and solver_mode is SolverMode.Z3_SEARCH
    top_k = request.top_k or DEFAULT_TOP_K

    def optimize(ranks: int) -> TilingResult:
        return optimize_tiling(problem, top_k=ranks, time_limit_s=time_limit_s, mode=solver_mode)

    result = optimize(1 if explore_z3 else top_k)
    if result.status != "optimal":
        return Solved(result, None)
    kind, belief, ratios = _belief(request, profile, problem.machine)
    picks = None
    if time.perf_counter() - started < time_limit_s:
        picks = explore_problem(problem, belief, top_k, mode, ratios=ratios)
    if picks is None:
        note = f"more than {MAX_EXPLORE_CONFIGURATIONS} feasible configurations, or no time left"
        if explore_z3:
            result = optimize(top_k)
        return Solved(result, ShortlistOut(mode=mode.value, belief="none", draws=0, note=note))
    shortlist = ShortlistOut(mode=mode.value, belief=kind, draws=DRAWS)
    return _with_picks(problem, result, picks, shortlist)


def _with_picks(
    problem: TilingProblem | CandidateProblem,
    result: TilingResult,
    picks: ExploredShortlist,
    shortlist: ShortlistOut,
) -> Solved:
    """``result`` with the shortlist's picks as its candidates: rank 1 is the certified
    optimum (with its events), the solve's own ranks are reused, the others predicted in
    O(1) by the model's closed form."""
    if picks.tilings[0] != result.best.tiling:
        raise AssertionError(f"explore's point optimum {picks.tilings[0]} is not Z3's")
    uncertainty = tuple(
        zip(picks.probability_best, picks.interval_low_us, picks.interval_high_us, strict=True)
    )
    model, known = problem.model, {s.tiling: s for s in result.candidates}
    candidates: tuple[Prediction, ...] = (result.best,) + tuple(
        known.get(t) or model.closed_form(problem.shape, t, problem.machine, problem.element_bytes)
        for t in picks.tilings[1:]
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


def solve_candidates(
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    problem: CandidateProblem,
    time_limit_s: float,
) -> tuple[Solved, CandidateRanking]:
    """The candidate list's ranking (rank 1 proven by Z3), then the shortlist as for a space:
    explore or exploit over the feasible distinct candidates, each with its probability of
    being the fastest and its interval under the device's belief."""
    mode = ShortlistMode(request.shortlist)
    started = time.perf_counter()
    solver_mode = SolverMode(request.solver)
    # the pure Z3 search pays a solve per rank, which explore would replace
    explore_z3 = mode is ShortlistMode.EXPLORE and solver_mode is SolverMode.Z3_SEARCH

    def rank(top_k: int | None) -> CandidateRanking:
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
        configs = Configurations.of_tilings(feasible)
        score = scorer(problem.model, problem.shape, configs, problem.element_bytes)
        picks = explore_scored(problem.machine, configs, score, belief, ranks, mode, ratios=ratios)
    if picks is None:
        if explore_z3:
            ranking = rank(request.top_k)
        note = "no time left, or the drawn figures overflow the scorer"
        shortlist = ShortlistOut(mode=mode.value, belief="none", draws=0, note=note)
        return Solved(ranking.result, shortlist), ranking
    shortlist = ShortlistOut(mode=mode.value, belief=kind, draws=DRAWS)
    return _with_picks(problem, result, picks, shortlist), ranking
