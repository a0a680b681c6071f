"""The async-copy timeline picture, read back and checked against properties of the
recurrences (A1)-(A3), not against values copied from the renderer."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation, simulate_async
from render import async_timeline_svg
from render.timeline import MAX_ASYNC_STAGES_DRAWN
from tests.gemm_ws_cases import PIPELINE_STAGE
from tests.render.svg import Svg, last_number

#: the README's stage: load 4000 elements/us with a 2 us latency, MATH 10^5 MACs/us (64x64x32:
#: issue d = 1.024 us < latency 2 us, MATH T = 1.311 us)
MACHINE = PIPELINE_STAGE
SM = SmLimits(16, 102400)


def _draw(
    shape: tuple[int, int, int],
    tiling: tuple[int, int, int, int],
    machine: GemmWsMachine = MACHINE,
    limits: SmLimits = SM,
) -> tuple[AsyncSimulation, Svg, bytes]:
    sim = simulate_async(GemmShape(*shape), Tiling(*tiling), machine, limits, 2)
    data = async_timeline_svg(sim, machine, device="test", dtype="fp16")
    return sim, Svg.parse(data), data


def _stages(svg: Svg, part: str) -> list[int]:
    return [int(i.split("-")[1]) for i in svg.ids(rf"stage-\d+-{part}")]


def test_one_row_of_bars_per_stage() -> None:
    sim, svg, _ = _draw((64, 64, 192), (64, 64, 32, 3))
    assert sim.stages == 6  # 192 / 32
    for part in ("issue", "in-flight", "arrival", "math"):
        assert _stages(svg, part) == list(range(1, 7)), part
    assert svg.ids("t-epilogue") == ["t-epilogue"]
    assert "all 6 stages" in svg.all_text()


def test_in_flight_spans_overlap_when_the_buffer_holds_several_stages() -> None:
    _, svg, _ = _draw((64, 64, 192), (64, 64, 32, 3))
    spans = [svg.x_extent(f"stage-{i}-in-flight") for i in range(1, 7)]
    # (A1) with D = 3: stage i+1 is issued as soon as stage i's issue ends (d = 1.024 us),
    # while stage i is still in flight for lambda = 2 us > d
    assert all(a[1] > b[0] + 1e-3 for a, b in zip(spans[:2], spans[1:3], strict=True))
    # loads (issue start to arrival) in flight at once never exceed the depth
    lives = [(svg.x_extent(f"stage-{i}-issue")[0], spans[i - 1][1]) for i in range(1, 7)]
    for t0, _ in lives:
        assert sum(1 for a, b in lives if a <= t0 + 1e-6 and b > t0 + 1e-6) <= 3


def test_depth_one_never_has_two_loads_in_flight() -> None:
    _, svg, _ = _draw((64, 64, 192), (64, 64, 32, 1))
    spans = [svg.x_extent(f"stage-{i}-in-flight") for i in range(1, 7)]
    # (A1) with D = 1: stage i+1 is issued only after MATH i ends, after stage i arrived
    for a, b in zip(spans, spans[1:], strict=False):
        assert a[1] <= b[0] + 1e-6


def test_each_stage_runs_issue_then_flight_then_math() -> None:
    _, svg, _ = _draw((64, 64, 192), (64, 64, 32, 3))
    previous_math_end = None
    for i in range(1, 7):
        issue = svg.x_extent(f"stage-{i}-issue")
        flight = svg.x_extent(f"stage-{i}-in-flight")
        math = svg.x_extent(f"stage-{i}-math")
        assert issue[1] == pytest.approx(flight[0], abs=1e-3)  # (A2): flight after the issue
        assert math[0] >= flight[1] - 1e-3  # (A3): MATH waits for the arrival
        if previous_math_end is not None:
            assert math[0] >= previous_math_end - 1e-3  # (A3): and for MATH i-1
        previous_math_end = math[1]
    # every issue and every MATH has the same width (one CTA's d and T)
    widths = {round(svg.width(f"stage-{i}-issue"), 2) for i in range(1, 7)}
    assert len(widths) == 1


def test_two_ctas_per_sm_double_the_issue_and_are_noted() -> None:
    one_sim, one, _ = _draw((4096, 4096, 192), (64, 64, 32, 3), limits=SmLimits(1, 102400))
    two_sim, two, _ = _draw((4096, 4096, 192), (64, 64, 32, 3), limits=SmLimits(2, 102400))
    assert (one_sim.ctas_per_sm, two_sim.ctas_per_sm) == (1, 2)
    assert "2 CTA(s) per SM" in two.all_text()
    # the same time axis scale would be needed to compare widths across pictures; compare
    # the issue's width to the in-flight span's (latency does not scale with CTAs)
    ratio_one = one.width("stage-2-issue") / one.width("stage-2-in-flight")
    ratio_two = two.width("stage-2-issue") / two.width("stage-2-in-flight")
    assert ratio_two == pytest.approx(2 * ratio_one, rel=1e-3)


def test_long_pipelines_show_their_first_stages_and_say_so() -> None:
    sim, svg, _ = _draw((64, 64, 32 * 40), (64, 64, 32, 4))
    assert sim.stages == 40
    assert _stages(svg, "math") == list(range(1, MAX_ASYNC_STAGES_DRAWN + 1))
    assert f"stages {MAX_ASYNC_STAGES_DRAWN + 1}–40 not drawn" in svg.text("stages-not-drawn")
    assert svg.ids("t-epilogue") == []


def test_the_picture_is_deterministic() -> None:
    _, _, first = _draw((64, 64, 192), (64, 64, 32, 3))
    _, _, second = _draw((64, 64, 192), (64, 64, 32, 3))
    assert first == second


@settings(max_examples=6, deadline=None)
@given(
    tile=st.sampled_from([16, 32, 64, 128]),
    depth=st.integers(1, 5),
    k_stages=st.integers(1, 20),
    tiles_per_sm=st.integers(1, 5),
    blocks=st.integers(1, 4),
)
def test_the_labelled_total_adds_up(
    tile: int, depth: int, k_stages: int, tiles_per_sm: int, blocks: int
) -> None:
    machine = dataclasses.replace(MACHINE, sm_count=2)
    m = tile * 2 * tiles_per_sm  # 2 SMs, tiles_per_sm tiles each
    # TK = 32: every tiling fits one SM's 100 KB (128x128x32 at depth 5: 80 KB)
    sim, svg, _ = _draw(
        (m, tile, 32 * k_stages), (tile, tile, 32, depth), machine, SmLimits(blocks, 102400)
    )
    total = svg.text("total")
    # T_INIT + full waves + the partial one: the simulator's overall time
    assert last_number(total) == pytest.approx(sim.overall_time_ns / 1000, abs=5e-4)
    assert sim.waves == -(-tiles_per_sm // sim.ctas_per_sm)
    assert (svg.ids("wave-partial") != []) == (tiles_per_sm % sim.ctas_per_sm != 0)
