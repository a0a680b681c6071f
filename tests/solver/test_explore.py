"""Explore shortlists (issue 16): the enumeration's exact point order against the simulator
and the Z3 optimum, draws against the simulator, and the shortlist's contract."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.belief import FigureBelief, Prior
from perfmodel.gemm_ws import GemmShape, WaveTimeModel, simulate
from solver import SearchSpace, TilingProblem, optimize_tiling
from solver.bounds import triple_bounds
from solver.explore import configurations, draw_times_us, explore
from solver.shortlist import ShortlistMode
from tests.calibration_cases import BASE, draw_machine

FIGURES = (
    "load_throughput_elements_per_us",
    "compute_throughput_macs_per_us",
    "load_startup_latency_us",
    "t_init_us",
    "t_epilogue_us",
)


def _configs(shape: GemmShape, space: SearchSpace, machine, wave_model=WaveTimeModel.PAPER):
    bounds = triple_bounds(shape, machine, space, 2, wave_model)
    return configurations(bounds, space.buffer_depth, machine, wave_model)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("wave_model", list(WaveTimeModel))
def test_point_times_and_order_are_the_simulators_and_the_solvers(seed, wave_model) -> None:
    rng = np.random.default_rng(seed)
    machine = draw_machine(rng)
    shape = GemmShape(*(int(rng.integers(1, 40)) * 64 for _ in range(3)))
    space = SearchSpace(
        tile_m=(16, 32, 64, 128), tile_n=(32, 64, 256), tile_k=(16, 64), buffer_depth=(1, 2, 3)
    )
    configs = _configs(shape, space, machine, wave_model)
    sims = [simulate(shape, t, machine, wave_model) for t in configs.tilings]
    assert [s.overall_time_ns for s in sims] == configs.point_time_ns.tolist()
    best = optimize_tiling(TilingProblem(shape, machine, space, wave_model=wave_model), top_k=1)
    assert configs.tilings[configs.point_order[0]] == best.best.tiling
    ordered = [sims[i] for i in configs.point_order]
    keys = [(s.overall_time_ns, s.total_math_wait_ns) for s in ordered]
    assert keys == sorted(keys)
    # the draws' float closed form agrees with the simulator at the point figures, up to the
    # simulator's rounding of each duration to a nanosecond (times S x W)
    point = {n: np.array([getattr(machine, n)]) for n in FIGURES}
    drawn = draw_times_us(configs, point, machine, wave_model)[0]
    assert drawn == pytest.approx(configs.point_time_ns / 1000, rel=1e-3)


def test_a_confident_belief_explores_nothing_and_a_wide_one_spreads() -> None:
    shape = GemmShape(4096, 2048, 4096)
    space = SearchSpace()
    configs = _configs(shape, space, BASE)
    values = {n: float(getattr(BASE, n)) for n in FIGURES}

    def belief(sigma: float) -> FigureBelief:
        return FigureBelief.from_priors({n: Prior(values[n], sigma, "t") for n in FIGURES}, values)

    exploit = [configs.tilings[i] for i in configs.point_order[:5]]
    confident = explore(configs, belief(1e-6), BASE, WaveTimeModel.PAPER, 5, ShortlistMode.EXPLORE)
    assert confident.probability_best[0] == 1.0
    assert list(confident.tilings) == exploit
    wide = explore(configs, belief(1.0), BASE, WaveTimeModel.PAPER, 5, ShortlistMode.EXPLORE)
    assert wide.tilings[0] == exploit[0]
    assert sum(wide.probability_best) <= 1.0 + 1e-9
    assert sum(p > 0 for p in wide.probability_best) >= 3  # several regimes could win
    for low, high in zip(wide.interval_low_us, wide.interval_high_us, strict=True):
        assert 0 < low <= high
