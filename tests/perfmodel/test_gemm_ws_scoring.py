"""The vectorised scorer against the stage-by-stage simulator (the oracle), bit for bit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, WaveTimeModel, simulate
from perfmodel.gemm_ws_scoring import (
    Configurations,
    Figures,
    ScoreOverflow,
    enumerate_configurations,
    lexicographic_order,
    score_configurations,
)
from tests.gemm_ws_cases import A6000

# Figures that put durations exactly on half nanoseconds (2000 elements/us: an odd tile is
# x.5 ns) or near them, beside arbitrary ones: the float path must hand those to exact math.
_throughputs = st.one_of(
    st.sampled_from([2000.0, 4000.0, 152.96, 24610.0, 0.1, 3.0, 1e6]),
    st.floats(min_value=0.05, max_value=1e6, allow_nan=False),
)
_times = st.one_of(
    st.sampled_from([0.0, 0.0005, 0.0015, 1.68, 1.543, 0.77]),
    st.floats(min_value=0.0, max_value=50.0, allow_nan=False),
)
_tile = st.one_of(st.sampled_from([16, 32, 64, 128, 256]), st.integers(1, 300))


@st.composite
def _figures(draw: st.DrawFn) -> Figures:
    d = draw(st.integers(1, 4))

    def field(values: st.SearchStrategy[float]) -> float | np.ndarray:
        if draw(st.booleans()):
            return draw(values)
        return np.asarray(draw(st.lists(values, min_size=d, max_size=d)))

    return Figures(
        sm_count=draw(st.integers(1, 200)),
        t_init_us=field(_times),
        t_epilogue_us=field(_times),
        load_startup_latency_us=field(_times),
        compute_startup_latency_us=field(_times),
        load_throughput_elements_per_us=field(_throughputs),
        compute_throughput_macs_per_us=field(_throughputs),
    )


@settings(max_examples=200, deadline=None)
@given(
    shape=st.builds(GemmShape, st.integers(1, 5000), st.integers(1, 5000), st.integers(1, 5000)),
    tilings=st.lists(st.tuples(_tile, _tile, _tile, st.integers(1, 9)), min_size=1, max_size=12),
    figures=_figures(),
    wave_model=st.sampled_from(WaveTimeModel),
)
def test_scores_equal_simulate_for_every_draw_and_configuration(
    shape: GemmShape,
    tilings: list[tuple[int, int, int, int]],
    figures: Figures,
    wave_model: WaveTimeModel,
) -> None:
    configs = Configurations.of(*zip(*tilings, strict=True))
    scores = score_configurations(shape, configs, figures, wave_model)
    machines = figures.draws()
    assert scores.overall_time_ns.shape == (len(machines), len(tilings))
    for d, machine in enumerate(machines):
        for c, tiling in enumerate(tilings):
            sim = simulate(shape, Tiling(*tiling), machine, wave_model)
            assert int(scores.overall_time_ns[d, c]) == sim.overall_time_ns
            assert int(scores.total_math_wait_ns[d, c]) == sim.total_math_wait_ns


@settings(max_examples=60, deadline=None)
@given(
    shape=st.builds(GemmShape, st.integers(1, 5000), st.integers(1, 5000), st.integers(1, 5000)),
    triples=st.lists(st.tuples(_tile, _tile, _tile), min_size=1, max_size=4),
    depths=st.lists(st.integers(1, 9), min_size=2, max_size=6),
    draws=st.lists(st.tuples(_throughputs, _throughputs, _times), min_size=2, max_size=5),
    wave_model=st.sampled_from(WaveTimeModel),
)
def test_configurations_sharing_a_triple_under_draws_equal_simulate(
    shape: GemmShape,
    triples: list[tuple[int, int, int]],
    depths: list[int],
    draws: list[tuple[float, float, float]],
    wave_model: WaveTimeModel,
) -> None:
    """Several draws and each triple at several depths (1 among them or not): the scorer
    scores each (triple, depth 1 or not) once and copies it; every copy equals simulate."""
    tilings = [(*t, d) for t in triples for d in depths]
    load, compute, epilogue = (np.asarray(v) for v in zip(*draws, strict=True))
    figures = Figures(
        sm_count=84,
        t_init_us=1.68,
        t_epilogue_us=epilogue,
        load_startup_latency_us=0.77,
        compute_startup_latency_us=0.0015,
        load_throughput_elements_per_us=load,
        compute_throughput_macs_per_us=compute,
    )
    configs = Configurations.of(*zip(*tilings, strict=True))
    scores = score_configurations(shape, configs, figures, wave_model)
    for d, machine in enumerate(figures.draws()):
        for c, tiling in enumerate(tilings):
            sim = simulate(shape, Tiling(*tiling), machine, wave_model)
            assert int(scores.overall_time_ns[d, c]) == sim.overall_time_ns
            assert int(scores.total_math_wait_ns[d, c]) == sim.total_math_wait_ns


def test_a_bad_depth_is_refused_even_beside_a_valid_one_of_its_triple() -> None:
    configs = Configurations.of([64, 64], [64, 64], [32, 32], [2, 0])
    figures = Figures(84, np.array([1.0, 2.0]), 1.0, 0.5, 0.5, 2000.0, 24610.0)
    with pytest.raises(ValueError, match="at least 1"):
        score_configurations(GemmShape(512, 512, 512), configs, figures)


def test_half_nanosecond_durations_round_up_like_the_simulator() -> None:
    # 2000 elements/us: a tile of 2j+1 elements loads in j + 0.5 ns exactly -> j + 1
    machine = GemmWsMachine(1, 0.0, 0.0, 0.0, 0.0, 2000.0, 2000.0)
    configs = Configurations.of([1, 3, 5], [1, 1, 1], [1, 1, 1], [2, 2, 2])
    scores = score_configurations(GemmShape(1, 1, 1), configs, Figures.of_machine(machine))
    expected = [simulate(GemmShape(1, 1, 1), Tiling(m, 1, 1, 2), machine) for m in (1, 3, 5)]
    assert scores.overall_time_ns[0].tolist() == [s.overall_time_ns for s in expected]


def test_times_beyond_int64_are_refused_not_wrapped() -> None:
    slow = GemmWsMachine(1, 0.0, 0.0, 0.0, 0.0, 1e-6, 1e-6)
    configs = Configurations.of([65536], [65536], [65536], [1])
    with pytest.raises(ScoreOverflow):
        score_configurations(
            GemmShape(1 << 20, 1 << 20, 1 << 20), configs, Figures.of_machine(slow)
        )


def test_draws_must_agree_in_length() -> None:
    figures = Figures(84, np.zeros(2), 0.0, 0.0, 0.0, np.ones(3), 1.0)
    with pytest.raises(ValueError, match="same D draws"):
        figures.draws()


@pytest.mark.parametrize("limit", [None, 40_000, 101_376])
@pytest.mark.parametrize("chunk", [1, 7, 1 << 17])
def test_enumeration_is_the_feasible_product_in_any_chunking(limit: int | None, chunk: int) -> None:
    values, ks, depths = (16, 64, 128, 256), (32, 128), (1, 2, 5)
    expected = {
        (m, n, k, d)
        for m, n, k, d in itertools.product(values, values, ks, depths)
        if limit is None or d * (m * k + k * n) * 2 <= limit
    }
    chunks = list(enumerate_configurations(values, values, ks, depths, 2, limit, chunk))
    seen = [
        (int(c.tile_m[i]), int(c.tile_n[i]), int(c.tile_k[i]), int(c.buffer_depth[i]))
        for c in chunks
        for i in range(c.count)
    ]
    assert len(seen) == len(expected) and set(seen) == expected
    assert all(c.count <= chunk for c in chunks)


def test_lexicographic_order_is_the_optimizers_ranking() -> None:
    configs = Configurations.of(
        [64, 128, 128, 128], [64, 64, 64, 64], [32, 32, 32, 32], [3, 3, 2, 2]
    )
    time = np.asarray([5, 5, 5, 4])
    wait = np.asarray([1, 1, 1, 9])
    # time first; then wait; then larger TM; then smaller depth
    assert lexicographic_order(time, wait, configs).tolist() == [3, 2, 1, 0]
    scores = score_configurations(GemmShape(512, 512, 512), configs, Figures.of_machine(A6000))
    assert scores.overall_time_ns.dtype == np.int64


@pytest.mark.parametrize("scale", [1, 1 << 21])
def test_pipeline_keys_equal_exactly_when_the_closed_form_cannot_tell_apart(scale: int) -> None:
    """Both key forms (one int64; rows when the tiles are too large for it)."""
    from perfmodel.gemm_ws_scoring import _pipeline_keys

    tilings = [
        (t * scale, n * scale, k * scale, d)
        for t, n, k in itertools.product((1, 2, 3), repeat=3)
        for d in (1, 2, 5)
    ]
    configs = Configurations.of(*zip(*tilings, strict=True))
    keys = _pipeline_keys(configs)
    assert keys.ndim == (1 if scale == 1 else 2)
    for i, a in enumerate(tilings):
        for j, b in enumerate(tilings):
            same = a[:3] == b[:3] and (a[3] == 1) == (b[3] == 1)
            assert bool(np.all(keys[i] == keys[j])) == same
