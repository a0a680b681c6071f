"""Shortlists that explore (issue 16): the point optimum first, then the configurations most
often fastest when the device's figures are drawn from its posterior (or its priors).

Every feasible configuration of the space is scored under the point figures and under every
draw by the one vectorised scorer (perfmodel/gemm_ws_scoring.py: the closed form of eq. (1)-(3),
exact in integer nanoseconds, property-tested equal to the simulator); the point scores give
the solver's lexicographic order, the draws each candidate's chance of being the fastest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmodel.belief import FigureBelief
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, WaveTimeModel
from perfmodel.gemm_ws_async import SmLimits
from perfmodel.gemm_ws_async_array import ctas_per_sm_array, score_async_configurations
from perfmodel.gemm_ws_scoring import (
    Configurations,
    Figures,
    ScoreOverflow,
    Scores,
    enumerate_configurations,
    lexicographic_order,
    score_configurations,
)
from solver.optimize import TilingProblem
from solver.optimize_async import AsyncTilingProblem, effective_limits
from solver.search_space import SearchSpace
from solver.shortlist import Shortlist, ShortlistMode, shortlist

#: posterior draws per request: enough for a stable share of wins among a handful of leaders
DRAWS = 128
#: the most configurations a request's draws are scored over (128 draws x this many int64
#: stay within ~100 MB and ~100 ms); a larger space answers its exploit shortlist with a note
MAX_EXPLORE_CONFIGURATIONS = 100_000
#: the figures a belief may cover: the six calibratable ones of §2.2
_THROUGHPUTS = ("load_throughput_elements_per_us", "compute_throughput_macs_per_us")


@dataclass(frozen=True, slots=True)
class ExploredShortlist:
    tilings: tuple[Tiling, ...]
    probability_best: tuple[float, ...]
    interval_low_us: tuple[float, ...]
    interval_high_us: tuple[float, ...]


def _feasible(problem: TilingProblem) -> Configurations | None:
    """Every feasible configuration of the space, or None above MAX_EXPLORE_CONFIGURATIONS."""
    space = problem.space
    limit = problem.machine.shared_memory_per_block_bytes if space.enforce_shared_memory else None
    return _feasible_configurations(space, problem.element_bytes, limit, None)


def _feasible_configurations(
    space: SearchSpace, element_bytes: int, per_block: int | None, limits: SmLimits | None
) -> Configurations | None:
    """The space's configurations that fit ``per_block`` bytes per CTA (None: no limit) and,
    given ``limits``, an SM; None above MAX_EXPLORE_CONFIGURATIONS or when none does."""
    chunks = []
    count = 0
    for chunk in enumerate_configurations(
        space.tile_m, space.tile_n, space.tile_k, space.buffer_depth, element_bytes, per_block
    ):
        if limits is not None:
            chunk = chunk.take(np.flatnonzero(ctas_per_sm_array(limits, element_bytes, chunk) >= 1))
        count += chunk.count
        if count > MAX_EXPLORE_CONFIGURATIONS:
            return None
        chunks.append(chunk)
    if not chunks:
        return None
    return Configurations(
        *(np.concatenate([getattr(c, f) for c in chunks]) for f in Configurations.__slots__)
    )


def drawn_figures(
    machine: GemmWsMachine,
    draws: dict[str, np.typing.NDArray[np.float64]],
    ratios: tuple[float, float],
) -> Figures:
    """The scorer's figures: each drawn one (reference-dtype values, its throughputs scaled by
    ``ratios`` = (load, compute) as the request's machine was), the rest ``machine``'s."""
    point = Figures.of_machine(machine)
    values: dict[str, object] = {}
    for name, drawn in draws.items():
        scale = ratios[_THROUGHPUTS.index(name)] if name in _THROUGHPUTS else 1.0
        values[name] = drawn * scale
    fields = {f: values.get(f, getattr(point, f)) for f in Figures.__slots__}
    return Figures(**fields)  # type: ignore[arg-type]


def _with_point(machine: GemmWsMachine, figures: Figures, count: int) -> Figures:
    """``figures`` (each a scalar or ``count`` draws) with ``machine``'s point figures
    prepended as draw 0 (the scorer validates the result)."""
    point = Figures.of_machine(machine)
    fields: dict[str, object] = {"sm_count": figures.sm_count}
    for name in Figures.__slots__[1:]:
        drawn = np.broadcast_to(np.asarray(getattr(figures, name), dtype=np.float64), (count,))
        fields[name] = np.concatenate([[float(getattr(point, name))], drawn])
    return Figures(**fields)  # type: ignore[arg-type]


def explore_problem(
    problem: TilingProblem,
    belief: FigureBelief,
    top_k: int,
    mode: ShortlistMode,
    *,
    ratios: tuple[float, float] = (1.0, 1.0),
    draws: int = DRAWS,
    seed: int = 0,
) -> ExploredShortlist | None:
    """The shortlist of ``problem``'s space under ``belief`` (rank 1: the point optimum);
    None when the space has more than MAX_EXPLORE_CONFIGURATIONS feasible configurations, or a
    draw's times overflow the scorer (figures far beyond any GPU)."""
    configs = _feasible(problem)
    if configs is None:
        return None
    return explore_scored(
        problem.machine,
        configs,
        paper_scorer(problem.shape, configs, problem.wave_model),
        belief,
        top_k,
        mode,
        ratios=ratios,
        draws=draws,
        seed=seed,
    )


def paper_scorer(
    shape: GemmShape, configs: Configurations, wave_model: WaveTimeModel
) -> Callable[[Figures], Scores]:
    """The paper model's vectorised scorer of ``configs`` (eq. (1)-(3)) under given figures."""
    return lambda figures: score_configurations(shape, configs, figures, wave_model)


def async_scorer(
    shape: GemmShape, configs: Configurations, limits: SmLimits, element_bytes: int
) -> Callable[[Figures], Scores]:
    """The async-copy variant's vectorised scorer of ``configs`` (each must fit an SM)."""
    return lambda figures: score_async_configurations(
        shape, configs, figures, limits, element_bytes
    )


def explore_async_problem(
    problem: AsyncTilingProblem,
    belief: FigureBelief,
    top_k: int,
    mode: ShortlistMode,
    *,
    ratios: tuple[float, float] = (1.0, 1.0),
    draws: int = DRAWS,
    seed: int = 0,
) -> ExploredShortlist | None:
    """:func:`explore_problem` under the async-copy variant: every configuration of the space
    that fits a CTA and an SM, scored by the async closed form (point figures and draws)."""
    space, limits = problem.space, effective_limits(problem)
    per_block = problem.machine.shared_memory_per_block_bytes
    configs = _feasible_configurations(
        space, problem.element_bytes, per_block if space.enforce_shared_memory else None, limits
    )
    if configs is None:
        return None
    return explore_scored(
        problem.machine,
        configs,
        async_scorer(problem.shape, configs, limits, problem.element_bytes),
        belief,
        top_k,
        mode,
        ratios=ratios,
        draws=draws,
        seed=seed,
    )


def explore_scored(
    machine: GemmWsMachine,
    configs: Configurations,
    score: Callable[[Figures], Scores],
    belief: FigureBelief,
    top_k: int,
    mode: ShortlistMode,
    *,
    ratios: tuple[float, float] = (1.0, 1.0),
    draws: int = DRAWS,
    seed: int = 0,
) -> ExploredShortlist | None:
    """The shortlist of ``configs`` (distinct, feasible) scored by ``score`` (a pipeline
    model's vectorised scorer: :func:`paper_scorer`, :func:`async_scorer`) at ``machine``'s
    point figures and under ``draws`` draws of ``belief``, as :func:`explore_problem` (an
    explicit candidate list's path calls it directly); None when a draw's times overflow the
    scorer."""
    figures = drawn_figures(machine, belief.draws(np.random.default_rng(seed), draws), ratios)
    try:
        # one scorer call: row 0 the point figures, rows 1.. the draws
        scores = score(_with_point(machine, figures, draws))
    except ScoreOverflow:
        return None
    point_time, point_wait = scores.overall_time_ns[0], scores.total_math_wait_ns[0]
    order = lexicographic_order(point_time, point_wait, configs)
    chosen: Shortlist = shortlist(
        scores.overall_time_ns[1:], order, top_k, mode, point_times=point_time
    )
    picks = list(chosen.ranked)
    return ExploredShortlist(
        tilings=tuple(
            Tiling(
                int(configs.tile_m[c]),
                int(configs.tile_n[c]),
                int(configs.tile_k[c]),
                int(configs.buffer_depth[c]),
            )
            for c in picks
        ),
        probability_best=tuple(float(chosen.probability_best[c]) for c in picks),
        interval_low_us=tuple(float(chosen.interval_low[c]) / 1000 for c in picks),
        interval_high_us=tuple(float(chosen.interval_high[c]) / 1000 for c in picks),
    )
