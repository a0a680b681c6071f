"""The MAP fit under the async-copy pipeline model: runs simulated stage by stage with
perfmodel.pipelines.async_copy.recurrences.simulate_async (the recurrences, not the closed form
the fit uses), figures recovered, held-out runs predicted; the residual model against the simulator
and its Jacobian against finite differences."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from perfmodel.calibration import GemmWsMeasurement, apply_gemm_ws, fit_gemm_ws
from perfmodel.calibration.gemm_ws import predict_gemm_ws_interval_us
from perfmodel.calibration.gemm_ws_model import internal_values
from perfmodel.calibration.records import GEMM_WS_FIGURES
from perfmodel.errors import CalibrationInputError
from perfmodel.gemm_ws import ELEMENT_BYTES, GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.pipelines.async_copy import AsyncCopyPipeline
from perfmodel.pipelines.async_copy.calibration import async_closed_form_model
from perfmodel.pipelines.async_copy.recurrences import simulate_async
from tests.calibration_cases import BASE, TIME_SCALE, draw_dimension, log_uniform

#: an SM of compute capability 8.6 (CUDA C++ Programming Guide, technical specifications):
#: 16 resident CTAs, 100 KB of shared memory, 1536 threads, 64 K registers
LIMITS = SmLimits(16, 102400, 65536, 1536)
ASYNC = AsyncCopyPipeline(LIMITS)
TILES = (16, 32, 64, 128, 256)


def _truth(rng: np.random.Generator) -> GemmWsMachine:
    return dataclasses.replace(
        BASE,
        t_init_us=rng.uniform(1.0, 5.0),
        t_epilogue_us=rng.uniform(0.5, 3.0),
        load_startup_latency_us=rng.uniform(0.3, 2.0),
        compute_startup_latency_us=rng.uniform(0.05, 0.5),
        load_throughput_elements_per_us=log_uniform(rng, 200.0, 4000.0),
        compute_throughput_macs_per_us=log_uniform(rng, 2e3, 4e4),
    )


def _slow(machine: GemmWsMachine) -> GemmWsMachine:
    """``machine`` TIME_SCALE times slower: integer ns become picoseconds (see
    tests/calibration_cases.py)."""
    return dataclasses.replace(
        machine,
        t_init_us=machine.t_init_us * TIME_SCALE,
        t_epilogue_us=machine.t_epilogue_us * TIME_SCALE,
        load_startup_latency_us=machine.load_startup_latency_us * TIME_SCALE,
        compute_startup_latency_us=machine.compute_startup_latency_us * TIME_SCALE,
        load_throughput_elements_per_us=machine.load_throughput_elements_per_us / TIME_SCALE,
        compute_throughput_macs_per_us=machine.compute_throughput_macs_per_us / TIME_SCALE,
    )


def _simulated_us(run: GemmWsMeasurement, machine: GemmWsMachine, limits: SmLimits) -> float:
    shape = GemmShape(run.m, run.n, run.k)
    tiling = Tiling(run.tile_m, run.tile_n, run.tile_k, run.buffer_depth)
    limits = dataclasses.replace(
        limits, threads_per_cta=run.threads_per_cta, registers_per_thread=run.registers_per_thread
    )
    sim = simulate_async(shape, tiling, _slow(machine), limits, ELEMENT_BYTES[run.dtype])
    return sim.overall_time_ns / 1000 / TIME_SCALE


def _runs(rng: np.random.Generator, count: int, threads: bool = False) -> list[GemmWsMeasurement]:
    """Random problems and tilings that fit one CTA on an SM of LIMITS and the A6000's
    shared memory per block; depths 1-5; measured time left at 1 (filled by _measure)."""
    out: list[GemmWsMeasurement] = []
    assert BASE.shared_memory_per_block_bytes is not None
    while len(out) < count:
        tm, tn, tk = (int(rng.choice(TILES)) for _ in range(3))
        tiling = Tiling(tm, tn, tk, int(rng.integers(1, 6)))
        if tiling.shared_memory_bytes(2) > BASE.shared_memory_per_block_bytes:
            continue
        m, n, k = draw_dimension(rng), draw_dimension(rng), draw_dimension(rng)
        thread_count = int(rng.choice([128, 256, 512])) if threads else None
        out.append(
            GemmWsMeasurement(
                m, n, k, "fp16", tm, tn, tk, tiling.buffer_depth, 1.0, threads_per_cta=thread_count
            )
        )
    return out


def _measure(
    runs: list[GemmWsMeasurement],
    truth: GemmWsMachine,
    rng: np.random.Generator,
    noise: float = 0.0,
) -> list[GemmWsMeasurement]:
    return [
        dataclasses.replace(
            r,
            measured_time_us=_simulated_us(r, truth, LIMITS)
            * (math.exp(rng.normal(0.0, noise)) if noise else 1.0),
        )
        for r in runs
    ]


@pytest.mark.parametrize("seed", range(3))
def test_noise_free_async_runs_recover_every_figure_and_predict_held_out_runs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    truth = _truth(rng)
    data = _measure(_runs(rng, 40, threads=seed == 2), truth, rng)
    result = fit_gemm_ws(BASE, data, seed=seed, pipeline=ASYNC, folds=0)
    assert "async-copy" in result.method
    assert [f.identifiable for f in result.fitted] == [True] * 6
    for f in result.fitted:
        assert f.value == pytest.approx(getattr(truth, f.name), rel=0.01), f.name
    assert result.training_error.max_abs_pct <= 0.2
    # runs it never saw, predicted by the calibrated machine through the service's own
    # integer-ns closed form (predict_gemm_ws_interval_us's MAP prediction)
    held = _measure(_runs(rng, 30, threads=seed == 2), truth, rng)
    predicted, low, high = predict_gemm_ws_interval_us(BASE, result, held, pipeline=ASYNC)
    errors = [abs(p / r.measured_time_us - 1) for p, r in zip(predicted, held, strict=True)]
    assert max(errors) <= 0.005
    assert np.all(low <= predicted) and np.all(predicted <= high)


def test_three_percent_noise_predicts_held_out_async_runs_within_five_percent() -> None:
    rng = np.random.default_rng(7)
    truth = _truth(rng)
    data = _measure(_runs(rng, 40), truth, rng, noise=0.03)
    result = fit_gemm_ws(BASE, data, folds=0, pipeline=ASYNC)
    calibrated = apply_gemm_ws(BASE, result)
    held = _measure(_runs(rng, 40), truth, rng)
    errors = [abs(_simulated_us(r, calibrated, LIMITS) / r.measured_time_us - 1) for r in held]
    assert sum(errors) / len(errors) <= 0.05


def test_async_data_fitted_with_the_paper_model_fit_worse_than_with_their_own() -> None:
    rng = np.random.default_rng(11)
    truth = _truth(rng)
    data = _measure(_runs(rng, 40), truth, rng)
    own = fit_gemm_ws(BASE, data, folds=0, pipeline=ASYNC)
    paper = fit_gemm_ws(BASE, data, folds=0)
    assert own.training_error.mean_abs_pct < 0.2 < paper.training_error.mean_abs_pct


def test_residual_model_matches_the_simulator_and_its_jacobian_finite_differences() -> None:
    rng = np.random.default_rng(3)
    truth = _truth(rng)
    runs = _measure(_runs(rng, 60, threads=True), truth, rng)
    model = async_closed_form_model(BASE, runs, GEMM_WS_FIGURES, LIMITS)
    x = internal_values(truth, GEMM_WS_FIGURES)
    predicted = model.predict(x)
    measured = np.array([r.measured_time_us for r in runs])
    # the float closed form against the picosecond simulator: equal up to the rounding of
    # each duration to a picosecond
    assert np.allclose(predicted, measured, rtol=1e-5)
    jac = model.jacobian(x)
    for j in range(6):
        step = x[j] * 1e-5
        up, down = x.copy(), x.copy()
        up[j] += step
        down[j] -= step
        numeric = (model.predict(up) - model.predict(down)) / (2 * step)
        # a run on a kink (d = T, or the two branches of M(S) equal) has two one-sided
        # slopes; the analytic one must be one of them
        one_sided = (model.predict(up) - predicted) / step, (predicted - model.predict(down)) / step
        close = np.isclose(jac[:, j], numeric, rtol=1e-3)
        on_kink = np.isclose(jac[:, j], one_sided[0], rtol=1e-3) | np.isclose(
            jac[:, j], one_sided[1], rtol=1e-3
        )
        assert np.all(close | on_kink), GEMM_WS_FIGURES[j]


def test_threads_per_cta_limit_the_ctas_sharing_an_sm() -> None:
    run = GemmWsMeasurement(4096, 4096, 1024, "fp16", 32, 32, 32, 2, 1.0)
    few = dataclasses.replace(run, threads_per_cta=768)  # 1536 / 768 = 2 CTAs per SM
    model = async_closed_form_model(BASE, [run, few], GEMM_WS_FIGURES, LIMITS)
    # 32x32x32 at depth 2 needs 8 KB: 12 fit the shared memory, 16 the block cap
    assert model.ctas_per_sm().tolist() == [12, 2]


def test_a_tiling_no_sm_can_hold_is_refused_naming_the_run() -> None:
    runs = [
        GemmWsMeasurement(1024, 1024, 1024, "fp16", 64, 64, 32, 2, 10.0),
        GemmWsMeasurement(1024, 1024, 1024, "fp16", 64, 64, 32, 2, 10.0, threads_per_cta=2048),
    ]
    with pytest.raises(CalibrationInputError) as caught:
        fit_gemm_ws(BASE, runs, pipeline=ASYNC, folds=0)
    assert caught.value.field == "measurements[1]"
