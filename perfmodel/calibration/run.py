"""One calibration end to end: the MAP fit, residuals with posterior intervals, the combinations
the data determine in words, cross-validation (model-independent), and the result records."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perfmodel.belief import interval_of
from perfmodel.calibration.crossval import cross_validated_predictions
from perfmodel.calibration.engine import (
    Z_90,
    EngineFit,
    FigureSpec,
    FitProblem,
    FloatArray,
    determined_directions,
    fit_posterior,
    internal_of,
)
from perfmodel.calibration.records import CalibrationResult, ErrorSummary, FittedFigure, Residual
from perfmodel.errors import CalibrationInputError

#: posterior draws behind each residual's interval
INTERVAL_DRAWS = 128


def calibrate(
    problem: FitProblem,
    *,
    model_name: str,
    folds: int,
    seed: int,
    method: str,
    unit: str,
    warnings: Sequence[str] = (),
    warm_start: FloatArray | None = None,
) -> CalibrationResult:
    """Fit, report the residuals with ``problem.report`` (and their 10-90 % posterior
    intervals), and cross-validate over ``folds`` folds (0: none). Deterministic in ``seed``.
    ``unit`` is the unit of the model's predictions, for the combinations in words.
    ``warm_start``: theta of figures fitted before to runs these extend (a recalibration),
    from which the fit starts instead of the multistart: its optimum lies next to theirs, and
    the multistart's cost grows with the runs (5,000 runs: 3.3 s of CPU, 1.4 s warm)."""
    measured = problem.measured
    rng = np.random.default_rng(seed)
    fit = fit_posterior(problem, rng, warm_start)
    rows = np.arange(len(measured))
    predicted = problem.report(fit.x, rows)
    low, high = _prediction_intervals(problem, fit, predicted, rng)
    all_warnings = [*warnings, *fit.warnings, *_undetermined_warning(problem.specs, fit)]
    cv_error = None
    cv_residuals: tuple[Residual, ...] = ()
    if folds:
        cv_predicted, cv_warnings = cross_validated_predictions(problem, folds, seed, fit.theta)
        all_warnings += cv_warnings
        if cv_predicted is not None:
            cv_error = error_summary(cv_predicted, measured)
            cv_residuals = residual_records(cv_predicted, measured, rows.tolist())
    return CalibrationResult(
        model=model_name,
        fitted=fitted_figures(problem.specs, fit),
        training_error=error_summary(predicted, measured),
        cross_validation_error=cv_error,
        residuals=residual_records(predicted, measured, rows.tolist(), low, high),
        warnings=tuple(all_warnings),
        method=method,
        cross_validation_residuals=cv_residuals,
        determined_combinations=tuple(combination_words(problem.specs, fit, unit)),
        noise_pct=100.0 * fit.noise_scale,
        effective_figures=fit.effective_figures,
        posterior_mean_log=tuple(float(t) for t in fit.posterior.mean),
        posterior_covariance_log=tuple(
            tuple(float(c) for c in row) for row in fit.posterior.covariance
        ),
    )


def _prediction_intervals(
    problem: FitProblem, fit: EngineFit, predicted: FloatArray, rng: np.random.Generator
) -> tuple[FloatArray, FloatArray]:
    """10-90 % quantiles of each run's prediction over posterior draws: the closed-form
    model's ratio to its own MAP prediction, applied to the service's prediction. max(L, T)
    is convex, so near a kink the draws' quantiles can miss the MAP prediction itself: the
    interval is widened to contain it (docs/model-notes.md, "MAP calibration")."""
    at_map = problem.model.predict(fit.x)
    ratios = np.array(
        [
            problem.model.predict(internal_of(problem.specs, theta)) / at_map
            for theta in fit.posterior.draws(rng, INTERVAL_DRAWS)
        ]
    )
    low, high = interval_of(ratios, 1.0)
    return predicted * low, predicted * high


def _undetermined_warning(specs: Sequence[FigureSpec], fit: EngineFit) -> list[str]:
    names = [s.name for s, d in zip(specs, fit.determined, strict=True) if not d]
    if not names:
        return []
    return [
        "the runs do not determine "
        + ", ".join(names)
        + " on their own: they stay near their priors, moved only as far as the determined "
        "combinations require (see determined_combinations); measure runs where they matter"
    ]


def combination_words(specs: Sequence[FigureSpec], fit: EngineFit, unit: str) -> list[str]:
    """Each determined direction as 'c1 name1 + c2 / name2 = value unit (+- sd %)'."""
    out = []
    for direction in determined_directions(fit, specs):
        terms = []
        for spec, c in zip(specs, direction.coefficients, strict=True):
            if c == 0.0:
                continue
            magnitude = f"{abs(c):.4g}"
            term = f"{magnitude} / {spec.name}" if spec.reciprocal else f"{magnitude} {spec.name}"
            terms.append(("- " if c < 0 else "+ ") + term)
        text = " ".join(terms).removeprefix("+ ")
        sd = direction.relative_sd
        spread = f"{100 * sd:.2g} %" if math.isfinite(sd) else "unbounded"
        out.append(f"{text} = {direction.value:.6g} {unit} (posterior sd {spread})")
    return out


def identifiable_values(
    result: CalibrationResult, model_name: str, allowed: tuple[str, ...]
) -> dict[str, float]:
    """The MAP values of a calibration of ``model_name``, by figure name: every fitted figure,
    determined or held by its prior (the MAP is one coherent point; replacing only some
    figures would break the combinations the data fixed)."""
    if result.model != model_name:
        raise CalibrationInputError(
            "result", f"a {result.model!r} calibration cannot update {model_name} figures"
        )
    values = {}
    for f in result.fitted:
        if f.name not in allowed:
            raise CalibrationInputError("result", f"{f.name!r} is not a {model_name} figure")
        values[f.name] = f.value
    return values


def error_summary(predicted: FloatArray, measured: FloatArray) -> ErrorSummary:
    errors = np.abs(predicted / measured - 1.0) * 100.0
    return ErrorSummary(mean_abs_pct=float(errors.mean()), max_abs_pct=float(errors.max()))


def residual_records(
    predicted: FloatArray,
    measured: FloatArray,
    indices: Sequence[int],
    low: FloatArray | None = None,
    high: FloatArray | None = None,
) -> tuple[Residual, ...]:
    return tuple(
        Residual(
            index=int(i),
            measured=float(measured[k]),
            predicted=float(predicted[k]),
            error_pct=float(100.0 * (predicted[k] / measured[k] - 1.0)),
            predicted_low=None if low is None else float(low[k]),
            predicted_high=None if high is None else float(high[k]),
        )
        for k, i in enumerate(indices)
    )


def fitted_figures(specs: Sequence[FigureSpec], fit: EngineFit) -> tuple[FittedFigure, ...]:
    sd = fit.posterior.sd()
    out = []
    for i, s in enumerate(specs):
        value = math.exp(float(fit.theta[i]))
        sd_log = float(sd[i])
        out.append(
            FittedFigure(
                name=s.name,
                value=value,
                base_value=s.base_value,
                # the log-normal's sd in the figure's unit
                standard_error=value * math.sqrt(math.expm1(sd_log**2)),
                identifiable=bool(fit.determined[i]),
                prior=s.prior,
                posterior_sd_log=sd_log,
                interval_low=value * math.exp(-Z_90 * sd_log),
                interval_high=value * math.exp(Z_90 * sd_log),
            )
        )
    return tuple(out)
