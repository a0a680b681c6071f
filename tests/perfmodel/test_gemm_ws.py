"""The GeMM-WS simulator against the paper's definitions (§2) and structural properties."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.gemm_ws import (
    GemmShape,
    GemmWsMachine,
    Tiling,
    WaveTimeModel,
    last_math_start_closed_form_ns,
    simulate,
    simulate_closed_form,
    stage_durations,
    us_to_ns,
    wave_count,
)
from tests.gemm_ws_cases import A6000


def test_wave_count_matches_the_papers_example() -> None:
    # §2.1.1: 256 output tiles on 84 SMs take four waves.
    shape = GemmShape(16 * 64, 16 * 64, 64)
    assert wave_count(shape, Tiling(64, 64, 64, 2), 84) == 4


@pytest.mark.parametrize(
    ("m", "n", "tile_m", "tile_n", "waves"),
    [
        (1024, 1024, 128, 128, 1),  # 64 tiles fit the 84 SMs
        (1024, 1024, 64, 128, 2),  # 128 tiles: two waves
        (100, 100, 64, 64, 1),  # partial tiles still count: ceil(100/64)^2 = 4
        (84 * 32 + 1, 32, 32, 32, 2),  # one tile more than SMs spills into a second wave
    ],
)
def test_wave_count_table(m: int, n: int, tile_m: int, tile_n: int, waves: int) -> None:
    assert wave_count(GemmShape(m, n, 32), Tiling(tile_m, tile_n, 32, 2), 84) == waves


def test_durations_use_section_4_2_figures() -> None:
    # §4.2.3: 152.96 elements/us and 0.770 us startup; a 64x64 A tile is 4096 elements.
    d = stage_durations(Tiling(64, 128, 64, 2), A6000)
    assert d.t_load_a_ns == round((4096 / 152.96 + 0.770) * 1000)
    assert d.t_load_b_ns == round((64 * 128 / 152.96 + 0.770) * 1000)
    assert d.t_math_ns == round(64 * 128 * 64 / 24610 * 1000)


def test_rounding_is_half_up_and_exact() -> None:
    assert us_to_ns(0.0005) == 1
    assert us_to_ns(1.4994) == 1499


machines = st.builds(
    GemmWsMachine,
    sm_count=st.integers(1, 200),
    t_init_us=st.floats(0, 5),
    t_epilogue_us=st.floats(0, 5),
    load_startup_latency_us=st.floats(0, 5),
    compute_startup_latency_us=st.floats(0, 5),
    load_throughput_elements_per_us=st.floats(1, 1e6),
    compute_throughput_macs_per_us=st.floats(1, 1e7),
)
tiles = st.sampled_from([16, 32, 64, 128, 256])
tilings = st.builds(Tiling, tiles, tiles, tiles, st.integers(1, 8))
shapes = st.builds(GemmShape, st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096))


@settings(max_examples=150, deadline=None)
@given(shapes, tilings, machines)
def test_every_event_satisfies_and_is_set_by_its_recurrence(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine
) -> None:
    """Each event is the earliest time all its predecessors allow (eq. 1-3)."""
    sim = simulate(shape, tiling, machine)
    d = sim.durations
    ev = {e.stage: e for e in sim.events}
    for i, e in ev.items():
        back = ev.get(i - tiling.buffer_depth)
        release = back.math_start_ns + d.t_math_ns if back else 0
        a_bounds = [release] + ([ev[i - 1].load_b_start_ns + d.t_load_b_ns] if i > 1 else [0])
        b_bounds = [e.load_a_start_ns + d.t_load_a_ns, release]
        m_bounds = [e.load_b_start_ns + d.t_load_b_ns]
        if i > 1:
            m_bounds.append(ev[i - 1].math_start_ns + d.t_math_ns)
        assert e.load_a_start_ns == max(a_bounds)
        assert e.load_b_start_ns == max(b_bounds)
        assert e.math_start_ns == max(m_bounds)
    assert sim.stages == math.ceil(shape.k / tiling.tile_k) == len(sim.events)


@settings(max_examples=100, deadline=None)
@given(shapes, tilings, machines)
def test_deeper_buffer_is_never_slower(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine
) -> None:
    deeper = Tiling(tiling.tile_m, tiling.tile_n, tiling.tile_k, tiling.buffer_depth + 1)
    assert (
        simulate(shape, deeper, machine).overall_time_ns
        <= simulate(shape, tiling, machine).overall_time_ns
    )


@settings(max_examples=100, deadline=None)
@given(shapes, tilings, machines)
def test_math_wait_sum_and_wave_time_variants(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine
) -> None:
    paper = simulate(shape, tiling, machine, WaveTimeModel.PAPER)
    full = simulate(shape, tiling, machine, WaveTimeModel.INCLUDE_LAST_MATH)
    # The variant only adds the last stage's T_MATH to every wave.
    assert full.overall_time_ns - paper.overall_time_ns == paper.waves * paper.durations.t_math_ns
    # §3.2 Wait(1) = Sb(1) + T_LOAD-B, i.e. the first MATH starts after both loads.
    first = paper.events[0]
    assert first.math_wait_ns == first.load_b_start_ns + paper.durations.t_load_b_ns
    assert all(e.math_wait_ns >= 0 for e in paper.events)
    # Overall = W x (Sm(S) + T_EPILOGUE) + T_INIT (§2.2).
    last = paper.events[-1].math_start_ns
    expected = paper.waves * (last + us_to_ns(machine.t_epilogue_us)) + us_to_ns(machine.t_init_us)
    assert paper.overall_time_ns == expected


@settings(max_examples=300, deadline=None)
@given(shapes, tilings, machines, st.sampled_from(WaveTimeModel))
def test_closed_form_equals_the_stage_by_stage_simulation(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, wave_model: WaveTimeModel
) -> None:
    """docs/model-notes.md GeMM-WS 7: Sm(S) = L + (S-1) max(L, T), or L + (S-1)(L + T) at
    depth 1, on the same integer durations; the oracle runs eq. (1)-(3) stage by stage."""
    sim = simulate(shape, tiling, machine, wave_model)
    closed = last_math_start_closed_form_ns(sim.durations, sim.stages, tiling.buffer_depth)
    assert closed == sim.events[-1].math_start_ns
    without_events = dataclasses.replace(sim, events=())
    assert simulate_closed_form(shape, tiling, machine, wave_model) == without_events


def test_invalid_machine_and_tiling_are_refused() -> None:
    with pytest.raises(ValueError, match="load_throughput"):
        GemmWsMachine(84, 1, 1, 1, 0, 0.0, 1.0)
    with pytest.raises(ValueError, match="tile_k"):
        Tiling(16, 16, 0, 2)
