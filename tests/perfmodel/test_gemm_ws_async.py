"""The async-copy variant: simulator = closed form = numpy arrays, and the
properties it must have in depth and CTAs per SM (docs/model-notes.md, async-copy)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.gemm_ws_scoring import Configurations, Figures
from perfmodel.pipelines.async_copy import AsyncCopyPipeline
from perfmodel.pipelines.async_copy.recurrences import (
    AsyncDurations,
    Bound,
    last_math_start_ns,
    run_stages,
    simulate_async,
    steady_state,
)

pow2 = st.sampled_from([8, 16, 32, 64, 128, 256])
shapes = st.builds(
    GemmShape,
    st.integers(1, 4096),
    st.integers(1, 4096),
    st.integers(1, 4096),
)
tilings = st.builds(Tiling, pow2, pow2, pow2, st.integers(1, 9))
machines = st.builds(
    GemmWsMachine,
    sm_count=st.integers(1, 132),
    t_init_us=st.floats(0, 5),
    t_epilogue_us=st.floats(0, 5),
    load_startup_latency_us=st.floats(0, 10),
    compute_startup_latency_us=st.floats(0, 1),
    load_throughput_elements_per_us=st.floats(10, 5000),
    compute_throughput_macs_per_us=st.floats(1000, 200_000),
)
limits = st.builds(
    SmLimits,
    max_blocks_per_sm=st.integers(1, 32),
    shared_memory_per_sm_bytes=st.sampled_from([None, 49152, 102400, 167936, 233472]),
)
durations = st.builds(
    AsyncDurations,
    ctas=st.just(1),
    issue_ns=st.integers(0, 5000),
    latency_ns=st.integers(0, 20000),
    math_ns=st.integers(0, 5000),
)


def _fits(tiling: Tiling, sm: SmLimits) -> bool:
    return sm.ctas_per_sm(tiling.shared_memory_bytes(2)) >= 1


@settings(max_examples=400, deadline=None)
@given(durations, st.integers(1, 200), st.integers(1, 12))
def test_closed_form_of_the_last_math_start_equals_the_recurrences(
    dur: AsyncDurations, stages: int, depth: int
) -> None:
    assert (
        last_math_start_ns(dur, stages, depth) == run_stages(dur, stages, depth)[-1].math_start_ns
    )


@settings(max_examples=400, deadline=None)
@given(shapes, tilings, machines, limits)
def test_closed_form_simulation_equals_the_simulator_but_for_events(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, sm: SmLimits
) -> None:
    if not _fits(tiling, sm):
        return
    stepped = simulate_async(shape, tiling, machine, sm, 2)
    closed = simulate_async(shape, tiling, machine, sm, 2, events=False)
    assert closed.events == () and stepped.events
    assert dataclasses.replace(closed, events=stepped.events) == stepped


@settings(max_examples=400, deadline=None)
@given(shapes, tilings, machines, limits)
def test_overall_closed_form_equals_the_simulator(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, sm: SmLimits
) -> None:
    if not _fits(tiling, sm):
        return
    sim = simulate_async(shape, tiling, machine, sm, 2)
    closed = AsyncCopyPipeline(sm).closed_form(shape, tiling, machine, 2)
    assert closed.overall_time_ns == sim.overall_time_ns
    # The waves count CTA slots: ceil(tiles / (SMs x c)) with c the CTAs per SM.
    tiles = -(-shape.m // tiling.tile_m) * -(-shape.n // tiling.tile_n)
    slots = machine.sm_count * sm.ctas_per_sm(tiling.shared_memory_bytes(2))
    assert sim.waves == -(-tiles // slots)


@settings(max_examples=200, deadline=None)
@given(shapes, st.lists(tilings, min_size=1, max_size=20), machines, limits)
def test_numpy_closed_form_equals_the_simulator(
    shape: GemmShape, configs: list[Tiling], machine: GemmWsMachine, sm: SmLimits
) -> None:
    model, columns = AsyncCopyPipeline(sm), Configurations.of_tilings(configs)
    got = model.score(shape, columns, Figures.of_machine(machine), 2).overall_time_ns[0]
    assert got.dtype == np.int64
    resident = model.resident(columns, 2).tolist()
    for t, value, fits in zip(configs, got.tolist(), resident, strict=True):
        assert fits == _fits(t, sm)
        if fits:
            assert value == simulate_async(shape, t, machine, sm, 2).overall_time_ns


def test_one_stage_by_hand() -> None:
    # S = 1: issue d, arrival d + lambda, MATH T: wave = d + lambda + T + epilogue.
    dur = AsyncDurations(ctas=1, issue_ns=10, latency_ns=100, math_ns=7)
    assert last_math_start_ns(dur, 1, 4) == 110
    # Latency-bound, depth 2, S = 5: every second stage waits a full slot cycle of 117 ns:
    # M(1) = 110, M(2) = 120, M(3) = M(1) + 7 + 110 = 227, M(4) = 237, M(5) = 344.
    assert [e.math_start_ns for e in run_stages(dur, 5, 2)] == [110, 120, 227, 237, 344]


# --- properties (the variant's acceptance) ----------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(shapes, tilings, machines, limits, st.integers(1, 8))
def test_time_never_increases_with_depth_while_the_ctas_per_sm_hold(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, sm: SmLimits, extra: int
) -> None:
    deeper = Tiling(tiling.tile_m, tiling.tile_n, tiling.tile_k, tiling.buffer_depth + extra)
    if not _fits(deeper, sm):
        return
    shallow = simulate_async(shape, tiling, machine, sm, 2)
    deep = simulate_async(shape, deeper, machine, sm, 2)
    if shallow.ctas_per_sm == deep.ctas_per_sm:
        assert deep.overall_time_ns <= shallow.overall_time_ns


@settings(max_examples=300, deadline=None)
@given(durations, st.integers(3, 200))
def test_a_latency_bound_stage_prefers_depth_above_two(dur: AsyncDurations, stages: int) -> None:
    bound, _ = steady_state(dur, 2)
    if bound is not Bound.LATENCY:
        return
    at = {depth: last_math_start_ns(dur, stages, depth) for depth in (2, 3)}
    assert at[3] < at[2]


@settings(max_examples=300, deadline=None)
@given(durations, st.integers(1, 200), st.integers(1, 12), st.integers(1, 12))
def test_a_math_bound_stage_gains_nothing_from_depth(
    dur: AsyncDurations, stages: int, depth: int, extra: int
) -> None:
    bound, in_flight = steady_state(dur, depth)
    if bound is not Bound.MATH:
        return
    assert in_flight == depth
    # MATH-bound at depth D: M(S) = d + lambda + (S-1) T, the same at any deeper buffer.
    deeper = last_math_start_ns(dur, stages, depth + extra)
    assert deeper == last_math_start_ns(dur, stages, depth)
    assert deeper == dur.issue_ns + dur.latency_ns + (stages - 1) * dur.math_ns


@settings(max_examples=300, deadline=None)
@given(shapes, tilings, machines, st.sampled_from([49152, 102400, 167936, 233472]))
def test_two_ctas_per_sm_are_never_slower_than_one(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, smem_per_sm: int
) -> None:
    if tiling.shared_memory_bytes(2) * 2 > smem_per_sm:
        return
    one = simulate_async(shape, tiling, machine, SmLimits(1, smem_per_sm), 2)
    two = simulate_async(shape, tiling, machine, SmLimits(2, smem_per_sm), 2)
    assert two.overall_time_ns <= one.overall_time_ns


@settings(max_examples=200, deadline=None)
@given(durations, st.integers(1, 12))
def test_stages_in_flight_within_the_buffer(dur: AsyncDurations, depth: int) -> None:
    _, in_flight = steady_state(dur, depth)
    assert 1 <= in_flight <= depth


def test_ctas_per_sm_takes_the_tightest_limit() -> None:
    sm = SmLimits(16, 102400, 65536, 1536, threads_per_cta=256, registers_per_thread=128)
    # shared memory 102400 // 20000 = 5; threads 1536 // 256 = 6; registers 65536 // 32768 = 2
    assert sm.ctas_per_sm(20000) == 2
    assert SmLimits(16, 102400).ctas_per_sm(20000) == 5
    assert SmLimits(3, 102400).ctas_per_sm(20000) == 3
    assert SmLimits(16, 102400).ctas_per_sm(102401) == 0
