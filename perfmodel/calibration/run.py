"""One calibration end to end: fit, report residuals, cross-validate (model-independent),
and the result records built from them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from perfmodel.calibration.crossval import cross_validated_predictions
from perfmodel.calibration.engine import (
    EngineFit,
    FigureSpec,
    FitProblem,
    FloatArray,
    fit_internal,
)
from perfmodel.calibration.records import CalibrationResult, ErrorSummary, FittedFigure, Residual
from perfmodel.errors import CalibrationInputError


def calibrate(
    problem: FitProblem,
    *,
    model_name: str,
    folds: int,
    seed: int,
    method: str,
    warnings: Sequence[str] = (),
) -> CalibrationResult:
    """Fit, report the residuals with ``problem.report``, and cross-validate over ``folds``
    folds (0: none). Deterministic in ``seed``."""
    measured = problem.measured
    fit = fit_internal(problem, np.random.default_rng(seed))
    rows = np.arange(len(measured))
    predicted = problem.report(fit.x, rows)
    all_warnings = [*warnings, *fit.warnings]
    cv_error = None
    cv_residuals: tuple[Residual, ...] = ()
    if folds:
        cv_predicted, cv_warnings = cross_validated_predictions(problem, folds, seed)
        all_warnings += cv_warnings
        if cv_predicted is not None:
            cv_error = error_summary(cv_predicted, measured)
            cv_residuals = residual_records(cv_predicted, measured, rows.tolist())
    return CalibrationResult(
        model=model_name,
        fitted=fitted_figures(problem.specs, fit),
        training_error=error_summary(predicted, measured),
        cross_validation_error=cv_error,
        residuals=residual_records(predicted, measured, rows.tolist()),
        warnings=tuple(all_warnings),
        method=method,
        cross_validation_residuals=cv_residuals,
    )


def identifiable_values(
    result: CalibrationResult, model_name: str, allowed: tuple[str, ...]
) -> dict[str, float]:
    """The fitted values a calibration of ``model_name`` determined, by figure name."""
    if result.model != model_name:
        raise CalibrationInputError(
            "result", f"a {result.model!r} calibration cannot update {model_name} figures"
        )
    values = {}
    for f in result.fitted:
        if f.name not in allowed:
            raise CalibrationInputError("result", f"{f.name!r} is not a {model_name} figure")
        if f.identifiable:
            values[f.name] = f.value
    return values


def error_summary(predicted: FloatArray, measured: FloatArray) -> ErrorSummary:
    errors = np.abs(predicted / measured - 1.0) * 100.0
    return ErrorSummary(mean_abs_pct=float(errors.mean()), max_abs_pct=float(errors.max()))


def residual_records(
    predicted: FloatArray, measured: FloatArray, indices: Sequence[int]
) -> tuple[Residual, ...]:
    return tuple(
        Residual(
            index=int(i),
            measured=float(m),
            predicted=float(q),
            error_pct=float(100.0 * (q / m - 1.0)),
        )
        for i, m, q in zip(indices, measured, predicted, strict=True)
    )


def fitted_figures(specs: Sequence[FigureSpec], fit: EngineFit) -> tuple[FittedFigure, ...]:
    out = []
    for i, s in enumerate(specs):
        identifiable = bool(fit.identifiable[i])
        se_x = fit.standard_error_x[i]
        xi = float(fit.x[i])
        out.append(
            FittedFigure(
                name=s.name,
                value=s.to_value(xi) if identifiable else s.base_value,
                base_value=s.base_value,
                standard_error=(
                    se_x * s.value_per_internal(xi) if identifiable and se_x is not None else None
                ),
                identifiable=identifiable,
            )
        )
    return tuple(out)
