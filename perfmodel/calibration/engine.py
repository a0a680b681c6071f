"""Model-independent fitting: bounded robust least squares on relative error, several starts,
identifiability from the Jacobian's null space, and standard errors.

Each model adapter (gemm_ws.py, many_bsp.py) supplies a :class:`ResidualModel` (predictions
and their Jacobian in internal coordinates) and one :class:`FigureSpec` per fitted figure.
Choices and their reasons: docs/model-notes.md, "Calibration".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]
BoolArray = NDArray[np.bool_]

#: robust loss: Cauchy, rho(z) = ln(1 + z) with z = (r / ROBUST_SCALE)^2. Relative errors well
#: under 5 % count as squares; a run far off (disturbed by another job, a mistyped time)
#: loses its pull on the fit (influence ~ 1/r), unlike soft-L1's constant pull
ROBUST_SCALE = 0.05
ROBUST_LOSS = "cauchy"
#: least_squares' stopping tolerances (relative change of the cost, of x, and the gradient)
TOLERANCE = 1e-10
#: a direction of the column-normalised Jacobian with singular value below this fraction of
#: the largest one changes no prediction: the figures along it are not identifiable
NULL_SPACE_TOLERANCE = 1e-6
#: a figure whose unit vector has at least this much weight in that null space is one of them
NULL_SPACE_WEIGHT = 1e-3


class ResidualModel(Protocol):
    """Predictions of a fixed list of measurements as a function of the internal figure
    vector ``x`` (one entry per fitted figure, in the order of the specs)."""

    def predict(self, x: FloatArray) -> FloatArray:
        """Predicted value of every measurement, shape (n,)."""
        ...

    def jacobian(self, x: FloatArray) -> FloatArray:
        """d predict / d x, shape (n, len(x))."""
        ...

    def one_sided_jacobians(self, x: FloatArray) -> Sequence[FloatArray]:
        """The Jacobian on each side of every kink ``x`` lies on (the model is piecewise
        smooth): a figure that changes no prediction on one side is only bounded, not
        determined, by the data."""
        ...

    def subset(self, rows: IntArray) -> ResidualModel:
        """The same model restricted to measurements ``rows``."""
        ...


@dataclass(frozen=True, slots=True)
class FigureSpec:
    """How one figure is fitted. Internal coordinate x is the value, or its reciprocal when
    ``reciprocal`` (a throughput enters eq. (4)/(6) as time per unit of work, so the
    GeMM-WS durations are linear in x). Bounds and the random-start range are in x."""

    name: str
    base_value: float
    reciprocal: bool
    lower: float
    upper: float
    start_low: float
    start_high: float
    log_starts: bool
    #: a magnitude of x that matters for the predictions (used where x itself is near 0)
    typical: float

    def to_internal(self, value: float) -> float:
        return 1.0 / value if self.reciprocal else value

    def to_value(self, x: float) -> float:
        return 1.0 / x if self.reciprocal else x

    def value_per_internal(self, x: float) -> float:
        """|d value / d x|, for the standard error of the value (delta method)."""
        return 1.0 / (x * x) if self.reciprocal else 1.0


@dataclass(frozen=True, slots=True)
class FitProblem:
    """What a fit needs: the model, the measured values (in its unit), one spec per fitted
    figure, how many starts, and ``report(x, rows)``: the service's own predictions of
    ``rows`` for internal values ``x`` (residuals are reported with it, the fit uses
    ``model``)."""

    model: ResidualModel
    measured: FloatArray
    specs: Sequence[FigureSpec]
    n_starts: int
    report: Callable[[FloatArray, IntArray], FloatArray]

    def subset(self, rows: IntArray) -> FitProblem:
        return dataclasses.replace(
            self, model=self.model.subset(rows), measured=self.measured[rows]
        )


@dataclass(slots=True)
class EngineFit:
    x: FloatArray
    identifiable: BoolArray
    standard_error_x: list[float | None]
    warnings: list[str] = field(default_factory=list)


def relative_residuals(model: ResidualModel, x: FloatArray, measured: FloatArray) -> FloatArray:
    return model.predict(x) / measured - 1.0


def _least_squares_from(
    model: ResidualModel,
    measured: FloatArray,
    x_full: FloatArray,
    free: IntArray,
    x0: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
) -> tuple[FloatArray, float]:
    def full(z: FloatArray) -> FloatArray:
        x = x_full.copy()
        x[free] = z
        return x

    def fun(z: FloatArray) -> FloatArray:
        return relative_residuals(model, full(z), measured)

    def jac(z: FloatArray) -> FloatArray:
        return model.jacobian(full(z))[:, free] / measured[:, None]

    z = np.clip(x0, lower, upper)
    # Plain least squares first: on a piecewise-linear model each Gauss-Newton step is exact
    # within the current regimes, so it gets close in a few steps; the robust loss then only
    # re-weights from there.
    for loss in ("linear", ROBUST_LOSS):
        result = least_squares(
            fun,
            z,
            jac=jac,
            bounds=(lower, upper),
            method="trf",
            loss=loss,
            f_scale=ROBUST_SCALE,
            x_scale="jac",
            xtol=TOLERANCE,
            ftol=TOLERANCE,
            gtol=TOLERANCE,
        )
        z = np.asarray(result.x, dtype=np.float64)
    return full(z), float(result.cost)


def _starts(
    specs: Sequence[FigureSpec],
    free: IntArray,
    x_full: FloatArray,
    rng: np.random.Generator,
    n: int,
) -> list[FloatArray]:
    """The current values first, then ``n - 1`` draws from each figure's start range."""
    starts = [x_full[free].copy()]
    for _ in range(n - 1):
        draw = []
        for i in free:
            s = specs[i]
            if s.log_starts:
                draw.append(math.exp(rng.uniform(math.log(s.start_low), math.log(s.start_high))))
            else:
                draw.append(rng.uniform(s.start_low, s.start_high))
        starts.append(np.array(draw, dtype=np.float64))
    return starts


def _multistart(
    model: ResidualModel,
    measured: FloatArray,
    specs: Sequence[FigureSpec],
    free: IntArray,
    x_full: FloatArray,
    rng: np.random.Generator,
    n_starts: int,
) -> FloatArray:
    lower = np.array([specs[i].lower for i in free])
    upper = np.array([specs[i].upper for i in free])
    best: tuple[FloatArray, float] | None = None
    for x0 in _starts(specs, free, x_full, rng, n_starts):
        x, cost = _least_squares_from(model, measured, x_full, free, x0, lower, upper)
        if best is None or cost < best[1]:
            best = (x, cost)
    assert best is not None  # n_starts >= 1
    return best[0]


def null_space_figures(jac_rel: FloatArray, scale: FloatArray) -> BoolArray:
    """Columns (figures) along which the predictions do not change to first order: a zero
    column, or one in a linear combination of columns that cancels (collinear figures).

    ``scale`` is each figure's magnitude, so column j measures the relative change of the
    predictions per relative change of figure j. Needs at least as many rows as columns
    (fit_internal ensures more).
    """
    norms = np.linalg.norm(jac_rel * scale, axis=0)
    largest = float(norms.max()) if norms.size else 0.0
    if largest == 0.0:
        return np.ones(jac_rel.shape[1], dtype=np.bool_)
    zero: BoolArray = norms <= NULL_SPACE_TOLERANCE * largest
    out = zero.copy()
    keep = np.flatnonzero(~zero)
    normalised = jac_rel[:, keep] / norms[keep]
    _, singular, vt = np.linalg.svd(normalised, full_matrices=False)
    null = vt[singular < NULL_SPACE_TOLERANCE * singular[0]]
    if null.size:
        weight = np.sqrt((null**2).sum(axis=0))
        out[keep[weight > NULL_SPACE_WEIGHT]] = True
    return out


def _rms(residuals: FloatArray) -> float:
    return float(np.sqrt(np.mean(residuals**2)))


def fit_internal(problem: FitProblem, rng: np.random.Generator) -> EngineFit:
    """Fit every figure the data determine; the others keep their base values.

    A figure in the Jacobian's null space at the optimum (structurally undetermined), or else
    one whose standard error exceeds both its fitted and base values (undetermined by these
    noisy data), is fixed at its base value and the rest are fitted again, until the free
    figures are all determined. With no more measurements than figures nothing is fitted (no
    degree of freedom would be left to tell a fit from an interpolation of the noise).
    """
    model, measured, specs = problem.model, problem.measured, problem.specs
    n, p = len(measured), len(specs)
    names = [s.name for s in specs]
    x_base = np.array([s.to_internal(s.base_value) for s in specs], dtype=np.float64)
    fixed = np.zeros(p, dtype=np.bool_)
    warnings: list[str] = []
    if n <= p:
        warnings.append(
            f"{n} measurements for {p} figures leave no degree of freedom: every figure keeps "
            f"its base value; at least {p + 1} measurements are needed"
        )
        return EngineFit(x_base, np.zeros(p, dtype=np.bool_), [None] * p, warnings)
    x = x_base.copy()
    free_rms: float | None = None
    while not fixed.all():
        free = np.flatnonzero(~fixed)
        start = np.where(fixed, x_base, x)
        x = _multistart(model, measured, specs, free, start, rng, problem.n_starts)
        if free_rms is None:
            free_rms = _rms(relative_residuals(model, x, measured))
        scale = np.array([max(abs(float(x[i])), specs[i].typical) for i in free.tolist()])
        in_null_space = np.zeros(free.size, dtype=np.bool_)
        for jac in model.one_sided_jacobians(x):
            in_null_space |= null_space_figures(jac[:, free] / measured[:, None], scale)
        undetermined = free[in_null_space]
        if undetermined.size:
            reason = (
                "it does not change the prediction of any measured run"
                if undetermined.size == 1
                else "only a combination of them (or none) changes the predictions"
            )
        else:
            se = _standard_errors(model, measured, x, np.flatnonzero(~fixed), p)
            size = np.maximum(np.abs(x), np.abs(x_base))
            undetermined = np.array(
                [
                    i
                    for i in free.tolist()
                    if (se[i] or 0.0) > max(size[i], 0.01 * specs[i].typical)
                ],
                dtype=np.intp,
            )
            reason = "its standard error exceeds both its fitted and its base value"
        if undetermined.size == 0:
            break
        fixed[undetermined] = True
        listed = ", ".join(names[i] for i in undetermined)
        warnings.append(
            f"the measurements do not determine {listed}: {reason}; kept at the base value. "
            "Measure runs where it matters."
        )
    x = np.where(fixed, x_base, x)
    residuals = relative_residuals(model, x, measured)
    if fixed.any() and free_rms is not None:
        fixed_rms = _rms(residuals)
        if fixed_rms > 1.1 * free_rms and fixed_rms - free_rms > 1e-3:
            warnings.append(
                f"keeping the base values raises the RMS relative error from "
                f"{100 * free_rms:.2f}% to {100 * fixed_rms:.2f}%: the data bound the fixed "
                "figures without determining them, and the base values lie outside that bound"
            )
    se = _standard_errors(model, measured, x, np.flatnonzero(~fixed), p)
    return EngineFit(x, ~fixed, se, warnings)


def robust_weights(residuals: FloatArray) -> FloatArray:
    """The Cauchy loss's weight per residual at the optimum, rho'(z) = 1 / (1 + z) with
    z = (r / ROBUST_SCALE)^2: near 1 for ordinary errors, (ROBUST_SCALE / r)^2 for outliers."""
    weights: FloatArray = 1.0 / (1.0 + (residuals / ROBUST_SCALE) ** 2)
    return weights


def _standard_errors(
    model: ResidualModel,
    measured: FloatArray,
    x: FloatArray,
    free: IntArray,
    p: int,
) -> list[float | None]:
    """sqrt(diag(s^2 (J^T W J)^-1)) on the free figures, s^2 = sum(w r^2) / (n - free
    figures), with W the robust loss's weights at the optimum (the iteratively reweighted
    least-squares view of the fit): an outlier the loss discounts does not inflate them."""
    out: list[float | None] = [None] * p
    dof = len(measured) - free.size
    if free.size == 0 or dof <= 0:
        return out
    residuals = relative_residuals(model, x, measured)
    root_w = np.sqrt(robust_weights(residuals))
    jac_w = model.jacobian(x)[:, free] / measured[:, None] * root_w[:, None]
    s2 = float(np.sum((root_w * residuals) ** 2)) / dof
    cov = s2 * np.linalg.pinv(jac_w.T @ jac_w)
    for k, i in enumerate(free.tolist()):
        out[i] = math.sqrt(max(0.0, float(cov[k, k])))
    return out
