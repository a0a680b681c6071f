"""Synthetic measured runs for the calibration tests: a hidden "true" device, the model's own
prediction of each run on it (the core's simulators), and seeded multiplicative noise."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from typing import Any

from app.schemas.devices import drop_read_only_keys
from device_profiles import DeviceProfile
from perfmodel.calibration import predict_many_bsp_cycles
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, simulate
from perfmodel.manybsp import DeviceFigures, PredictRequest, device_from_profile
from tests.gemm_ws_cases import A6000
from tests.paper_cases import CASES, PAPER_DIR

#: the hidden GPU of the GeMM-WS tests: loads 3x faster and MATH 3.3x slower than the
#: A6000's §4.2 figures, other latencies moved too, so the A6000's picks are 14-36 % slow on it
TRUE_GEMM = dataclasses.replace(
    A6000,
    load_throughput_elements_per_us=A6000.load_throughput_elements_per_us * 3,
    compute_throughput_macs_per_us=A6000.compute_throughput_macs_per_us * 0.3,
    load_startup_latency_us=0.1,
    t_init_us=4.0,
    t_epilogue_us=6.0,
)
NOISE = 0.02
#: tilings of the GeMM-WS runs: both regimes on TRUE_GEMM (load-bound when
#: TM TN / (TM + TN) < 16, its MATH over load throughput) and depth 1
TILINGS = [
    (16, 16, 64, 2),
    (32, 16, 64, 3),
    (128, 128, 32, 2),
    (64, 128, 64, 3),
    (128, 64, 32, 4),
    (64, 64, 64, 2),
    (128, 256, 32, 2),
    (32, 32, 32, 1),
    (256, 128, 16, 4),
]
SHAPES = [(1024, 1024, 1024), (2048, 512, 4096), (4096, 4096, 256), (512, 512, 8192)]


def true_time_us(machine: GemmWsMachine, run: dict[str, Any]) -> float:
    shape = GemmShape(run["m"], run["n"], run["k"])
    tiling = Tiling(run["tile_m"], run["tile_n"], run["tile_k"], run["buffer_depth"])
    return simulate(shape, tiling, machine).overall_time_ns / 1000


def measured(
    runs: Iterable[dict[str, Any]], rng: random.Random, machine: GemmWsMachine = TRUE_GEMM
) -> list[dict[str, Any]]:
    """Each run (``m..buffer_depth``) with its time on ``machine``, +-2 % noise (1 sigma)."""
    return [
        {**run, "measured_time_us": true_time_us(machine, run) * (1 + rng.gauss(0, NOISE))}
        for run in runs
    ]


def gemm_ws_runs(seed: int = 1, machine: GemmWsMachine = TRUE_GEMM) -> list[dict[str, Any]]:
    """Every shape with every tiling, timed on ``machine`` (the hidden GPU by default)."""
    configs = [
        {"m": m, "n": n, "k": k, "dtype": "fp16", "tile_m": a, "tile_n": b, "tile_k": c,
         "buffer_depth": d}
        for m, n, k in SHAPES
        for a, b, c, d in TILINGS
    ]  # fmt: skip
    return measured(configs, random.Random(seed), machine)


def paper_launches() -> list[dict[str, Any]]:
    """The six worked examples' launches, each at three grid sizes: the Many-BSP runs."""
    out = []
    for case in CASES:
        for scale in (1, 4, 16):
            grid = [case["grid"][0] * scale, case["grid"][1], case["grid"][2]]
            out.append(
                {
                    "ptx": (PAPER_DIR / case["ptx"]).read_text(),
                    "launch": {"grid": grid, "block": case["block"]},
                    "resources": {
                        "registers_per_thread": case["registers_per_thread"],
                        "shared_bytes_per_block": case["shared_bytes_per_block"],
                    },
                    "loop_trip_counts": case["loop_trip_counts"],
                    "memory_transactions": case["memory_transactions"],
                }
            )
    return out


def core_request(launch: dict[str, Any], device: DeviceFigures) -> PredictRequest:
    """The core request of an HTTP launch body (written out here, not app/convert's)."""
    grid, block = launch["launch"]["grid"], launch["launch"]["block"]
    resources = launch.get("resources", {})
    return PredictRequest(
        ptx=launch["ptx"],
        device=device,
        grid=(grid[0], grid[1], grid[2]),
        block=(block[0], block[1], block[2]),
        kernel=launch.get("kernel"),
        registers_per_thread=resources.get("registers_per_thread"),
        shared_bytes_per_block=resources.get("shared_bytes_per_block"),
        loop_trip_counts=dict(launch.get("loop_trip_counts", {})),
        memory_transactions={int(k): v for k, v in launch.get("memory_transactions", {}).items()},
    )


def many_bsp_runs(true: DeviceFigures, seed: int = 2) -> list[dict[str, Any]]:
    """Paper launches with their kernel cycles on the ``true`` figures, +-2 % noise."""
    rng = random.Random(seed)
    return [
        {
            **launch,
            "measured_cycles": predict_many_bsp_cycles(true, core_request(launch, true))
            * (1 + rng.gauss(0, NOISE)),
        }
        for launch in paper_launches()
    ]


#: the hidden Many-BSP figures (gtx-760's paper values are mu 3.36, 553 and 10 cycles); the
#: throughput efficiency reaches only profiles with a throughput floor (sector_bytes)
TRUE_MANY_BSP = {
    "mu": 2.0,
    "block_launch_overhead_cycles": 700.0,
    "warp_launch_overhead_cycles": 25.0,
    "throughput_efficiency": 0.8,
}


def true_many_bsp_figures(profile: dict[str, Any]) -> DeviceFigures:
    """A profile document (GET /devices/{id} or a file) with the hidden mu and launch
    overheads put in by hand."""
    section = dict(profile["many_bsp"])
    for name, value in TRUE_MANY_BSP.items():
        section[name] = {"value": value, "source": "hidden truth of the test"}
    document = drop_read_only_keys(profile)  # what GET /devices/{id} adds
    return device_from_profile(DeviceProfile.model_validate({**document, "many_bsp": section}))
