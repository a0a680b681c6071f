"""The Z3 optimum equals an independent brute-force minimum over the simulator (§3.3)."""

from __future__ import annotations

import random

import pytest

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, WaveTimeModel
from solver import InfeasibleSearchSpace, SearchSpace, TilingProblem, optimize_tiling
from tests.gemm_ws_cases import (
    LOAD_FAST,
    LOAD_SLOW,
    ON_PAR,
    TABLE_1_SPACE,
    brute_force_ranking,
)

REGIMES = {"load-fast": LOAD_FAST, "on-par": ON_PAR, "load-slow": LOAD_SLOW}
PROBLEMS_PER_REGIME = 110
GRID = range(32, 1025, 32)  # §3.3: M, N, K multiples of 32 up to 1024


def _problems(seed: int) -> list[GemmShape]:
    rng = random.Random(seed)
    return [
        GemmShape(rng.choice(GRID), rng.choice(GRID), rng.choice(GRID))
        for _ in range(PROBLEMS_PER_REGIME)
    ]


# §3.3 / Table 1's space: tiles {32, 64, 128}, depth 2..8, no capacity limit.
SPACE = TABLE_1_SPACE


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_solver_optimum_equals_brute_force(regime: str) -> None:
    machine = REGIMES[regime]
    mismatches = []
    for shape in _problems(seed=sorted(REGIMES).index(regime)):
        result = optimize_tiling(TilingProblem(shape, machine, SPACE), top_k=1, time_limit_s=30)
        expected = brute_force_ranking(shape, machine, SPACE)[0]
        got = result.best
        if result.status != "optimal" or (
            got.tiling,
            got.overall_time_ns,
            got.total_math_wait_ns,
        ) != (
            expected.tiling,
            expected.overall_time_ns,
            expected.total_math_wait_ns,
        ):
            mismatches.append((shape, result.status, got.tiling, expected.tiling))
    assert mismatches == []


def _varied_cases() -> list[tuple[GemmShape, GemmWsMachine, SearchSpace, WaveTimeModel]]:
    """Buffer depth 1, shared-memory limits, the wave-time variant, odd tile lists."""
    rng = random.Random(7)
    cases = []
    for i in range(24):
        machine = GemmWsMachine(
            sm_count=rng.choice([1, 8, 84, 132]),
            t_init_us=rng.uniform(0, 3),
            t_epilogue_us=rng.uniform(0, 3),
            load_startup_latency_us=rng.uniform(0, 2),
            compute_startup_latency_us=rng.uniform(0, 2),
            load_throughput_elements_per_us=rng.choice([10.0, 152.96, 5000.0]),
            compute_throughput_macs_per_us=rng.choice([500.0, 24610.0, 1e6]),
            shared_memory_per_block_bytes=rng.choice([16384, 49152, 101376]),
        )
        space = SearchSpace(
            tile_m=tuple(rng.sample([16, 32, 48, 64, 128, 256], 3)),
            tile_n=tuple(rng.sample([16, 32, 64, 96, 128], 3)),
            tile_k=tuple(rng.sample([8, 16, 32, 64, 128], 3)),
            buffer_depth=tuple(range(1, rng.choice([3, 5, 9]))),
            enforce_shared_memory=i % 2 == 0,
        )
        shape = GemmShape(rng.randint(1, 3000), rng.randint(1, 3000), rng.randint(1, 3000))
        wave_model = WaveTimeModel.INCLUDE_LAST_MATH if i % 3 == 0 else WaveTimeModel.PAPER
        cases.append((shape, machine, space, wave_model))
    return cases


@pytest.mark.parametrize("case", _varied_cases(), ids=lambda c: f"{c[0].m}x{c[0].n}x{c[0].k}")
def test_ranked_shortlist_equals_brute_force_order(
    case: tuple[GemmShape, GemmWsMachine, SearchSpace, WaveTimeModel],
) -> None:
    shape, machine, space, wave_model = case
    problem = TilingProblem(shape, machine, space, element_bytes=2, wave_model=wave_model)
    expected = brute_force_ranking(shape, machine, space, 2, wave_model)[:4]
    if not expected:
        with pytest.raises(InfeasibleSearchSpace):
            optimize_tiling(problem, top_k=4)
        return
    result = optimize_tiling(problem, top_k=4, time_limit_s=30)
    assert result.status == "optimal"
    assert [s.tiling for s in result.candidates] == [s.tiling for s in expected]
    assert [s.overall_time_ns for s in result.candidates] == [s.overall_time_ns for s in expected]
