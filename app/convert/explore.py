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
from perfmodel.gemm_ws_scoring import Configurations
from solver import SolverMode, TilingProblem, optimize_tiling
from solver.candidates import (
    CandidateProblem,
    CandidateRanking,
    rank_candidates,
)
from solver.explore import (
    DRAWS,
    MAX_EXPLORE_CONFIGURATIONS,
    explore_configurations,
    explore_problem,
)
from solver.shortlist import ShortlistMode


def solve(
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    problem: TilingProblem,
    time_limit_s: float,
) -> Solved:
    """Z3's proven optimum, then the shortlist: in explore mode the configurations most often
    fastest under the device's belief (rank 1 stays Z3's); both modes carry each candidate's
    probability of being fastest and its interval when the space is small enough to draw."""
    mode = ShortlistMode(request.shortlist)
    started = time.perf_counter()
    solver_mode = SolverMode(request.solver)
    # the pure Z3 search pays a solve per rank, which explore would replace; the certified
    # path ranks the whole space at once, so a partial ("timeout") answer keeps its shortlist
    explore_z3 = mode is ShortlistMode.EXPLORE and solver_mode is SolverMode.Z3_SEARCH
    top_k = request.top_k or DEFAULT_TOP_K
    result = optimize_tiling(
        problem, top_k=1 if explore_z3 else top_k, time_limit_s=time_limit_s, mode=solver_mode
    )
    if result.status != "optimal":
        return Solved(result, None)
    kind, belief, ratios = _belief(request, profile, problem.machine)
    picks = None
    if time.perf_counter() - started < time_limit_s:
        picks = explore_problem(problem, belief, top_k, mode, ratios=ratios)
    if picks is None:
        note = f"more than {MAX_EXPLORE_CONFIGURATIONS} feasible configurations, or no time left"
        if explore_z3:
            result = optimize_tiling(
                problem, top_k=top_k, time_limit_s=time_limit_s, mode=solver_mode
            )
        return Solved(result, ShortlistOut(mode=mode.value, belief="none", draws=0, note=note))
    if picks.tilings[0] != result.best.tiling:
        raise AssertionError(f"explore's point optimum {picks.tilings[0]} is not Z3's")
    # the solve simulated its ranks already: only picks beyond them are simulated here
    known = {s.tiling: s for s in result.candidates}
    candidates = tuple(
        known.get(t) or simulate(problem.shape, t, problem.machine, problem.wave_model)
        for t in picks.tilings
    )
    uncertainty = tuple(
        zip(picks.probability_best, picks.interval_low_us, picks.interval_high_us, strict=True)
    )
    return Solved(
        dataclasses.replace(result, best=candidates[0], candidates=candidates),
        ShortlistOut(mode=mode.value, belief=kind, draws=DRAWS),
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
    ranking = rank_candidates(
        problem,
        top_k=1 if explore_z3 else request.top_k,
        time_limit_s=time_limit_s,
        mode=solver_mode,
    )
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
        picks = explore_configurations(
            problem.shape,
            problem.machine,
            problem.wave_model,
            configs,
            belief,
            ranks,
            mode,
            ratios=ratios,
        )
    if picks is None:
        if explore_z3:
            ranking = rank_candidates(
                problem, top_k=request.top_k, time_limit_s=time_limit_s, mode=solver_mode
            )
        note = "no time left, or the drawn figures overflow the scorer"
        shortlist = ShortlistOut(mode=mode.value, belief="none", draws=0, note=note)
        return Solved(ranking.result, shortlist), ranking
    if picks.tilings[0] != result.best.tiling:
        raise AssertionError(f"explore's point optimum {picks.tilings[0]} is not Z3's")
    # the ranking simulated its ranks already; only explored picks beyond them are new
    known = {s.tiling: s for s in result.candidates}
    table = DurationTable(problem.machine)
    candidates = (result.best,) + tuple(
        known.get(t)
        or simulate_closed_form(problem.shape, t, problem.machine, problem.wave_model, table)
        for t in picks.tilings[1:]
    )
    uncertainty = tuple(
        zip(picks.probability_best, picks.interval_low_us, picks.interval_high_us, strict=True)
    )
    solved = Solved(
        dataclasses.replace(result, candidates=candidates),
        ShortlistOut(mode=mode.value, belief=kind, draws=DRAWS),
        uncertainty,
    )
    return solved, ranking
