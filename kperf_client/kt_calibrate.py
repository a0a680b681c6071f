"""Many-BSP measured runs from a Kernel Tuner tuning: one per configuration.

Each configuration becomes the body ``POST /calibrate`` takes for ``model: many-bsp``: its PTX
(built with Kernel Tuner's defines, or prebuilt), the launch Kernel Tuner made for it
(:mod:`kperf_client.kt_geometry`), the entry's registers and shared bytes from ``ptxas -v``
when known, and its measured time as cycles: ``time_ms x 1000 x clock_mhz`` (us x MHz).
Kernel Tuner records wall time, so the clock is the one the GPU ran at during the tuning.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kperf_client.kt_cache import TunedConfig
from kperf_client.kt_geometry import (
    BLOCK_SIZE_NAMES,
    Divisor,
    Params,
    block_dimensions,
    grid_dimensions,
)
from kperf_client.ptx_build import PtxBuild

#: builds (or finds) one configuration's PTX for its launch: (params, grid, block) -> build
Build = Callable[[Params, tuple[int, int, int], tuple[int, int, int]], PtxBuild]


@dataclass(frozen=True)
class Geometry:
    """How Kernel Tuner launched the tuning: ``tune_kernel`` 's arguments of the same names."""

    problem_size: Sequence[int | str]
    grid_div: Sequence[Divisor] = (None, None, None)
    block_size_names: Sequence[str] = BLOCK_SIZE_NAMES


def choose(configs: Sequence[TunedConfig], count: int | None, seed: int) -> list[TunedConfig]:
    """``count`` configurations drawn without replacement (seeded), in the cache's order;
    all of them when ``count`` is None or not below their number."""
    if count is None or count >= len(configs):
        return list(configs)
    if count < 1:
        raise ValueError("choose at least 1 configuration")
    picked = set(random.Random(seed).sample(range(len(configs)), count))
    return [config for i, config in enumerate(configs) if i in picked]


def measured_run(
    config: TunedConfig, build: Build, geometry: Geometry, clock_mhz: float
) -> dict[str, Any]:
    """One configuration as a Many-BSP measurement of ``POST /calibrate``."""
    params = config.params
    grid = grid_dimensions(geometry.problem_size, params, geometry.grid_div,
                           geometry.block_size_names)  # fmt: skip
    block = block_dimensions(params, geometry.block_size_names)
    built = build(params, grid, block)
    run: dict[str, Any] = {"ptx": built.ptx, "launch": {"grid": list(grid), "block": list(block)}}
    if built.kernel is not None:
        run["kernel"] = built.kernel
    if built.resources is not None:
        run["resources"] = {
            "registers_per_thread": built.resources.registers_per_thread,
            "shared_bytes_per_block": built.resources.shared_bytes,
        }
    run["measured_cycles"] = config.time_ms * 1000.0 * clock_mhz
    return run
