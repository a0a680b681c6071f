"""Explore shortlists (to learn the figures): rank 1 is the solver's proven optimum (and the brute
force's), every pick is a feasible configuration, and the shortlist's contract under confident and
wide beliefs."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.belief import FigureBelief, Prior
from perfmodel.gemm_ws import GemmShape, WaveTimeModel, simulate
from solver import SearchSpace, TilingProblem, optimize_tiling
from solver.explore import explore_problem
from solver.shortlist import ShortlistMode
from tests.calibration_cases import BASE, draw_machine
from tests.gemm_ws_cases import brute_force_ranking

FIGURES = (
    "load_throughput_elements_per_us",
    "compute_throughput_macs_per_us",
    "load_startup_latency_us",
    "t_init_us",
    "t_epilogue_us",
)


def _belief(machine, sigma: float) -> FigureBelief:
    values = {n: float(getattr(machine, n)) for n in FIGURES}
    return FigureBelief.from_priors({n: Prior(values[n], sigma, "t") for n in FIGURES}, values)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("wave_model", list(WaveTimeModel))
def test_rank_one_is_the_proven_and_brute_force_optimum(seed, wave_model) -> None:
    rng = np.random.default_rng(seed)
    machine = draw_machine(rng)
    shape = GemmShape(*(int(rng.integers(1, 40)) * 64 for _ in range(3)))
    space = SearchSpace(
        tile_m=(16, 32, 64, 128), tile_n=(32, 64, 256), tile_k=(16, 64), buffer_depth=(1, 2, 3)
    )
    problem = TilingProblem(shape, machine, space, wave_model=wave_model)
    picks = explore_problem(problem, _belief(machine, 0.5), 5, ShortlistMode.EXPLORE, seed=seed)
    assert picks is not None
    best = optimize_tiling(problem, top_k=1).best
    assert picks.tilings[0] == best.tiling
    assert picks.tilings[0] == brute_force_ranking(shape, machine, space, 2, wave_model)[0].tiling
    assert len(set(picks.tilings)) == len(picks.tilings) == 5
    for tiling, low, high in zip(
        picks.tilings, picks.interval_low_us, picks.interval_high_us, strict=True
    ):
        assert tiling.shared_memory_bytes(2) <= machine.shared_memory_per_block_bytes
        assert low <= high
        assert simulate(shape, tiling, machine, wave_model).overall_time_ns > 0


def test_a_confident_belief_explores_nothing_and_a_wide_one_spreads() -> None:
    problem = TilingProblem(GemmShape(4096, 2048, 4096), BASE, SearchSpace())
    exploit = [c.tiling for c in optimize_tiling(problem, top_k=5).candidates]
    confident = explore_problem(problem, _belief(BASE, 1e-6), 5, ShortlistMode.EXPLORE)
    assert confident is not None
    assert confident.probability_best[0] == 1.0
    assert list(confident.tilings) == exploit
    wide = explore_problem(problem, _belief(BASE, 1.0), 5, ShortlistMode.EXPLORE)
    assert wide is not None
    assert wide.tilings[0] == exploit[0]
    assert sum(wide.probability_best) <= 1.0 + 1e-9
    assert sum(p > 0 for p in wide.probability_best) >= 3  # several regimes could win
    exploit_mode = explore_problem(problem, _belief(BASE, 1.0), 5, ShortlistMode.EXPLOIT)
    assert exploit_mode is not None and list(exploit_mode.tilings) == exploit
