"""Shortlists that explore (issue 16): the point optimum first, then the configurations most
often fastest when the device's figures are drawn from its posterior (or its priors).

Every feasible configuration of the space is scored under every draw by the closed form of
the recurrences (docs/model-notes.md GeMM-WS 7; property-tested equal to the simulator):
with L = T_LOAD-A + T_LOAD-B and T = T_MATH of eq. (4)/(6),
``Sm(S) = L + (S - 1) max(L, T)`` (depth >= 2; ``L + T`` per stage at depth 1) and
``time = W (Sm(S) [+ T] + T_EPILOGUE) + T_INIT``. The draws only rank candidates, so they are
scored in floating point; the point order is the solver's exact integer one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.belief import FigureBelief
from perfmodel.gemm_ws import GemmWsMachine, Tiling, WaveTimeModel, us_to_ns
from solver.bounds import TripleBound, triple_bounds
from solver.optimize import TilingProblem, tie_break_key
from solver.shortlist import Shortlist, ShortlistMode, shortlist

#: posterior draws per request: enough for a stable share of wins among a handful of leaders
DRAWS = 128

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Configurations:
    """Every feasible configuration of a space, as arrays (one entry per configuration)."""

    tilings: tuple[Tiling, ...]
    load_a_elements: NDArray[np.int64]
    load_b_elements: NDArray[np.int64]
    macs: NDArray[np.int64]
    stages: NDArray[np.int64]
    waves: NDArray[np.int64]
    buffer_depth: NDArray[np.int64]
    #: the exact point-estimate overall time (integer ns), as the solver computes it
    point_time_ns: NDArray[np.int64]
    #: the solver's lexicographic order under the point estimate (time, wait, tie-break)
    point_order: NDArray[np.intp]


def configurations(
    bounds: Sequence[TripleBound],
    depths: tuple[int, ...],
    machine: GemmWsMachine,
    wave_model: WaveTimeModel,
) -> Configurations:
    """The feasible (triple, depth) pairs of ``bounds`` with their exact point times."""
    rows: list[tuple[int, ...]] = []
    tilings: list[Tiling] = []
    t_epilogue, t_init = us_to_ns(machine.t_epilogue_us), us_to_ns(machine.t_init_us)
    keys = []
    for b in bounds:
        for depth in b.feasible_depths(depths):
            load = b.t_load_a_ns + b.t_load_b_ns
            per_stage = load + b.t_math_ns if depth == 1 else max(load, b.t_math_ns)
            last_math_start = load + (b.stages - 1) * per_stage
            tail = b.t_math_ns if wave_model is WaveTimeModel.INCLUDE_LAST_MATH else 0
            overall = (last_math_start + tail + t_epilogue) * b.waves + t_init
            # eq. (3): MATH of stage i waits for its loads; the total wait telescopes
            # (docs/model-notes.md GeMM-WS 8)
            wait = b.waves * (last_math_start - (b.stages - 1) * b.t_math_ns)
            tiling = Tiling(b.tile_m, b.tile_n, b.tile_k, depth)
            tilings.append(tiling)
            keys.append((overall, wait, -tie_break_key(b.tile_m, b.tile_n, b.tile_k, depth)))
            rows.append(
                (
                    b.tile_m * b.tile_k,
                    b.tile_k * b.tile_n,
                    b.tile_m * b.tile_n * b.tile_k,
                    b.stages,
                    b.waves,
                    depth,
                    overall,
                )
            )
    columns = np.array(rows, dtype=np.int64).reshape(-1, 7)
    order = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.intp)
    return Configurations(
        tilings=tuple(tilings),
        load_a_elements=columns[:, 0],
        load_b_elements=columns[:, 1],
        macs=columns[:, 2],
        stages=columns[:, 3],
        waves=columns[:, 4],
        buffer_depth=columns[:, 5],
        point_time_ns=columns[:, 6],
        point_order=order,
    )


def draw_times_us(
    configs: Configurations,
    figures: Mapping[str, FloatArray],
    machine: GemmWsMachine,
    wave_model: WaveTimeModel,
    ratios: tuple[float, float] = (1.0, 1.0),
) -> FloatArray:
    """Overall time (us) of every configuration under every draw, shape (draws, configs).

    ``figures`` maps GeMM-WS figure names to arrays of draws (reference-dtype values; the
    throughputs are multiplied by ``ratios`` = (load, compute), as the request's machine
    was); a figure not drawn keeps ``machine``'s value.
    """

    def figure(name: str, ratio: float = 1.0) -> FloatArray:
        if name in figures:
            return np.asarray(figures[name], dtype=np.float64)[:, None] * ratio
        return np.array([[float(getattr(machine, name))]])

    load_thr = figure("load_throughput_elements_per_us", ratios[0])
    math_thr = figure("compute_throughput_macs_per_us", ratios[1])
    l_load = figure("load_startup_latency_us")
    l_math = figure("compute_startup_latency_us")
    t_init, t_epilogue = figure("t_init_us"), figure("t_epilogue_us")
    # eq. (4): A then B, each tile with its own startup; eq. (6)
    load = (configs.load_a_elements + configs.load_b_elements) / load_thr + 2 * l_load
    t_math = configs.macs / math_thr + l_math
    serial = configs.buffer_depth == 1
    per_stage = np.where(serial, load + t_math, np.maximum(load, t_math))
    last_math_start = load + (configs.stages - 1) * per_stage
    tail = t_math if wave_model is WaveTimeModel.INCLUDE_LAST_MATH else 0.0
    times: FloatArray = configs.waves * (last_math_start + tail + t_epilogue) + t_init
    return np.broadcast_to(times, (times.shape[0], configs.stages.size)).copy()


@dataclass(frozen=True, slots=True)
class ExploredShortlist:
    tilings: tuple[Tiling, ...]
    probability_best: tuple[float, ...]
    interval_low_us: tuple[float, ...]
    interval_high_us: tuple[float, ...]


def explore(
    configs: Configurations,
    belief: FigureBelief,
    machine: GemmWsMachine,
    wave_model: WaveTimeModel,
    top_k: int,
    mode: ShortlistMode,
    *,
    ratios: tuple[float, float] = (1.0, 1.0),
    draws: int = DRAWS,
    seed: int = 0,
) -> ExploredShortlist:
    """The shortlist of ``configs`` under ``belief`` (rank 1: the point optimum)."""
    times = draw_times_us(
        configs, belief.draws(np.random.default_rng(seed), draws), machine, wave_model, ratios
    )
    chosen: Shortlist = shortlist(times, configs.point_order, top_k, mode)
    picks = list(chosen.ranked)
    return ExploredShortlist(
        tilings=tuple(configs.tilings[c] for c in picks),
        probability_best=tuple(float(chosen.probability_best[c]) for c in picks),
        interval_low_us=tuple(float(chosen.interval_low[c]) for c in picks),
        interval_high_us=tuple(float(chosen.interval_high[c]) for c in picks),
    )


#: the most configurations a request's draws are scored over (128 draws x this many floats
#: stay within ~100 MB and ~50 ms); a larger space answers its exploit shortlist with a note
MAX_EXPLORE_CONFIGURATIONS = 100_000


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
    """:func:`explore` over every feasible configuration of ``problem``'s space; None when
    there are more than MAX_EXPLORE_CONFIGURATIONS of them."""
    bounds = triple_bounds(
        problem.shape, problem.machine, problem.space, problem.element_bytes, problem.wave_model
    )
    depths = problem.space.buffer_depth
    if sum(len(b.feasible_depths(depths)) for b in bounds) > MAX_EXPLORE_CONFIGURATIONS:
        return None
    configs = configurations(bounds, depths, problem.machine, problem.wave_model)
    return explore(
        configs,
        belief,
        problem.machine,
        problem.wave_model,
        top_k,
        mode,
        ratios=ratios,
        draws=draws,
        seed=seed,
    )
