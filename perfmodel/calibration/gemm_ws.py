"""GeMM-WS calibration: fit the §2.2 machine figures to measured GEMM times.

The fit runs on the closed form of gemm_ws_model.py (piecewise linear in 1/throughputs and
latencies); residuals are reported with the service's own integer-nanosecond model,
:func:`predict_gemm_ws_us`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from perfmodel.belief import Posterior, Prior, interval_of
from perfmodel.calibration import engine, validate
from perfmodel.calibration.engine import (
    FigureSpec,
    FitProblem,
    FloatArray,
    IntArray,
    figure_specs,
    internal_of,
    theta_of,
)
from perfmodel.calibration.gemm_ws_model import (
    THROUGHPUTS,
    shape_and_tiling,
)
from perfmodel.calibration.records import (
    GEMM_WS_FIGURES,
    GEMM_WS_MODEL,
    CalibrationResult,
    GemmWsMeasurement,
)
from perfmodel.calibration.run import calibrate, identifiable_values
from perfmodel.errors import CalibrationInputError
from perfmodel.gemm_ws import (
    ELEMENT_BYTES,
    GemmWsMachine,
    WaveTimeModel,
    scaled_throughputs,
    simulate_closed_form,
)
from perfmodel.pipeline import PipelineModel, PipelineResiduals, RunsToFit
from perfmodel.pipelines.paper import PaperPipeline

#: multistart: the prior medians, the base figures, then draws from the prior
N_STARTS = 8
#: how every GeMM-WS fit runs; the pipeline model adds its closed form
METHOD_PREFIX = (
    "maximum a posteriori: scipy.optimize.least_squares (trf) over ln(figures), Cauchy loss "
    "on relative error at an estimated noise scale plus log-normal prior residuals; "
    f"{N_STARTS} starts; Laplace posterior; "
)
#: a latency whose base value is 0 ("negligible", §4.2.3) gets a median of 10 ns and a wide
#: spread: ln(0) has no prior, and 10 ns per stage is as negligible as 0 at GPU scale
ZERO_LATENCY_PRIOR = Prior(
    0.01, 3.0, "base value 0 (negligible): 10 ns, wide (docs/model-notes.md)"
)


def predict_gemm_ws_us(
    machine: GemmWsMachine,
    run: GemmWsMeasurement,
    wave_time_model: WaveTimeModel = WaveTimeModel.PAPER,
) -> float:
    """The service's prediction of ``run`` in microseconds: :func:`perfmodel.gemm_ws.simulate`'s
    overall time, computed in O(1) from the closed form."""
    shape, tiling = shape_and_tiling(run)
    return simulate_closed_form(shape, tiling, machine, wave_time_model).overall_time_ns / 1000


def check_measurement(measurement: GemmWsMeasurement, prefix: str) -> None:
    """Types and ranges of one measurement; errors name ``prefix`` + the field."""
    for name in ("m", "n", "k", "tile_m", "tile_n", "tile_k", "buffer_depth"):
        validate.whole(getattr(measurement, name), f"{prefix}{name}")
    if measurement.dtype not in ELEMENT_BYTES:
        raise CalibrationInputError(
            f"{prefix}dtype",
            f"unknown dtype {measurement.dtype!r}; choose from: " + ", ".join(ELEMENT_BYTES),
        )
    validate.positive_time(measurement.measured_time_us, f"{prefix}measured_time_us")


def shared_memory_excess(
    machine: GemmWsMachine, measurements: Sequence[GemmWsMeasurement]
) -> list[tuple[int, int]]:
    """(index, bytes needed) of every measurement whose circular buffer does not fit the
    device's shared memory per block (none when the machine has no limit)."""
    limit = machine.shared_memory_per_block_bytes
    if limit is None:
        return []
    out = []
    for i, m in enumerate(measurements):
        need = shape_and_tiling(m)[1].shared_memory_bytes(ELEMENT_BYTES[m.dtype])
        if need > limit:
            out.append((i, need))
    return out


def check_gemm_ws_shared_memory(
    machine: GemmWsMachine, measurements: Sequence[GemmWsMeasurement]
) -> None:
    """Raise for the first measurement whose tiling needs more shared memory per block than
    ``machine`` allows (such a run cannot have run on that device as described)."""
    for i, need in shared_memory_excess(machine, measurements)[:1]:
        m = measurements[i]
        raise CalibrationInputError(
            f"measurements[{i}]",
            f"tiling {m.tile_m}x{m.tile_n}x{m.tile_k} with buffer depth {m.buffer_depth} "
            f"needs {need} bytes of {m.dtype} shared memory, above the device's "
            f"{machine.shared_memory_per_block_bytes}: check the tiling, or the device's "
            "shared_memory_per_block_bytes",
        )


def default_priors(base: GemmWsMachine, names: Sequence[str]) -> dict[str, Prior]:
    """Priors for figures no profile cites one for: centred on the base values, wide."""
    return engine.default_priors(base, names, ZERO_LATENCY_PRIOR, THROUGHPUTS)


def machine_with(base: GemmWsMachine, values: dict[str, float]) -> GemmWsMachine:
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]


def fit_gemm_ws(
    base: GemmWsMachine,
    measurements: Sequence[GemmWsMeasurement],
    *,
    fit: Sequence[str] | None = None,
    folds: int = 5,
    wave_time_model: WaveTimeModel = WaveTimeModel.PAPER,
    seed: int = 0,
    priors: Mapping[str, Prior] | None = None,
    dtype_ratios: Mapping[str, tuple[float, float]] | None = None,
    pipeline: PipelineModel | None = None,
    warm_start: Mapping[str, float] | None = None,
) -> CalibrationResult:
    """The MAP fit of ``fit`` (default: all of GEMM_WS_FIGURES) of ``base`` to measured times.

    ``priors`` by figure name (missing ones: :func:`default_priors`); ``dtype_ratios``: per
    dtype, (load, compute) throughput relative to ``base``'s reference figures. Any number of
    runs >= 1: what they determine is fitted, the rest stays where the priors hold it.
    ``folds`` > 0 adds k-fold cross-validation (0 turns it off). Deterministic in ``seed``.
    ``pipeline``: the model the runs are predicted with (its closed form, residuals and
    Jacobian; default: the paper's eq. (1)-(3) under ``wave_time_model``). ``warm_start``:
    each fitted figure's value from an earlier fit to runs these extend, where the fit starts
    (``perfmodel.calibration.run.calibrate``).
    """
    measurements = list(measurements)
    names, k, fold_warnings = validate.fit_arguments(
        fit, GEMM_WS_FIGURES, len(measurements), folds, seed
    )
    for i, m in enumerate(measurements):
        check_measurement(m, f"measurements[{i}].")
    model_of_runs: PipelineModel = pipeline or PaperPipeline(WaveTimeModel(wave_time_model))
    measured = np.array([m.measured_time_us for m in measurements], dtype=np.float64)
    ratios = dict(dtype_ratios or {})
    priors = {**default_priors(base, names), **(priors or {})}
    specs = figure_specs(base, names, priors, THROUGHPUTS)
    model = model_of_runs.residual_model(RunsToFit(base, measurements, names, ratios))

    def report(x: FloatArray, rows: IntArray) -> FloatArray:
        values = {s.name: s.to_value(float(xi)) for s, xi in zip(specs, x, strict=True)}
        predict = _Predictor(machine_with(base, values), model_of_runs, ratios)
        return np.array([predict(measurements[i]) for i in rows], dtype=np.float64)

    excess = [i for i, _ in shared_memory_excess(base, measurements)]
    warnings = (
        [
            f"{len(excess)} measurements need more shared memory per block than the base "
            f"device's {base.shared_memory_per_block_bytes} bytes (measurements "
            + ", ".join(map(str, excess[:10]))
            + (", ..." if len(excess) > 10 else "")
            + "): check their tilings or the device's limit"
        ]
        if excess
        else []
    )
    problem = FitProblem(model, measured, specs, N_STARTS, report)
    result = calibrate(
        problem,
        model_name=GEMM_WS_MODEL,
        folds=k,
        seed=seed,
        method=METHOD_PREFIX + model_of_runs.calibration_method,
        unit="us",
        warnings=[*fold_warnings, *warnings],
        warm_start=None if warm_start is None else theta_of(specs, warm_start),
    )
    return _with_regime_warning(result, model, specs, model_of_runs.regime_runs)


def predict_run_us(
    machine: GemmWsMachine,
    run: GemmWsMeasurement,
    pipeline: PipelineModel | None = None,
    ratios: Mapping[str, tuple[float, float]] | None = None,
) -> float:
    """The service's own integer-ns prediction of ``run`` under ``pipeline`` (default: the
    paper's) in us, on ``machine``'s reference figures scaled by the run dtype's ``ratios``
    (absent: 1)."""
    chosen: PipelineModel = pipeline or PaperPipeline()
    return _Predictor(machine, chosen, ratios or {})(run)


class _Predictor:
    """:func:`predict_run_us` for many runs on one machine: one machine per dtype."""

    def __init__(
        self,
        machine: GemmWsMachine,
        pipeline: PipelineModel,
        ratios: Mapping[str, tuple[float, float]],
    ) -> None:
        self._machine, self._pipeline, self._ratios = machine, pipeline, ratios
        self._machines: dict[str, GemmWsMachine] = {}

    def __call__(self, run: GemmWsMeasurement) -> float:
        if run.dtype not in self._machines:
            ratio = self._ratios.get(run.dtype, (1.0, 1.0))
            self._machines[run.dtype] = scaled_throughputs(self._machine, ratio)
        shape, tiling = shape_and_tiling(run)
        return self._pipeline.run_time_ns(shape, tiling, self._machines[run.dtype], run) / 1000


def _with_regime_warning(
    result: CalibrationResult, model: PipelineResiduals, specs: Sequence[FigureSpec], which: str
) -> CalibrationResult:
    """Say so when every overlapped run is in one regime: then one throughput enters the
    predictions only through the first stage (or not at all)."""
    x = np.array([s.to_internal(f.value) for s, f in zip(specs, result.fitted, strict=True)])
    runs = model.overlapped_runs()
    bound = model.load_bound_runs(x)
    if runs == 0 or 0 < bound < runs:
        return result
    regime = "load-bound (T_LOAD > T_MATH)" if bound == runs else "compute-bound (T_MATH >= T_LOAD)"
    note = (
        f"all {runs} {which} are {regime} at the fitted figures: "
        "measure tilings of the other regime to pin the other throughput"
    )
    return dataclasses.replace(result, warnings=(*result.warnings, note))


def apply_gemm_ws(base: GemmWsMachine, result: CalibrationResult) -> GemmWsMachine:
    """``base`` with every fitted figure of ``result`` (its MAP value) in place."""
    values = identifiable_values(result, GEMM_WS_MODEL, GEMM_WS_FIGURES)
    return machine_with(base, values)


def predict_gemm_ws_interval_us(
    base: GemmWsMachine,
    result: CalibrationResult,
    runs: Sequence[GemmWsMeasurement],
    *,
    wave_time_model: WaveTimeModel = WaveTimeModel.PAPER,
    dtype_ratios: Mapping[str, tuple[float, float]] | None = None,
    draws: int = 128,
    seed: int = 0,
    pipeline: PipelineModel | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(MAP prediction, 10 %, 90 % quantile) in microseconds of each of ``runs`` (new ones,
    not the fit's) under the posterior of ``result``, a GeMM-WS fit of ``base``: draws through
    the closed form (of ``pipeline``, default the paper's), widened to contain the MAP prediction
    (docs/model-notes.md)."""
    names = [f.name for f in result.fitted]
    ratios = dict(dtype_ratios or {})
    chosen: PipelineModel = pipeline or PaperPipeline(WaveTimeModel(wave_time_model))
    model = chosen.residual_model(RunsToFit(base, runs, names, ratios))
    # for the coordinates only
    specs = figure_specs(base, names, default_priors(base, names), THROUGHPUTS)
    belief = Posterior(
        np.array(result.posterior_mean_log), np.array(result.posterior_covariance_log)
    )
    at_map = model.predict(internal_of(specs, belief.mean))
    samples = np.array(
        [
            model.predict(internal_of(specs, theta))
            for theta in belief.draws(np.random.default_rng(seed), draws)
        ]
    )
    return (at_map, *interval_of(samples, at_map))
