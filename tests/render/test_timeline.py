"""The GeMM-WS timeline picture, read back and checked against the simulation it draws."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.convert.optimize import gemm_ws_machine
from device_profiles import get_profile
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Simulation, Tiling, simulate
from render import timeline_svg
from render.timeline import FIRST_STAGES, LAST_STAGES, MAX_STAGES_DRAWN
from tests.gemm_ws_cases import FAST_DMA
from tests.render.svg import Svg, last_number

A6000 = gemm_ws_machine(get_profile("rtx-a6000"))


def _draw(
    shape: tuple[int, int, int], tiling: tuple[int, int, int, int], machine: GemmWsMachine
) -> tuple[Simulation, Svg, bytes]:
    sim = simulate(GemmShape(*shape), Tiling(*tiling), machine)
    data = timeline_svg(sim, machine, device="test", dtype="fp16", rank=1)
    return sim, Svg.parse(data), data


def _stages(svg: Svg, part: str) -> list[int]:
    return [int(i.split("-")[1]) for i in svg.ids(rf"stage-\d+-{part}")]


def test_short_pipeline_draws_every_stage_once() -> None:
    # the paper's Table 1 row: 1024x512x1024, 128x64x128 -> 8 stages, 1 wave
    sim, svg, _ = _draw((1024, 512, 1024), (128, 64, 128, 2), A6000)
    assert sim.stages == 8
    assert _stages(svg, "math") == list(range(1, 9))
    assert _stages(svg, "load-a") == list(range(1, 9))
    assert _stages(svg, "load-b") == list(range(1, 9))
    assert svg.ids("elided-stages") == []
    assert "all 8 stages" in svg.all_text()


def test_labelled_total_is_the_predicted_time() -> None:
    sim, svg, _ = _draw((1024, 512, 1024), (128, 64, 128, 2), A6000)
    total = svg.text("total")
    assert last_number(total) == pytest.approx(sim.overall_time_ns / 1000, abs=5e-4)
    assert f"{sim.waves} × " in total
    assert last_number(svg.text("wave-time")) == pytest.approx(sim.wave_time_ns / 1000, abs=5e-4)


def test_bars_are_placed_at_the_simulated_times() -> None:
    sim, svg, _ = _draw((1024, 512, 1024), (128, 64, 128, 2), A6000)
    d = sim.durations
    origin, a_end = svg.x_extent("stage-1-load-a")
    scale = (a_end - origin) / d.t_load_a_ns  # points per ns on the wave's axis
    assert svg.width("stage-1-load-b") == pytest.approx(d.t_load_b_ns * scale, rel=1e-3)
    assert svg.width("stage-1-math") == pytest.approx(d.t_math_ns * scale, rel=1e-3)
    for e in sim.events:
        math_x = svg.x_extent(f"stage-{e.stage}-math")[0]
        assert math_x - origin == pytest.approx(e.math_start_ns * scale, rel=1e-3, abs=0.01)
        load_x = svg.x_extent(f"stage-{e.stage}-load-a")[0]
        assert load_x - origin == pytest.approx(e.load_a_start_ns * scale, rel=1e-3, abs=0.01)
    # a load-bound pipeline: MATH waits before every stage, drawn where it waits
    waits = _stages(svg, "math-wait")
    assert waits == [e.stage for e in sim.events if e.math_wait_ns > 0] == list(range(1, 9))
    assert svg.width("stage-3-math-wait") == pytest.approx(
        sim.events[2].math_wait_ns * scale, rel=1e-3
    )


def test_long_pipeline_shows_first_and_last_stages_and_labels_the_middle() -> None:
    sim, svg, data = _draw((1024, 512, 128_000), (128, 64, 128, 2), A6000)
    assert sim.stages == 1000
    shown = [*range(1, FIRST_STAGES + 1), *range(1000 - LAST_STAGES + 1, 1001)]
    assert _stages(svg, "math") == shown
    title = svg.all_text()
    match = re.search(r"MATH of stages 1–(\d+) and (\d+)–1000 of 1000 shown", title)
    assert match is not None, title
    assert len(_stages(svg, "math")) == int(match[1]) + (1000 - int(match[2]) + 1)
    elided = svg.text("elided-stages")
    assert f"stages {FIRST_STAGES + 1}–{1000 - LAST_STAGES}" in elided
    # the middle is periodic with one stage per T_LOAD-A + T_LOAD-B (load-bound)
    assert "periodic" in elided and "not periodic" not in elided
    assert last_number(elided) == pytest.approx(sim.durations.t_load_ns / 1000, abs=5e-4)
    assert last_number(svg.text("total")) == pytest.approx(sim.overall_time_ns / 1000, abs=5e-4)
    assert len(data) < 200_000


def test_math_bound_pipeline_shows_the_dma_stalling_on_a_full_buffer() -> None:
    sim, svg, _ = _draw((4096, 4096, 4096), (128, 64, 128, 3), FAST_DMA)
    assert not sim.load_bound and sim.stages == 32 and sim.waves == 25
    d = sim.durations
    stalled = {
        e.stage
        for e, previous in zip(sim.events[1:], sim.events, strict=False)
        if e.load_a_start_ns > previous.load_b_start_ns + d.t_load_b_ns
    }
    drawn = set(_stages(svg, "dma-stall"))
    assert drawn and drawn <= stalled
    # the DMA warp runs ahead: loads of stages whose MATH is elided are drawn beside MATH 8
    assert max(_stages(svg, "load-a")) > FIRST_STAGES
    # MATH starts as soon as the previous one ends: no waits after the first stage
    assert _stages(svg, "math-wait") == [1]
    # 25 waves: the first two and the last drawn, the rest labelled
    assert svg.ids(r"wave-\d+") == ["wave-1", "wave-2", "wave-25"]
    assert "3–24" in svg.text("elided-waves")
    assert svg.ids("t-init") == ["t-init"] and svg.ids("t-epilogue") == ["t-epilogue"]


def test_pipelines_up_to_the_limit_are_drawn_whole() -> None:
    sim, svg, _ = _draw((1024, 512, MAX_STAGES_DRAWN * 128), (128, 64, 128, 2), A6000)
    assert _stages(svg, "math") == list(range(1, MAX_STAGES_DRAWN + 1))
    sim, svg, _ = _draw((1024, 512, (MAX_STAGES_DRAWN + 1) * 128), (128, 64, 128, 2), A6000)
    assert len(_stages(svg, "math")) == FIRST_STAGES + LAST_STAGES


def test_a_few_waves_are_all_drawn_with_their_boundaries() -> None:
    sim, svg, _ = _draw((1024, 1024, 256), (64, 64, 64, 2), A6000)
    assert sim.waves == 4
    assert svg.ids(r"wave-\d+") == [f"wave-{w}" for w in range(1, 5)]
    assert svg.ids(r"wave-boundary-\d+") == [f"wave-boundary-{w}" for w in range(2, 5)]
    assert svg.ids("elided-waves") == []


def test_every_freed_slot_of_a_shown_stage_is_marked() -> None:
    sim, svg, _ = _draw((1024, 512, 1024), (128, 64, 128, 2), A6000)
    assert svg.ids(r"slot-free-\d+") == [f"slot-free-{i}" for i in range(1, 9)]
    assert all(svg.markers(f"slot-free-{i}") == 1 for i in range(1, 9))


def test_the_picture_is_deterministic() -> None:
    _, _, first = _draw((1024, 512, 1024), (128, 64, 128, 2), A6000)
    _, _, second = _draw((1024, 512, 1024), (128, 64, 128, 2), A6000)
    assert first == second
    assert b"<dc:date>" not in first


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    m=st.integers(1, 1 << 14),
    n=st.integers(1, 1 << 14),
    k=st.integers(1, 1 << 14),
    tile=st.tuples(st.sampled_from([1, 16, 64, 256]), st.sampled_from([1, 16, 64, 256])),
    tile_k=st.sampled_from([1, 8, 64, 256]),
    depth=st.integers(1, 8),
    load=st.floats(1e-3, 1e6),
    compute=st.floats(1e-3, 1e9),
    fixed_us=st.tuples(st.floats(0, 1e3), st.floats(0, 1e3), st.floats(0, 10)),
)
def test_any_tiling_on_any_machine_draws_its_total(
    m: int,
    n: int,
    k: int,
    tile: tuple[int, int],
    tile_k: int,
    depth: int,
    load: float,
    compute: float,
    fixed_us: tuple[float, float, float],
) -> None:
    machine = GemmWsMachine(
        sm_count=84,
        t_init_us=fixed_us[0],
        t_epilogue_us=fixed_us[1],
        load_startup_latency_us=fixed_us[2],
        compute_startup_latency_us=0.0,
        load_throughput_elements_per_us=load,
        compute_throughput_macs_per_us=compute,
    )
    sim, svg, data = _draw((m, n, k), (tile[0], tile[1], tile_k, depth), machine)
    shown = _stages(svg, "math")
    if sim.stages <= MAX_STAGES_DRAWN:
        assert shown == list(range(1, sim.stages + 1))
    else:
        assert len(shown) == FIRST_STAGES + LAST_STAGES
    assert last_number(svg.text("total")) == pytest.approx(sim.overall_time_ns / 1000, abs=5e-4)
    assert len(data) < 200_000
