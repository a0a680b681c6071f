"""The L2-aware closed forms against the event simulators, on the stage quantities the traffic
gives, and the split-K / feasibility properties."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling, WaveTimeModel, simulate
from perfmodel.gemm_ws_memory_model import (
    MemoryModelFigures,
    Recurrences,
    ShapeModel,
    Space,
    ctas_per_sm,
    feasible,
)
from perfmodel.gemm_ws_traffic import MemoryFigures
from perfmodel.pipelines.async_copy.recurrences import simulate_async

MEMORY = MemoryFigures(20, 900.0, 2500.0, 6e6, 0.5, 0.3)
FIGURES = MemoryModelFigures(2.0, 1.5, 0.02, 2e5, MEMORY, 2.0)
LIMITS = SmLimits(8, 160_000)


def _one(tm: int, tn: int, tk: int, depth: int) -> Space:
    return Space(*(np.array([v], dtype=np.int64) for v in (tm, tn, tk, depth, 1, 1)))


@pytest.mark.parametrize("pipeline", ["paper", "async-copy"])
def test_closed_form_equals_the_event_simulator_on_the_effective_figures(
    pipeline: Recurrences,
) -> None:
    rng = random.Random(7)
    for _ in range(60):
        m, n, k = (rng.randint(64, 3000) for _ in range(3))
        tm, tn, tk = (rng.choice([16, 32, 64, 128]) for _ in range(3))
        depth = rng.randint(2, 6)
        model = ShapeModel(
            m, n, k, 2, _one(tm, tn, tk, depth), 20, LIMITS, pipeline, output_bytes=0
        )
        if model.resident[0] < 1:
            continue
        times, traffic = model.times_us(FIGURES)
        machine = GemmWsMachine(
            20,
            t_init_us=FIGURES.t_init_us,
            t_epilogue_us=FIGURES.t_epilogue_us,
            load_startup_latency_us=float(traffic.load_latency_us[0]),
            compute_startup_latency_us=FIGURES.compute_startup_latency_us,
            load_throughput_elements_per_us=float(traffic.load_throughput_elements_per_us[0]),
            compute_throughput_macs_per_us=FIGURES.compute_throughput_macs_per_us,
        )
        shape, tiling = GemmShape(m, n, k), Tiling(tm, tn, tk, depth)
        if pipeline == "paper":
            exact = simulate(shape, tiling, machine, WaveTimeModel.PAPER).overall_time_ns
        else:
            exact = simulate_async(shape, tiling, machine, LIMITS, 2).overall_time_ns
        # the model's kernel starts with L2 cold: its first stage's loads (A and B in turn
        # under the paper's eq. (4)) wait DRAM's latency instead of the hit-rate mix
        loads = 2 if pipeline == "paper" else 1
        cold_ns = loads * (MEMORY.dram_latency_us - traffic.load_latency_us[0]) * 1000
        # the simulators round each duration to a ns: a few ns per stage and wave
        stages, waves = -(-k // tk), -(-(-(-m // tm) * -(-n // tn)) // 20)
        assert times[0] * 1000 == pytest.approx(exact + cold_ns, abs=3 * (stages + 2) * waves + 2)


def test_split_k_fills_the_gpu_on_a_small_output_with_a_long_k() -> None:
    """1024 x 1024 at 128 x 128 is 64 CTAs on 132 SMs: splitting K is faster."""
    memory = dataclasses.replace(MEMORY, sm_count=132)
    figures = dataclasses.replace(FIGURES, memory=memory)
    space = Space.product(tiles=(128,), depths=(4,), group_m=(1,), split_k=(1, 2, 4))
    model = ShapeModel(1024, 1024, 65536, 2, space, 132, SmLimits(1, 10**6), "async-copy")
    times, traffic = model.times_us(figures)
    assert traffic.ctas.tolist() == [64, 128, 256]
    assert times[1] < times[0] and times[2] < times[0]


def test_the_epilogue_stores_c_at_dram_bandwidth() -> None:
    """One wave of 20 CTAs of 128 x 128 fp32 C tiles: 20 x 64 KB more at 900 GB/s."""
    space = _one(128, 128, 32, 2)
    times = [
        ShapeModel(512, 640, 256, 4, space, 20, LIMITS, "paper", output_bytes=b).times_us(FIGURES)[
            0
        ][0]
        for b in (0, 4)
    ]
    assert times[1] - times[0] == pytest.approx(20 * 128 * 128 * 4 / 900e3)


def test_feasible_refuses_split_k_beyond_the_k_tiles_and_oversized_buffers() -> None:
    space = Space.product(tiles=(64,), depths=(2,), group_m=(1,), split_k=(1, 4, 5))
    resident = np.ones(space.count, dtype=np.int64)
    # k = 256 at tile_k 64: four k tiles, so split_k 5 leaves a slice without one
    assert feasible(space, 256, 2, None, resident).tolist() == [True, True, False]
    assert not feasible(space, 256, 2, 1000, resident).any()


def test_accumulators_bound_the_ctas_an_sm_holds() -> None:
    """fp32 accumulators, one register each, strictly fewer than the 65,536 of an SM: three
    128 x 128 CTAs, one 128 x 256, no 256 x 256 (whatever shared memory would allow)."""
    space = Space.product(tiles=(128, 256), depths=(2,), group_m=(1,), split_k=(1,))
    limits = SmLimits(32, 10**7, registers_per_sm=65536)
    got = dict(
        zip(
            zip(space.tile_m.tolist(), space.tile_n.tolist(), space.tile_k.tolist(), strict=True),
            ctas_per_sm(space, 2, limits).tolist(),
            strict=True,
        )
    )
    assert got[(128, 128, 128)] == 3
    assert got[(128, 256, 128)] == got[(256, 128, 128)] == 1
    assert got[(256, 256, 128)] == 0


def test_a_waves_c_store_drains_during_the_next_wave() -> None:
    """Two waves of 20 CTAs of 128 x 128 fp32 C tiles: the first wave's 20 x 64 KB drain while
    the second computes (its K loop is far longer), so C adds one wave's store, not two."""
    space = _one(128, 128, 32, 2)
    times = [
        ShapeModel(1024, 640, 8192, 4, space, 20, LIMITS, "paper", output_bytes=b).times_us(
            FIGURES
        )[0][0]
        for b in (0, 4)
    ]
    assert times[1] - times[0] == pytest.approx(20 * 128 * 128 * 4 / 900e3)


def test_the_epilogue_stages_each_ctas_c_tile_through_shared_memory() -> None:
    """One wave of 40 CTAs of 128 x 128 fp32 C tiles, two per SM (async copies): the store
    at DRAM bandwidth, plus each SM's two tiles written to and read from shared memory."""
    space = _one(128, 128, 32, 2)
    smem = 1e5  # bytes per us
    figures = dataclasses.replace(FIGURES, shared_memory_bytes_per_us=smem)
    models = [
        ShapeModel(1024, 640, 256, 4, space, 20, LIMITS, "async-copy", output_bytes=b)
        for b in (0, 4)
    ]
    assert models[1].ctas_per_sm.tolist() == [2]
    times = [model.times_us(figures)[0][0] for model in models]
    tile = 128 * 128 * 4
    assert times[1] - times[0] == pytest.approx(40 * tile / 900e3 + 2 * (2 * tile / smem))
