"""The calibration closed loop: the "true GPU" is the event simulator with hidden figures far from
the base profile (3x faster loads, 5x slower MATH); optimize -> measure the top 5 (+2 %
noise) -> fit -> optimize again. Oracle: the true optimum, solved with the hidden figures.
(bench/bench_closed_loop.py runs 100 problems.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfmodel.calibration import CalibrationInputError
from perfmodel.gemm_ws import GemmShape, Tiling, simulate
from solver import SearchSpace, TilingProblem, optimize_tiling
from solver.calibration_loop import calibration_loop
from solver.shortlist import ShortlistMode
from tests.calibration_cases import BASE, CLOSED_LOOP_TRUTH, LATENCY_BOUND_TRUTH, draw_dimension


def _true_time_ns(shape: GemmShape, tiling: Tiling, truth=CLOSED_LOOP_TRUTH) -> int:
    return simulate(shape, tiling, truth).overall_time_ns


def test_three_rounds_find_the_true_optimum_within_one_percent() -> None:
    rng = np.random.default_rng(2024)
    shapes = [GemmShape(*(draw_dimension(rng) for _ in range(3))) for _ in range(8)]
    noise = np.random.default_rng(7)

    def measure(shape: GemmShape, tiling: Tiling) -> float:
        return _true_time_ns(shape, tiling) / 1000 * math.exp(noise.normal(0.0, 0.02))

    problems = [TilingProblem(s, BASE, SearchSpace()) for s in shapes]
    result = calibration_loop(problems, measure)
    assert len(result.rounds) == 3
    assert [len(r.measured) for r in result.rounds] == [40, 40, 40]
    regrets = []
    for i, shape in enumerate(shapes):
        best = optimize_tiling(TilingProblem(shape, CLOSED_LOOP_TRUTH, SearchSpace()), top_k=1)
        regrets.append(
            [_true_time_ns(shape, t) / best.best.overall_time_ns - 1 for t in result.picks_of(i)]
        )
    before, after = [r[0] for r in regrets], [r[-1] for r in regrets]
    assert max(before) > 0.2  # the premise: the base figures pick badly
    assert all(r <= 0.01 for r in after), after
    fitted = {f.name: f for f in result.rounds[-1].calibration.fitted}
    assert fitted["compute_throughput_macs_per_us"].value == pytest.approx(
        CLOSED_LOOP_TRUTH.compute_throughput_macs_per_us, rel=0.05
    )


def test_problems_of_different_devices_are_refused() -> None:
    other = TilingProblem(GemmShape(512, 512, 512), CLOSED_LOOP_TRUTH, SearchSpace())
    same = TilingProblem(GemmShape(512, 512, 512), BASE, SearchSpace())
    with pytest.raises(CalibrationInputError) as info:
        calibration_loop([same, other], lambda s, t: 1.0)
    assert info.value.field == "problems[1]"
    with pytest.raises(CalibrationInputError) as info:
        calibration_loop([same], lambda s, t: 1.0, dtype="fp32")
    assert info.value.field == "dtype"


@pytest.mark.parametrize("truth", [CLOSED_LOOP_TRUTH, LATENCY_BOUND_TRUTH], ids=["far", "latency"])
def test_one_shape_learns_from_its_own_shortlists(truth) -> None:
    """Each shape's loop uses only its own runs (one tuning job), starting from wide
    priors around the base figures; the explore shortlists pin what the point estimate's own
    top 5 cannot (bench: 98/100 within 1 % after 3 rounds, bench/RESULTS.md). 10 shapes: at
    least 9 within 1 % of the true optimum after 3 rounds."""
    rng = np.random.default_rng(99)
    noise = np.random.default_rng(5)

    def measure(shape: GemmShape, tiling: Tiling) -> float:
        return _true_time_ns(shape, tiling, truth) / 1000 * math.exp(noise.normal(0.0, 0.02))

    within = 0
    for _ in range(10):
        shape = GemmShape(*(draw_dimension(rng) for _ in range(3)))
        loop = calibration_loop([TilingProblem(shape, BASE, SearchSpace())], measure)
        best = optimize_tiling(TilingProblem(shape, truth, SearchSpace()), top_k=1).best
        pick = loop.picks_of(0)[-1]
        within += _true_time_ns(shape, pick, truth) <= 1.01 * best.overall_time_ns
    assert within >= 9


def test_exploit_mode_measures_the_point_estimates_top_k() -> None:
    shape = GemmShape(2048, 1024, 4096)
    problem = TilingProblem(shape, BASE, SearchSpace())
    loop = calibration_loop(
        [problem], lambda s, t: _true_time_ns(s, t) / 1000, rounds=1, mode=ShortlistMode.EXPLOIT
    )
    top = optimize_tiling(problem, top_k=5).candidates
    assert [(m.tile_m, m.tile_n, m.tile_k, m.buffer_depth) for m in loop.rounds[0].measured] == [
        (c.tiling.tile_m, c.tiling.tile_n, c.tiling.tile_k, c.tiling.buffer_depth) for c in top
    ]
