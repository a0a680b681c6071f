"""The closed form the GeMM-WS fit works on, against the event simulator and against
finite differences of itself (its Jacobian is written by hand per regime)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.calibration import GEMM_WS_FIGURES, GemmWsMeasurement, predict_gemm_ws_us
from perfmodel.calibration.gemm_ws_model import closed_form_model, internal_values
from perfmodel.gemm_ws import GemmShape, Tiling, WaveTimeModel, simulate
from tests.calibration_cases import draw_machine, draw_runs, simulated_time_us


def _runs(seed: int, count: int) -> list[GemmWsMeasurement]:
    rng = np.random.default_rng(seed)
    return [
        GemmWsMeasurement(s.m, s.n, s.k, "fp16", t.tile_m, t.tile_n, t.tile_k, t.buffer_depth, 1.0)
        for s, t in draw_runs(rng, count)
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(WaveTimeModel))
def test_float_closed_form_matches_the_simulator_at_picosecond_resolution(
    seed: int, wave_model: WaveTimeModel
) -> None:
    rng = np.random.default_rng(seed)
    machine = draw_machine(rng)
    runs = _runs(seed, 25)
    model = closed_form_model(machine, runs, GEMM_WS_FIGURES, wave_model)
    predicted = model.predict(internal_values(machine, GEMM_WS_FIGURES))
    oracle = [
        simulated_time_us(
            GemmShape(r.m, r.n, r.k),
            Tiling(r.tile_m, r.tile_n, r.tile_k, r.buffer_depth),
            machine,
            wave_model,
        )
        for r in runs
    ]
    np.testing.assert_allclose(predicted, oracle, rtol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_service_prediction_is_the_simulators_overall_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    machine = draw_machine(rng)
    for r in _runs(seed, 20):
        shape, tiling = (
            GemmShape(r.m, r.n, r.k),
            Tiling(r.tile_m, r.tile_n, r.tile_k, r.buffer_depth),
        )
        expected = simulate(shape, tiling, machine).overall_time_ns / 1000
        assert predict_gemm_ws_us(machine, r) == expected


@pytest.mark.parametrize("wave_model", list(WaveTimeModel))
@pytest.mark.parametrize("seed", range(6))
def test_jacobian_matches_central_differences(seed: int, wave_model: WaveTimeModel) -> None:
    rng = np.random.default_rng(seed)
    machine = draw_machine(rng)
    model = closed_form_model(machine, _runs(seed, 30), GEMM_WS_FIGURES, wave_model)
    x = internal_values(machine, GEMM_WS_FIGURES)
    jac = model.jacobian(x)
    for j in range(len(x)):
        # piecewise linear: any step that crosses no L = T kink gives the exact slope
        h = 1e-4 * (abs(x[j]) if j < 2 else max(abs(x[j]), 1e-2))  # 1/throughputs are tiny
        up, down = x.copy(), x.copy()
        up[j] += h
        down[j] -= h
        numeric = (model.predict(up) - model.predict(down)) / (2 * h)
        np.testing.assert_allclose(jac[:, j], numeric, rtol=1e-6, atol=1e-9 * abs(numeric).max())
