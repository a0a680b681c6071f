"""Per-tile-triple durations and lower bounds ("cuts") implied by eq. (1)-(3).

For a triple (TM, TN, TK) with L = T_LOAD-A + T_LOAD-B, T = T_MATH and S stages:

* eq. (3) chains ``Sm(i) >= Sm(i-1) + T`` and ``Sm(1) >= Sb(1) + T_LOAD-B >= L``, so
  ``Sm(S) >= L + (S-1) T``;
* eq. (1)-(2) chain the DMA warp (``Sa(i) >= Sb(i-1) + T_LOAD-B``, ``Sb(i) >= Sa(i) + T_LOAD-A``),
  so ``Sm(S) >= Sb(S) + T_LOAD-B >= S L``.

These hold for every solution of the recurrences at every buffer depth, so they are sound
lower bounds on the overall time and the MATH wait whether or not they are tight. When the
shared-memory limit leaves a triple only buffer depth 1, eq. (1) with depth 1 adds
``Sa(i) >= Sm(i-1) + T``: load and MATH serialise and ``Sm(S) >= L + (S-1)(L + T)``.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from perfmodel.gemm_ws import (
    GemmShape,
    GemmWsMachine,
    Tiling,
    WaveTimeModel,
    stage_buffer_bytes,
    stage_count,
    us_to_ns,
    wave_count,
)
from perfmodel.pipelines.paper import duration_table
from solver.search_space import SearchSpace


@dataclass(frozen=True, slots=True)
class TripleBound:
    tile_m: int
    tile_n: int
    tile_k: int
    t_load_a_ns: int
    t_load_b_ns: int
    t_math_ns: int
    waves: int
    stages: int
    #: deepest buffer that fits the shared-memory limit (None: no limit applies)
    max_buffer_depth: int | None
    last_math_start_floor_ns: int
    overall_time_floor_ns: int
    total_math_wait_floor_ns: int


def triple_bounds(
    shape: GemmShape,
    machine: GemmWsMachine,
    space: SearchSpace,
    element_bytes: int,
    wave_model: WaveTimeModel,
) -> list[TripleBound]:
    """Bounds for every (TM, TN, TK) of ``space``."""
    table = duration_table(machine)
    limit = machine.shared_memory_per_block_bytes if space.enforce_shared_memory else None
    t_epilogue = us_to_ns(machine.t_epilogue_us)
    t_init = us_to_ns(machine.t_init_us)
    include_last_math = wave_model is WaveTimeModel.INCLUDE_LAST_MATH
    depths = space.buffer_depth
    # Everything that depends on a pair of tile sizes is computed once per pair: the loop
    # below runs once per triple, up to MAX_TILE_TRIPLES times.
    stages_of = {tk: stage_count(shape, Tiling(1, 1, tk, 1)) for tk in space.tile_k}
    load_a = {
        (tm, tk): table.load_ns(tm * tk) for tm, tk in itertools.product(space.tile_m, space.tile_k)
    }
    load_b = {
        (tk, tn): table.load_ns(tk * tn) for tk, tn in itertools.product(space.tile_k, space.tile_n)
    }
    waves_of = {
        (tm, tn): wave_count(shape, Tiling(tm, tn, 1, 1), machine.sm_count)
        for tm, tn in itertools.product(space.tile_m, space.tile_n)
    }
    bounds = []
    for tm, tn, tk in itertools.product(space.tile_m, space.tile_n, space.tile_k):
        t_a, t_b = load_a[tm, tk], load_b[tk, tn]
        t_math = table.math_ns(tm * tn * tk)
        stages, waves = stages_of[tk], waves_of[tm, tn]
        load = t_a + t_b
        if limit is None:
            max_depth, deepest = None, depths[-1]
        else:
            max_depth = limit // stage_buffer_bytes(tm, tn, tk, element_bytes)
            fitting = bisect.bisect_right(depths, max_depth)  # depths are sorted
            deepest = depths[fitting - 1] if fitting else 0
        if deepest == 1:
            last_math_floor = load + (stages - 1) * (load + t_math)
        else:
            last_math_floor = max(load + (stages - 1) * t_math, stages * load)
        tail = t_math if include_last_math else 0
        bounds.append(
            TripleBound(
                tile_m=tm,
                tile_n=tn,
                tile_k=tk,
                t_load_a_ns=t_a,
                t_load_b_ns=t_b,
                t_math_ns=t_math,
                waves=waves,
                stages=stages,
                max_buffer_depth=max_depth,
                last_math_start_floor_ns=last_math_floor,
                overall_time_floor_ns=waves * (last_math_floor + tail + t_epilogue) + t_init,
                total_math_wait_floor_ns=waves * (last_math_floor - (stages - 1) * t_math),
            )
        )
    return bounds
