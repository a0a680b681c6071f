"""Synthetic "true devices" for the calibration tests and benches (bench/bench_calibration_*.py).

Measurements come from the stage-by-stage event simulator (perfmodel.gemm_ws.simulate), not
from the closed form the fit uses, so a wrong closed form or Jacobian shows up as a failed
recovery.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from perfmodel.calibration import GemmWsMeasurement
from perfmodel.gemm_ws import (
    ELEMENT_BYTES,
    GemmShape,
    GemmWsMachine,
    Tiling,
    WaveTimeModel,
    simulate,
)
from tests.gemm_ws_cases import A6000

BASE = A6000
TILES = (16, 32, 64, 128, 256)
#: "far from the base profile": 3x faster loads, 5x slower MATH, other latencies moved too
CLOSED_LOOP_TRUTH = dataclasses.replace(
    A6000,
    load_throughput_elements_per_us=3 * A6000.load_throughput_elements_per_us,
    compute_throughput_macs_per_us=A6000.compute_throughput_macs_per_us / 5,
    load_startup_latency_us=0.4,
    compute_startup_latency_us=0.3,
    t_init_us=3.0,
    t_epilogue_us=0.8,
)
#: a second hidden GPU whose stages are latency-bound: loads 30x and MATH 3x the A6000's
#: throughput, 2 us per tile load and 1 us per MATH startup (the latency-bound closed loop)
LATENCY_BOUND_TRUTH = dataclasses.replace(
    A6000,
    load_throughput_elements_per_us=30 * A6000.load_throughput_elements_per_us,
    compute_throughput_macs_per_us=3 * A6000.compute_throughput_macs_per_us,
    load_startup_latency_us=2.0,
    compute_startup_latency_us=1.0,
    t_init_us=4.0,
    t_epilogue_us=1.5,
)
#: the simulator counts integer nanoseconds per duration; simulating a machine this many
#: times slower and dividing by it gives the same model at picosecond resolution (every
#: duration, sum and max of §2.2 scales with the time unit), so a figure of a few hundred ns
#: can be recovered to better than 0.5 %
TIME_SCALE = 1000


def simulated_time_us(
    shape: GemmShape,
    tiling: Tiling,
    machine: GemmWsMachine,
    wave_model: WaveTimeModel = WaveTimeModel.PAPER,
) -> float:
    """Overall time of the event simulator, at picosecond resolution."""
    slow = dataclasses.replace(
        machine,
        t_init_us=machine.t_init_us * TIME_SCALE,
        t_epilogue_us=machine.t_epilogue_us * TIME_SCALE,
        load_startup_latency_us=machine.load_startup_latency_us * TIME_SCALE,
        compute_startup_latency_us=machine.compute_startup_latency_us * TIME_SCALE,
        load_throughput_elements_per_us=machine.load_throughput_elements_per_us / TIME_SCALE,
        compute_throughput_macs_per_us=machine.compute_throughput_macs_per_us / TIME_SCALE,
    )
    return simulate(shape, tiling, slow, wave_model).overall_time_ns / 1000 / TIME_SCALE


def log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def draw_machine(rng: np.random.Generator) -> GemmWsMachine:
    """Figures drawn over ranges around the A6000's §4.2 values (from a third to 13x)."""
    return dataclasses.replace(
        A6000,
        t_init_us=rng.uniform(1.0, 5.0),
        t_epilogue_us=rng.uniform(0.5, 3.0),
        load_startup_latency_us=rng.uniform(0.3, 2.0),
        compute_startup_latency_us=rng.uniform(0.1, 1.0),
        load_throughput_elements_per_us=log_uniform(rng, 50.0, 2000.0),
        compute_throughput_macs_per_us=log_uniform(rng, 5e3, 1e5),
    )


def draw_dimension(rng: np.random.Generator) -> int:
    """A GEMM dimension: a multiple of 128, log-uniform over 256..8192."""
    return max(128, round(2 ** rng.uniform(8, 13) / 128) * 128)


def draw_runs(
    rng: np.random.Generator,
    count: int,
    depths: tuple[int, ...] = (1, 2, 3, 4),
    dtype: str = "fp16",
) -> list[tuple[GemmShape, Tiling]]:
    """Random problems with random tilings that fit the A6000's shared memory."""
    limit = A6000.shared_memory_per_block_bytes
    assert limit is not None
    runs: list[tuple[GemmShape, Tiling]] = []
    while len(runs) < count:
        shape = GemmShape(draw_dimension(rng), draw_dimension(rng), draw_dimension(rng))
        tm, tn, tk = (int(rng.choice(TILES)) for _ in range(3))
        tiling = Tiling(tm, tn, tk, int(rng.choice(depths)))
        if tiling.shared_memory_bytes(ELEMENT_BYTES[dtype]) <= limit:
            runs.append((shape, tiling))
    return runs


def measure(
    machine: GemmWsMachine,
    runs: list[tuple[GemmShape, Tiling]],
    rng: np.random.Generator,
    noise: float = 0.0,
    dtype: str = "fp16",
) -> list[GemmWsMeasurement]:
    """Simulated measurements; ``noise`` is the sigma of a multiplicative log-normal error."""
    out = []
    for shape, t in runs:
        factor = math.exp(rng.normal(0.0, noise)) if noise else 1.0
        out.append(
            GemmWsMeasurement(
                shape.m,
                shape.n,
                shape.k,
                dtype,
                t.tile_m,
                t.tile_n,
                t.tile_k,
                t.buffer_depth,
                simulated_time_us(shape, t, machine) * factor,
            )
        )
    return out
