"""Shortlists that explore: the point optimum first, then the configurations most
often fastest when the device's figures are drawn from its posterior (or its priors).

Every feasible configuration of the space is scored under the point figures and under every
draw by the pipeline model's vectorised scorer (the closed form, exact in integer
nanoseconds, property-tested equal to the simulator); the point scores give
the solver's lexicographic order, the draws each candidate's chance of being the fastest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, Unpack

import numpy as np

from perfmodel.belief import FigureBelief
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling
from perfmodel.gemm_ws_scoring import (
    Configurations,
    Figures,
    ScoreOverflow,
    Scores,
    lexicographic_order,
)
from perfmodel.pipeline import PipelineModel
from solver.per_configuration import space_configurations, with_raster
from solver.problem import TilingProblem
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


def feasible_configurations(problem: TilingProblem) -> Configurations | None:
    """Every configuration of the space that fits the shared memory per CTA (when enforced)
    and, under the problem's model, an SM; None above MAX_EXPLORE_CONFIGURATIONS or when
    none does."""
    chunks = []
    count = 0
    for tiles in space_configurations(problem):
        # every (group_m, split_k) of the space, as the certified search ranks them
        for chunk in with_raster(tiles, problem.space, problem.shape.k):
            resident = problem.model.resident(chunk, problem.element_bytes)
            chunk = chunk.take(np.flatnonzero(resident))
            count += chunk.count
            if count > MAX_EXPLORE_CONFIGURATIONS:
                return None
            chunks.append(chunk)
    if not chunks:
        return None
    return Configurations.concat(chunks)


def _figures_with_point(
    machine: GemmWsMachine,
    draws: dict[str, np.typing.NDArray[np.float64]],
    ratios: tuple[float, float],
    count: int,
) -> Figures:
    """The scorer's figures: draw 0 ``machine``'s point figures, then the ``count`` draws:
    each drawn figure (reference-dtype values, its throughputs scaled by ``ratios`` = (load,
    compute) as the request's machine was), the rest ``machine``'s (the scorer validates the
    result)."""
    point = Figures.of_machine(machine)
    fields: dict[str, object] = {"sm_count": point.sm_count}
    for name in Figures.__slots__[1:]:
        value = getattr(point, name)
        scale = ratios[_THROUGHPUTS.index(name)] if name in _THROUGHPUTS else 1.0
        drawn = np.asarray(draws[name] * scale if name in draws else value, dtype=np.float64)
        fields[name] = np.concatenate([[float(value)], np.broadcast_to(drawn, (count,))])
    return Figures(**fields)  # type: ignore[arg-type]


class ExploreOptions(TypedDict, total=False):
    """:func:`explore_scored`'s keyword options, as :func:`explore_problem` passes them on."""

    ratios: tuple[float, float]
    draws: int
    seed: int


def explore_problem(
    problem: TilingProblem,
    belief: FigureBelief,
    top_k: int,
    mode: ShortlistMode,
    **options: Unpack[ExploreOptions],
) -> ExploredShortlist | None:
    """The shortlist of ``problem``'s space under ``belief`` (rank 1: the point optimum);
    None when the space has more than MAX_EXPLORE_CONFIGURATIONS feasible configurations, or a
    draw's times overflow the scorer (figures far beyond any GPU). ``options``: those of
    :func:`explore_scored`."""
    configs = feasible_configurations(problem)
    if configs is None:
        return None
    return explore_scored(
        problem.machine,
        configs,
        scorer(problem.model, problem.shape, configs, problem.element_bytes),
        belief,
        top_k,
        mode,
        **options,
    )


def scorer(
    model: PipelineModel, shape: GemmShape, configs: Configurations, element_bytes: int
) -> Callable[[Figures], Scores]:
    """``model``'s vectorised scorer of ``configs`` (each must fit an SM) under given figures."""
    return lambda figures: model.score(shape, configs, figures, element_bytes)


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
    model's vectorised scorer, :func:`scorer`) at ``machine``'s
    point figures and under ``draws`` draws of ``belief``, as :func:`explore_problem` (an
    explicit candidate list's path calls it directly); None when a draw's times overflow the
    scorer."""
    drawn = belief.draws(np.random.default_rng(seed), draws)
    try:
        # one scorer call: row 0 the point figures, rows 1.. the draws
        scores = score(_figures_with_point(machine, drawn, ratios, draws))
    except ScoreOverflow:
        return None
    point_time, point_wait = scores.overall_time_ns[0], scores.total_math_wait_ns[0]
    order = lexicographic_order(point_time, point_wait, configs)
    chosen: Shortlist = shortlist(
        scores.overall_time_ns[1:], order, top_k, mode, point_times=point_time
    )
    picks = list(chosen.ranked)
    return ExploredShortlist(
        tilings=tuple(configs.take(np.asarray(picks, dtype=np.intp)).tilings()),
        probability_best=tuple(float(chosen.probability_best[c]) for c in picks),
        interval_low_us=tuple(float(chosen.interval_low[c]) / 1000 for c in picks),
        interval_high_us=tuple(float(chosen.interval_high[c]) / 1000 for c in picks),
    )
