"""Kernel Tuner's launch geometry and per-configuration source, checked against Kernel Tuner's
own functions (installed) on random configurations, and against the launch dimensions Kernel
Tuner recorded for the dedispersion tuning (../shared, read in place; skipped when absent)."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from kperf_client.kt_geometry import (
    BLOCK_SIZE_NAMES,
    Divisor,
    GeometryError,
    block_dimensions,
    grid_dimensions,
    kernel_tuner_source,
)

kt_util = pytest.importorskip("kernel_tuner.util")

DEDISPERSION = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real-kernels" / "dedispersion"
)
SOURCE = '#include "k.h"\n__global__ void k() {\n    #pragma unroll loop_unroll_factor_i\n}\n'


def _random_case(
    rng: random.Random,
) -> tuple[dict[str, int | str], list[int | str], list[Divisor]]:
    params: dict[str, int | str] = {
        "block_size_x": rng.choice([1, 16, 32, 128]),
        "block_size_y": rng.choice([1, 2, 8]),
        "tile_size_x": rng.randint(1, 4),
        "loop_unroll_factor_i": rng.choice([0, 2]),
        "value_type": rng.choice(["float", "float2", "tile_size_x * 2"]),
    }
    sizes_y: list[int | str] = [777, "tile_size_x*100+1"]
    problem: list[int | str] = [rng.randint(1, 5000), rng.choice(sizes_y)]
    divisors: list[Divisor] = [
        rng.choice([None, ["block_size_x", "tile_size_x"], "block_size_x*tile_size_x", 7]),
        rng.choice([None, 3]),
        None,
    ]
    return params, problem, divisors


def test_grid_and_source_match_kernel_tuner_on_random_configurations() -> None:
    rng = random.Random(20251127)
    for _ in range(200):
        params, problem, divisors = _random_case(rng)
        expected_size = kt_util.get_problem_size(problem, params)
        expected_grid = kt_util.get_grid_dimensions(
            expected_size, params, divisors, list(BLOCK_SIZE_NAMES)
        )
        grid = grid_dimensions(problem, params, divisors)
        assert grid == tuple(expected_grid)
        block = block_dimensions(params)
        assert block == kt_util.get_thread_block_dimensions(params)
        _, expected_source = kt_util.prepare_kernel_string(
            "k", SOURCE, params, grid, block, list(BLOCK_SIZE_NAMES), "CUDA", None
        )
        assert kernel_tuner_source(SOURCE, params, grid, block) == expected_source


def test_block_defaults_are_kernel_tuners() -> None:
    assert block_dimensions({}) == kt_util.get_thread_block_dimensions({})


@pytest.mark.parametrize(
    ("expression", "reason"),
    [("nope * 2", "no tunable"), ("__import__('os')", "only"), ("block_size_x / 0", "zero")],
)
def test_expressions_that_cannot_be_evaluated_are_refused(expression: str, reason: str) -> None:
    with pytest.raises(GeometryError, match=reason):
        grid_dimensions([100], {"block_size_x": 4}, [expression, None, None])


def test_dedispersion_grids_are_those_kernel_tuner_launched() -> None:
    table = DEDISPERSION / "dedispersion_A100.csv"
    if not table.exists():
        pytest.skip(f"{table} absent (public data set, not in the repository)")
    with table.open(newline="") as f:
        rows = list(csv.DictReader(f))
    tunables = list(rows[0])[:8]
    for row in random.Random(7).sample(rows, 300):
        params = {name: int(row[name]) for name in tunables}
        grid = grid_dimensions([25000, 2048, 1], params)
        assert grid == (int(row["grid_x"]), int(row["grid_y"]), int(row["grid_z"]))
        assert block_dimensions(params) == (
            int(row["block_x"]),
            int(row["block_y"]),
            int(row["block_z"]),
        )
