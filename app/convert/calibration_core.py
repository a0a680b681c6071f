"""The calibration core's side of the conversions: stored runs -> the core's measurements,
the core's checks and fits, its result -> the response schema.

Worker-side only: this module imports :mod:`perfmodel.calibration` (numpy, scipy), which the
service's own process never loads; ``app/jobs.py`` imports it inside the calibration jobs.
Runs arrive as JSON documents (request order, or canonical order for a fit: see
``app/convert/calibrate.py``); errors name runs as the core does, ``measurements[3]``
(:func:`app.convert.calibrate.request_field` turns that into the request's terms).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from app.convert import configless_core
from app.convert.fields import shared_fields
from app.convert.optimize import dtype_ratios, gemm_ws_machine
from app.convert.predict import launch_to_core
from app.schemas.calibrate import (
    CalibrationFit,
    FigurePriorOut,
    FittedFigureOut,
    GemmWsMeasurementIn,
    ManyBspMeasurementIn,
    ResidualOut,
)
from device_profiles import DeviceProfile
from device_profiles.pipeline import sm_limits
from device_profiles.priors import gemm_ws_dtype_ratios, gemm_ws_priors, many_bsp_priors
from device_profiles.schema import CalibrationErrorSummary
from perfmodel.calibration import (
    GEMM_WS_FIGURES,
    CalibrationResult,
    ErrorSummary,
    FittedFigure,
    GemmWsMeasurement,
    ManyBspMeasurement,
    check_gemm_ws_shared_memory,
    fit_gemm_ws,
    fit_many_bsp,
    predict_many_bsp_cycles,
)
from perfmodel.errors import CalibrationInputError, ModelInputError
from perfmodel.gemm_ws import GemmWsMachine
from perfmodel.manybsp import DeviceFigures, device_from_profile
from perfmodel.pipelines import PipelineSettings, resolve


def gemm_ws_measurement(document: Mapping[str, Any]) -> GemmWsMeasurement:
    return GemmWsMeasurement(**GemmWsMeasurementIn.model_validate(document).model_dump())


def many_bsp_measurement(document: Mapping[str, Any], device: DeviceFigures) -> ManyBspMeasurement:
    run = ManyBspMeasurementIn.model_validate(document)
    return ManyBspMeasurement(launch_to_core(run, device), run.measured_cycles)


def gemm_ws_core(
    base: DeviceProfile, documents: Sequence[Mapping[str, Any]]
) -> tuple[GemmWsMachine, list[GemmWsMeasurement]]:
    """The core's GeMM-WS machine of ``base`` (every figure present: ``fit_ready``) and the
    runs."""
    return gemm_ws_machine(base), [gemm_ws_measurement(d) for d in documents]


def many_bsp_core(
    base: DeviceProfile, documents: Sequence[Mapping[str, Any]]
) -> tuple[DeviceFigures, list[ManyBspMeasurement]]:
    """The core's Many-BSP figures of ``base`` (every figure present: ``fit_ready``) and
    the runs, each a request on those figures."""
    device = device_from_profile(base, field_prefix="base_device")
    return device, [many_bsp_measurement(d, device) for d in documents]


def check_runs(model: str, base: DeviceProfile, documents: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a run that cannot have run on ``base`` as described, naming it: a GeMM-WS tiling
    whose buffer exceeds the device's shared memory per block, a Many-BSP launch the predictor
    cannot analyse on the device (bad PTX, a block over the device's limits, ...)."""
    if model == "gemm-ws" and configless_core.has_configless(documents):
        configless_core.check_configless(base, documents)
        return
    if model == "gemm-ws":
        machine, gemm_runs = gemm_ws_core(base, documents)
        for i, gemm_run in enumerate(gemm_runs):
            with _naming_run(i):
                dtype_ratios(base, gemm_run.dtype)
        check_gemm_ws_shared_memory(machine, gemm_runs)
        return
    device, kernel_runs = many_bsp_core(base, documents)
    for i, run in enumerate(kernel_runs):
        with _naming_run(i):
            predict_many_bsp_cycles(device, run.request)


@contextlib.contextmanager
def _naming_run(index: int) -> Iterator[None]:
    """A model input error of measured run ``index``, refused as that run's field."""
    try:
        yield
    except ModelInputError as exc:
        raise CalibrationInputError(f"measurements[{index}].{exc.field}", exc.reason) from None


def fit(
    model: str,
    base: DeviceProfile,
    documents: Sequence[Mapping[str, Any]],
    names: Sequence[str] | None,
    folds: int,
    pipeline_model: str | None = None,
    warm_from: DeviceProfile | None = None,
) -> CalibrationFit:
    """Check the runs against ``base`` (:func:`check_runs` for GeMM-WS; the Many-BSP fit
    analyses each run itself), then fit ``names`` (None: every figure of the model); GeMM-WS
    under ``pipeline_model`` (None: paper) on SMs of ``base``'s hardware limits, starting
    from ``warm_from``'s figures when given (a recalibration: the profile fitted before)."""
    if model == "gemm-ws" and configless_core.has_configless(documents):
        # a library's own picks: the L2-aware model's optimum, the whole set in one fit
        result, configless_runs = configless_core.fit_configless(base, documents, names)
        return to_fit(result, configless_runs)
    if model == "gemm-ws":
        check_runs(model, base, documents)
        machine, gemm_runs = gemm_ws_core(base, documents)
        warm = None
        if warm_from is not None:
            before = gemm_ws_machine(warm_from)
            warm = {n: float(getattr(before, n)) for n in names or GEMM_WS_FIGURES}
        return to_fit(
            fit_gemm_ws(
                machine,
                gemm_runs,
                fit=names,
                folds=folds,
                priors=gemm_ws_priors(base),
                dtype_ratios=gemm_ws_dtype_ratios(base),
                pipeline=resolve(
                    pipeline_model or "paper", PipelineSettings(limits=sm_limits(base))
                ),
                warm_start=warm,
            )
        )
    device, kernel_runs = many_bsp_core(base, documents)
    return to_fit(
        fit_many_bsp(device, kernel_runs, fit=names, folds=folds, priors=many_bsp_priors(base))
    )


def to_fit(result: CalibrationResult, configless_runs: Sequence[int] = ()) -> CalibrationFit:
    """The core's result as the response schema (canonical indices; see
    :func:`app.convert.calibrate.in_request`); ``configless_runs``: the runs fitted as the
    model's optimum (app/convert/configless_core.py)."""
    return CalibrationFit(
        fitted=[_fitted(f) for f in result.fitted],
        training_error=_errors(result.training_error),
        cross_validation_error=(
            _errors(result.cross_validation_error) if result.cross_validation_error else None
        ),
        residuals=[ResidualOut(**shared_fields(ResidualOut, r)) for r in result.residuals],
        warnings=list(result.warnings),
        method=result.method,
        determined_combinations=list(result.determined_combinations),
        noise_pct=result.noise_pct,
        effective_figures=result.effective_figures,
        posterior_mean_log=list(result.posterior_mean_log),
        posterior_covariance_log=[list(row) for row in result.posterior_covariance_log],
        configless_runs=list(configless_runs),
    )


def _fitted(f: FittedFigure) -> FittedFigureOut:
    prior = FigurePriorOut(**shared_fields(FigurePriorOut, f.prior)) if f.prior else None
    return FittedFigureOut(**shared_fields(FittedFigureOut, f, besides=("prior",)), prior=prior)


def _errors(summary: ErrorSummary) -> CalibrationErrorSummary:
    return CalibrationErrorSummary(**shared_fields(CalibrationErrorSummary, summary))
