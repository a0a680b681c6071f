"""Calibration, GeMM-WS: recovery of known figures from simulated measurements, identifiability,
determinism and the typed errors. Oracles: the hidden figures the data were simulated from,
and the event simulator (tests/calibration_cases.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from perfmodel.calibration import (
    CalibrationInputError,
    CalibrationResult,
    GemmWsMeasurement,
    apply_gemm_ws,
    check_gemm_ws_shared_memory,
    fit_gemm_ws,
    predict_gemm_ws_us,
)
from perfmodel.calibration.gemm_ws import predict_gemm_ws_interval_us
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, simulate
from tests.calibration_cases import BASE, draw_machine, draw_runs, measure, simulated_time_us


def _held_out_errors_pct(
    result: CalibrationResult, truth: GemmWsMachine, runs: list[tuple[GemmShape, Tiling]]
) -> list[float]:
    """|calibrated service prediction / true simulated time - 1| in percent."""
    calibrated = apply_gemm_ws(BASE, result)
    out = []
    for shape, t in runs:
        run = GemmWsMeasurement(
            shape.m, shape.n, shape.k, "fp16", t.tile_m, t.tile_n, t.tile_k, t.buffer_depth, 1.0
        )
        truth_us = simulated_time_us(shape, t, truth)
        out.append(100 * abs(predict_gemm_ws_us(calibrated, run) / truth_us - 1))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_noise_free_recovers_every_figure_within_half_a_percent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    truth = draw_machine(rng)
    result = fit_gemm_ws(BASE, measure(truth, draw_runs(rng, 40), rng), seed=seed)
    # 40 random tilings mix load- and compute-bound runs, depths 1-4 and wave counts, so the
    # six figures are all determined
    assert [f.identifiable for f in result.fitted] == [True] * 6
    for f in result.fitted:
        assert f.value == pytest.approx(getattr(truth, f.name), rel=0.005), f.name
        assert f.base_value == getattr(BASE, f.name)
    # the service's predictions (integer ns per duration) of the training runs ...
    assert result.training_error.max_abs_pct <= 0.1
    assert all(abs(r.error_pct) <= 0.1 for r in result.residuals)
    # ... and of 40 runs it never saw
    assert max(_held_out_errors_pct(result, truth, draw_runs(rng, 40))) <= 0.1
    assert result.cross_validation_error is not None
    assert result.cross_validation_error.max_abs_pct <= 0.1


@pytest.mark.parametrize("seed", range(5))
def test_three_percent_noise_predicts_held_out_runs_within_five_percent(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    truth = draw_machine(rng)
    data = measure(truth, draw_runs(rng, 40), rng, noise=0.03)
    result = fit_gemm_ws(BASE, data, folds=0, seed=seed)
    held_out = _held_out_errors_pct(result, truth, draw_runs(rng, 40))
    assert sum(held_out) / len(held_out) <= 5.0
    for f in result.fitted:
        assert f.standard_error is not None and f.standard_error > 0
        assert f.prior is not None
        if not f.identifiable:  # not determined by these noisy data: held by the prior
            assert abs(math.log(f.value / f.prior.median)) <= 2 * f.prior.sigma_log


def test_every_run_load_bound_leaves_the_compute_figures_unidentified() -> None:
    rng = np.random.default_rng(7)
    truth = dataclasses.replace(
        draw_machine(rng), load_throughput_elements_per_us=30.0, compute_throughput_macs_per_us=1e6
    )
    runs = draw_runs(rng, 40, depths=(2, 3, 4))
    measurements = measure(truth, runs, rng)
    for m in measurements:  # the premise: T_MATH < T_LOAD in every run
        sim = simulate(GemmShape(m.m, m.n, m.k), Tiling(m.tile_m, m.tile_n, m.tile_k, 2), truth)
        assert sim.load_bound
    result = fit_gemm_ws(BASE, measurements)
    compute = {"compute_throughput_macs_per_us", "compute_startup_latency_us"}
    for f in result.fitted:
        if f.name in compute:
            # no run sees them: they stay exactly where the prior holds them, as uncertain
            assert not f.identifiable
            assert f.prior is not None
            assert f.value == pytest.approx(f.prior.median, rel=1e-6)
            assert f.posterior_sd_log == pytest.approx(f.prior.sigma_log, rel=1e-3)
        else:
            assert f.identifiable
            assert f.value == pytest.approx(getattr(truth, f.name), rel=0.005)
    assert any("compute_throughput_macs_per_us" in w for w in result.warnings)
    assert any("load-bound" in w for w in result.warnings)
    # the figures it did fit still predict new load-bound runs
    assert max(_held_out_errors_pct(result, truth, draw_runs(rng, 20, depths=(2, 3)))) <= 0.1


def test_single_wave_runs_cannot_separate_t_init_from_t_epilogue() -> None:
    """With W = 1 everywhere the time is ... + T_EPILOGUE + T_INIT: only the sum is seen."""
    rng = np.random.default_rng(3)
    truth = draw_machine(rng)
    runs = []
    while len(runs) < 30:
        (shape, tiling), *_ = draw_runs(rng, 1)
        shape = GemmShape(tiling.tile_m * int(rng.integers(1, 7)), tiling.tile_n * 2, shape.k)
        runs.append((shape, tiling))  # at most 6 x 2 = 12 output tiles: one wave on 84 SMs
    result = fit_gemm_ws(BASE, measure(truth, runs, rng), folds=0)
    by_name = {f.name: f for f in result.fitted}
    for name in ("t_init_us", "t_epilogue_us"):
        assert not by_name[name].identifiable
    # ... but their sum is what every run sees, and the fit keeps it (no reset to the base)
    fitted_sum = by_name["t_init_us"].value + by_name["t_epilogue_us"].value
    assert fitted_sum == pytest.approx(truth.t_init_us + truth.t_epilogue_us, rel=0.005)
    assert any("1 t_init_us + 1 t_epilogue_us" in c for c in result.determined_combinations), (
        result.determined_combinations
    )
    assert any("t_init_us" in w and "t_epilogue_us" in w for w in result.warnings)
    for name in ("load_throughput_elements_per_us", "compute_throughput_macs_per_us"):
        assert by_name[name].identifiable
        assert by_name[name].value == pytest.approx(getattr(truth, name), rel=0.005)


@pytest.mark.parametrize("runs", [1, 2, 3, 5])
def test_a_few_runs_are_reproduced_and_the_rest_stays_at_the_priors(runs: int) -> None:
    """Any number of runs >= 1 is a fit. Noise-free runs are reproduced within the
    noise the fit assumes (3 % where the runs are too few to tell it: they leave no residual
    degree of freedom); what they do not determine stays within a prior sd of the median."""
    rng = np.random.default_rng(40 + runs)
    truth = draw_machine(rng)
    result = fit_gemm_ws(BASE, measure(truth, draw_runs(rng, runs), rng), folds=0)
    assert result.noise_pct is not None and result.noise_pct <= 3.05
    assert result.training_error.max_abs_pct <= result.noise_pct
    assert result.effective_figures is not None and result.effective_figures <= runs + 1e-6
    for f in result.fitted:
        assert f.prior is not None
        if not f.identifiable:
            assert abs(math.log(f.value / f.prior.median)) <= f.prior.sigma_log, f.name
    for r in result.residuals:
        assert r.predicted_low is not None and r.predicted_high is not None
        assert r.predicted_low <= r.predicted * (1 + 1e-9)
        assert r.predicted_high >= r.predicted * (1 - 1e-9)


def test_subset_fit_keeps_the_other_figures_and_apply_replaces_only_fitted_ones() -> None:
    rng = np.random.default_rng(11)
    truth = dataclasses.replace(
        BASE, load_throughput_elements_per_us=400.0, compute_throughput_macs_per_us=9000.0
    )
    names = ["compute_throughput_macs_per_us", "load_throughput_elements_per_us"]
    result = fit_gemm_ws(BASE, measure(truth, draw_runs(rng, 12), rng), fit=names, folds=3)
    assert [f.name for f in result.fitted] == names
    assert result.figure("load_throughput_elements_per_us").value == pytest.approx(400.0, 1e-5)
    calibrated = apply_gemm_ws(BASE, result)
    assert calibrated.compute_throughput_macs_per_us == pytest.approx(9000.0, rel=1e-5)
    assert (
        dataclasses.replace(
            calibrated,
            load_throughput_elements_per_us=BASE.load_throughput_elements_per_us,
            compute_throughput_macs_per_us=BASE.compute_throughput_macs_per_us,
        )
        == BASE
    )
    assert len(result.residuals) == 12 and len(result.cross_validation_residuals) == 12
    assert [r.index for r in result.residuals] == list(range(12))


def test_more_folds_than_measurements_is_leave_one_out() -> None:
    result = fit_gemm_ws(BASE, _data(), fit=["t_init_us"], folds=20)
    assert any("leave-one-out (8 folds)" in w for w in result.warnings)
    assert len(result.cross_validation_residuals) == 8


def test_same_inputs_give_the_same_result() -> None:
    rng = np.random.default_rng(5)
    data = measure(draw_machine(rng), draw_runs(rng, 30), rng, noise=0.03)
    assert fit_gemm_ws(BASE, data, seed=1) == fit_gemm_ws(BASE, list(data), seed=1)


def test_a_wild_outlier_is_down_weighted_by_the_robust_loss() -> None:
    rng = np.random.default_rng(9)
    truth = draw_machine(rng)
    data = measure(truth, draw_runs(rng, 40), rng)
    data[5] = dataclasses.replace(data[5], measured_time_us=data[5].measured_time_us * 3)
    result = fit_gemm_ws(BASE, data, folds=0)
    for name in ("load_throughput_elements_per_us", "compute_throughput_macs_per_us"):
        assert result.figure(name).value == pytest.approx(getattr(truth, name), rel=0.02)
    assert result.residuals[5].error_pct == pytest.approx(100 * (1 / 3 - 1), abs=2)


# ---- bad input: typed errors naming the field, saying how to fix it --------------------------

_GOOD = GemmWsMeasurement(1024, 1024, 1024, "fp16", 128, 128, 64, 2, 500.0)


def _data(n: int = 8, **change: object) -> list[GemmWsMeasurement]:
    """n valid measurements (varied tilings); ``change`` is applied to measurement 2."""
    tiles = [(64, 64, 32), (128, 64, 64), (64, 128, 32), (128, 128, 64), (32, 64, 64)]
    out = [
        dataclasses.replace(_GOOD, tile_m=tm, tile_n=tn, tile_k=tk, measured_time_us=100.0 + i)
        for i, (tm, tn, tk) in enumerate(tiles * (n // len(tiles) + 1))
    ][:n]
    if change:
        out[2] = dataclasses.replace(out[2], **change)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        # a time that is not a positive finite number
        ({"measurements": _data(measured_time_us=0.0)}, "measurements[2].measured_time_us", "> 0"),
        ({"measurements": _data(measured_time_us=-3.0)}, "measurements[2].measured_time_us", "> 0"),
        (
            {"measurements": _data(measured_time_us=math.nan)},
            "measurements[2].measured_time_us",
            "",
        ),
        (
            {"measurements": _data(measured_time_us=math.inf)},
            "measurements[2].measured_time_us",
            "",
        ),
        # invalid tilings and shapes
        ({"measurements": _data(tile_m=0)}, "measurements[2].tile_m", "at least 1"),
        ({"measurements": _data(buffer_depth=0)}, "measurements[2].buffer_depth", "at least 1"),
        ({"measurements": _data(k=2.5)}, "measurements[2].k", "whole number"),
        ({"measurements": _data(tile_n=True)}, "measurements[2].tile_n", "whole number"),
        ({"measurements": _data(dtype="fp64")}, "measurements[2].dtype", "fp16"),
        ({"measurements": _data(2), "fit": ["t_init_us", "t_epilogue_us", "mu"]}, "fit", "mu"),
        ({"measurements": _data(2), "fit": ["t_init_us", "t_epilogue_us", "t_init_us"]}, "fit", ""),
        ({"measurements": []}, "measurements", "at least one"),
        # unknown figure names, listing the valid ones
        ({"fit": ["load_throughput"]}, "fit", "load_throughput_elements_per_us"),
        ({"fit": []}, "fit", "at least one"),
        ({"fit": "t_init_us"}, "fit", "list"),
        # folds: 0 (off) or 2..n
        ({"folds": 1}, "folds", "0 (no cross-validation) or at least 2"),
        ({"folds": -2}, "folds", "at least 2"),
        ({"seed": -1}, "seed", ">= 0"),
    ],
)
def test_bad_arguments_raise_typed_errors_naming_the_field(
    kwargs: dict[str, object], field: str, says: str
) -> None:
    args: dict[str, object] = {"measurements": _data()} | kwargs
    with pytest.raises(CalibrationInputError) as info:
        fit_gemm_ws(BASE, **args)  # type: ignore[arg-type]
    assert info.value.field == field
    assert says in info.value.reason


def test_shared_memory_check_names_the_run_that_cannot_fit() -> None:
    fits = _GOOD  # (128x64 + 64x128) x 2 bytes x 2 stages = 64 KiB
    too_deep = dataclasses.replace(_GOOD, buffer_depth=4)  # 128 KiB > 99 KiB
    check_gemm_ws_shared_memory(BASE, [fits, fits])
    with pytest.raises(CalibrationInputError) as info:
        check_gemm_ws_shared_memory(BASE, [fits, too_deep])
    assert info.value.field == "measurements[1]"
    assert "131072" in info.value.reason and "101376" in info.value.reason
    check_gemm_ws_shared_memory(
        dataclasses.replace(BASE, shared_memory_per_block_bytes=None), [too_deep]
    )


def test_apply_refuses_a_result_of_the_other_model() -> None:
    result = fit_gemm_ws(BASE, _data(), fit=["t_init_us"], folds=0)
    with pytest.raises(CalibrationInputError, match="gemm-ws"):
        apply_gemm_ws(BASE, dataclasses.replace(result, model="many-bsp"))


def test_three_percent_noise_intervals_cover_the_truth_about_as_often_as_they_say() -> None:
    """With 3 % noise the 10-90 % posterior intervals of held-out runs contain the
    true (noise-free) time for 70-90 % of them (pooled over 10 devices and 400 runs), and the
    held-out mean error stays within 4 %."""
    covered, errors = [], []
    for seed in range(10):
        rng = np.random.default_rng(100 + seed)
        truth = draw_machine(rng)
        result = fit_gemm_ws(BASE, measure(truth, draw_runs(rng, 40), rng, noise=0.03), folds=0)
        held_out = draw_runs(rng, 40)
        runs = [
            GemmWsMeasurement(
                s.m, s.n, s.k, "fp16", t.tile_m, t.tile_n, t.tile_k, t.buffer_depth, 1.0
            )
            for s, t in held_out
        ]
        predicted, low, high = predict_gemm_ws_interval_us(BASE, result, runs)
        true = np.array([simulated_time_us(s, t, truth) for s, t in held_out])
        covered += list((low <= true) & (true <= high))
        errors += list(np.abs(predicted / true - 1) * 100)
    assert 0.70 <= float(np.mean(covered)) <= 0.90
    assert float(np.mean(errors)) <= 4.0


def test_latency_bound_runs_determine_only_combinations_and_still_predict() -> None:
    """Every stage latency-bound, so the stage time is (within 1 %) the same for
    every tile (2 load startups): the runs see combinations of latencies, hardly the
    throughputs.
    Training error < 0.1 %, new runs of the same kind within 0.5 %."""
    rng = np.random.default_rng(5)
    truth = dataclasses.replace(
        draw_machine(rng),
        load_throughput_elements_per_us=1e6,
        compute_throughput_macs_per_us=1e9,
        load_startup_latency_us=2.0,
        compute_startup_latency_us=0.5,
    )
    result = fit_gemm_ws(BASE, measure(truth, draw_runs(rng, 30, depths=(2, 3, 4)), rng))
    assert result.training_error.max_abs_pct < 0.1
    by_name = {f.name: f for f in result.fitted}
    for name in ("compute_throughput_macs_per_us", "compute_startup_latency_us"):
        assert not by_name[name].identifiable  # MATH hides behind the loads' latency
    assert max(_held_out_errors_pct(result, truth, draw_runs(rng, 20, depths=(2, 3)))) <= 0.5
