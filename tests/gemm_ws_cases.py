"""Shared test data for the GeMM-WS model: the paper's A6000 machine and Table 1."""

from __future__ import annotations

import dataclasses
import itertools

from perfmodel.gemm_ws import (
    GemmShape,
    GemmWsMachine,
    Simulation,
    SmLimits,
    Tiling,
    WaveTimeModel,
    simulate,
)
from perfmodel.pipelines.async_copy import AsyncCopyPipeline
from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation
from solver.problem import CandidateProblem, TilingProblem
from solver.search_space import SearchSpace, shared_memory_fits

#: §4.2 figures, typed in from the paper (not read from the profile under test).
A6000 = GemmWsMachine(
    sm_count=84,
    t_init_us=1.680,
    t_epilogue_us=1.543,
    load_startup_latency_us=0.770,
    compute_startup_latency_us=0.0,
    load_throughput_elements_per_us=152.96,
    compute_throughput_macs_per_us=24610.0,
    shared_memory_per_block_bytes=101376,
)
#: the A6000 with a 5,000 elements/us DMA: MATH-bound, the DMA warp fills the buffer and stalls
#: (the timeline pictures' second case)
FAST_DMA = dataclasses.replace(A6000, load_throughput_elements_per_us=5000.0)
#: the README's pipeline-models stage (inline figures, illustrative): load 4,000 elements/us
#: with a 2 us latency, MATH 10^5 MACs/us; for a 64x64x32 stage the copy issue d = 1.024 us is
#: shorter than the latency, MATH T = 1.311 us (the async timeline's test case too)
PIPELINE_STAGE = GemmWsMachine(
    sm_count=84,
    t_init_us=1.0,
    t_epilogue_us=1.0,
    load_startup_latency_us=2.0,
    compute_startup_latency_us=0.0,
    load_throughput_elements_per_us=4000.0,
    compute_throughput_macs_per_us=1e5,
    shared_memory_per_block_bytes=101376,
)

#: Table 1: problem (M, N, K) -> optimal tiling (TM, TN, TK).
TABLE_1 = [
    ((1024, 1024, 1024), (128, 128, 128)),
    ((1024, 512, 1024), (128, 64, 128)),
    ((1024, 1024, 512), (128, 128, 128)),
    ((1024, 512, 512), (128, 64, 128)),
    ((512, 512, 512), (64, 64, 128)),
]

TABLE_1_SPACE = SearchSpace(
    tile_m=(32, 64, 128),
    tile_n=(32, 64, 128),
    tile_k=(32, 64, 128),
    buffer_depth=tuple(range(2, 9)),
    enforce_shared_memory=False,
)

#: the hardening pass's oversized space: tile_m and tile_n 1..332, tile_k 64, depth 1..8 (881,792
#: configurations; 110,224 tile triples, just under the 110,592 limit)
ISSUE_19_SPACE = SearchSpace(tuple(range(1, 333)), tuple(range(1, 333)), (64,), tuple(range(1, 9)))

#: §3.3's three machine regimes: DMA much faster than MATH, on par, much slower.
LOAD_FAST = GemmWsMachine(84, 1.68, 1.543, 0.77, 0.0, 1_000_000.0, 2_000.0, 101376)
ON_PAR = A6000
LOAD_SLOW = GemmWsMachine(84, 1.68, 1.543, 0.77, 0.0, 20.0, 1_000_000.0, 101376)


def brute_force_ranking(
    shape: GemmShape,
    machine: GemmWsMachine,
    space: SearchSpace,
    element_bytes: int = 2,
    wave_model: WaveTimeModel = WaveTimeModel.PAPER,
) -> list[Simulation]:
    """Every feasible candidate simulated stage by stage, sorted by the solver's objectives:
    overall time, total MATH wait, larger TM, larger TN, larger TK, smaller buffer depth."""
    limit = machine.shared_memory_per_block_bytes if space.enforce_shared_memory else None
    sims = [
        simulate(shape, Tiling(tm, tn, tk, d), machine, wave_model)
        for tm, tn, tk, d in itertools.product(
            space.tile_m, space.tile_n, space.tile_k, space.buffer_depth
        )
        if shared_memory_fits(Tiling(tm, tn, tk, d), element_bytes, limit)
    ]
    sims.sort(key=brute_force_order)
    return sims


def brute_force_order(s: Simulation | AsyncSimulation) -> tuple[int, ...]:
    """The documented order, written out independently of the solver's tie_break_key."""
    t = s.tiling
    return (
        s.overall_time_ns,
        s.total_math_wait_ns,
        -t.tile_m,
        -t.tile_n,
        -t.tile_k,
        t.buffer_depth,
    )


def async_copy_problem(
    shape: GemmShape,
    machine: GemmWsMachine,
    space: SearchSpace,
    limits: SmLimits,
    element_bytes: int = 2,
) -> TilingProblem:
    """``space`` under the async-copy model on SMs of ``limits`` (without the space's
    shared-memory constraint, no per-SM shared-memory limit either)."""
    if not space.enforce_shared_memory:
        limits = dataclasses.replace(limits, shared_memory_per_sm_bytes=None)
    return TilingProblem(shape, machine, space, element_bytes, pipeline=AsyncCopyPipeline(limits))


def async_copy_candidates(problem: TilingProblem, tilings: tuple[Tiling, ...]) -> CandidateProblem:
    """``tilings`` as a candidate list under ``problem``'s model and shared-memory switch."""
    return CandidateProblem(
        problem.shape,
        problem.machine,
        tilings,
        problem.element_bytes,
        enforce_shared_memory=problem.space.enforce_shared_memory,
        pipeline=problem.pipeline,
    )


def limits_of(problem: TilingProblem) -> SmLimits:
    """The SM limits of an async-copy problem (:func:`async_copy_problem`)."""
    model = problem.model
    assert isinstance(model, AsyncCopyPipeline)
    return model.limits
