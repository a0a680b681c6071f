"""Model-independent fitting: the maximum a posteriori (MAP) figures under log-normal priors and
a robust relative-error likelihood, with the Laplace approximation of the posterior.

Each model adapter (gemm_ws.py, many_bsp.py) supplies a :class:`ResidualModel` (predictions and
their Jacobian in the model's internal coordinates: a throughput as its reciprocal, a latency as
itself) and one :class:`FigureSpec` per fitted figure, prior included. The fit works in
theta = ln(value) for every figure:

    cost(theta) = 1/2 sum_i rho((r_i / s)^2) + 1/2 sum_j ((theta_j - ln median_j) / sigma_j)^2

with r_i = predicted_i / measured_i - 1, rho a Cauchy loss (a run further than 3 noise scales
and 5 % off loses its pull) and s the relative noise scale, estimated from the residuals. What the
data determine is fitted; a direction they do not see is held by the prior, never reset (a reset
breaks whatever combination the data did fix). Choices and their reasons: docs/model-notes.md,
"Calibration" and "MAP calibration".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

from perfmodel.belief import Posterior, Prior
from perfmodel.errors import CalibrationInputError, UnfittableMeasurements

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]
BoolArray = NDArray[np.bool_]

#: relative noise of a timed run assumed where the residuals cannot tell it (3 %: repeated
#: GPU timings and model error together). The noise scale s is the residual rms over the
#: residual degrees of freedom n - p_eff; where those are fewer than one (no more runs than
#: the figures they determine, e.g. a single run), pseudo-runs of this noise make up the
#: difference, so that s stays defined and falls smoothly to the residuals' own estimate
NOISE_PRIOR = 0.03
#: s never falls below this (noise-free synthetic data would otherwise make it 0)
NOISE_FLOOR = 1e-5
#: residuals beyond this many noise scales, and beyond OUTLIER_MIN relative error, are
#: outliers: the Cauchy loss's scale is max(CAUCHY_SDS s, OUTLIER_MIN). The floor keeps runs
#: that are only a few percent off (a prior far from the device, noise-free data) in the
#: quadratic range, so they pull the fit; a run disturbed by another job is off by far more
CAUCHY_SDS = 3.0
OUTLIER_MIN = 0.05


def cauchy_sds(noise_scale: float) -> float:
    """The Cauchy scale in noise scales at noise scale ``noise_scale``."""
    return max(CAUCHY_SDS, OUTLIER_MIN / noise_scale)


#: least_squares' stopping tolerances (relative change of the cost, of theta, the gradient)
TOLERANCE = 1e-12
#: the fit explores theta within this many prior sds of the median (at least LOG_SPAN_MIN):
#: a value outside is not a belief anybody holds, and exp() stays finite
PRIOR_SPAN_SDS = 12.0
LOG_SPAN_MIN = math.log(1e3)
#: a figure is determined by the data when they shrink its prior sd at least this much
DETERMINED_SHRINK = 0.5
#: a direction (of prior-whitened log figures) is determined when the data's information on
#: it is at least this multiple of the prior's (posterior variance <= 1/(1 + this) of prior)
DETERMINED_INFORMATION = 3.0
#: fixed-point iterations between the MAP and the noise scale, started from this scale
NOISE_ITERATIONS = 12
LOW_NOISE_START = 1e-4
#: z of the 10 % and 90 % quantiles of a normal: the intervals reported
Z_90 = 1.2815515655446004


class ResidualModel(Protocol):
    """Predictions of a fixed list of measurements as a function of the internal figure
    vector ``x`` (one entry per fitted figure, in the order of the specs)."""

    def predict(self, x: FloatArray) -> FloatArray:
        """Predicted value of every measurement, shape (n,)."""
        ...

    def jacobian(self, x: FloatArray) -> FloatArray:
        """d predict / d x, shape (n, len(x))."""
        ...

    def subset(self, rows: IntArray) -> ResidualModel:
        """The same model restricted to measurements ``rows``."""
        ...


@dataclass(frozen=True, slots=True)
class FigureSpec:
    """How one figure is fitted: its prior, and its internal coordinate x for the residual
    model: the value, or its reciprocal when ``reciprocal`` (a throughput enters eq. (4)/(6)
    as time per unit of work, so the GeMM-WS durations are linear in x)."""

    name: str
    base_value: float
    reciprocal: bool
    prior: Prior

    def to_internal(self, value: float) -> float:
        return 1.0 / value if self.reciprocal else value

    def to_value(self, x: float) -> float:
        return 1.0 / x if self.reciprocal else x


#: a figure with no cited prior is believed within a factor e of its base value (1 sd)
DEFAULT_SIGMA_LOG = 1.0


def default_priors(
    base: object, names: Sequence[str], zero: Prior, reciprocal: Collection[str]
) -> dict[str, Prior]:
    """Priors for the figures ``names`` of ``base`` no profile cites one for: centred on the
    base values, wide. A base value of 0 gets ``zero`` (ln 0 has no prior); a figure fitted
    as its reciprocal (``reciprocal``) must be > 0 (CalibrationInputError naming it)."""
    out = {}
    for name in names:
        value = float(getattr(base, name))
        if value > 0:
            out[name] = Prior(value, DEFAULT_SIGMA_LOG, "base value, no cited prior (wide)")
        elif name in reciprocal:
            raise CalibrationInputError(f"base.{name}", f"must be > 0 to be fitted, got {value}")
        else:
            out[name] = zero
    return out


def figure_specs(
    base: object, names: Sequence[str], priors: Mapping[str, Prior], reciprocal: Collection[str]
) -> tuple[FigureSpec, ...]:
    """One spec per figure of ``names``, at ``base``'s value under its prior; those in
    ``reciprocal`` are fitted as 1/value (:class:`FigureSpec`)."""
    return tuple(
        FigureSpec(name, float(getattr(base, name)), name in reciprocal, priors[name])
        for name in names
    )


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
    """The MAP ``theta``, its internal values ``x``, the posterior, the noise scale ``s`` (a
    relative error), the data's information matrix on theta (at noise scale s), the effective
    number of figures the data determine (trace of the hat matrix) and per figure whether the
    data determine it."""

    theta: FloatArray
    x: FloatArray
    posterior: Posterior
    noise_scale: float
    data_information: FloatArray
    effective_figures: float
    determined: BoolArray
    warnings: list[str] = field(default_factory=list)


def _signs(specs: Sequence[FigureSpec]) -> FloatArray:
    """d ln x / d theta per figure: -1 for a reciprocal (x = 1/value), else 1."""
    return np.array([-1.0 if s.reciprocal else 1.0 for s in specs])


def internal_of(specs: Sequence[FigureSpec], theta: FloatArray) -> FloatArray:
    """x of ``theta`` = ln(values): exp(theta), or exp(-theta) for a reciprocal figure."""
    out: FloatArray = np.exp(_signs(specs) * theta)
    return out


def theta_of(specs: Sequence[FigureSpec], values: Mapping[str, float]) -> FloatArray:
    """theta = ln(value) of each spec's figure in ``values`` (the inverse of
    :func:`internal_of` composed with ``to_value``): a warm start from figures fitted before."""
    theta: FloatArray = np.log(np.array([values[s.name] for s in specs], dtype=np.float64))
    return theta


def prior_arrays(specs: Sequence[FigureSpec]) -> tuple[FloatArray, FloatArray]:
    """(ln median, sigma_log) of every spec's prior."""
    mu = np.array([math.log(s.prior.median) for s in specs], dtype=np.float64)
    sigma = np.array([s.prior.sigma_log for s in specs], dtype=np.float64)
    return mu, sigma


def relative_residuals(model: ResidualModel, x: FloatArray, measured: FloatArray) -> FloatArray:
    return model.predict(x) / measured - 1.0


def _theta_jacobian(
    model: ResidualModel, specs: Sequence[FigureSpec], theta: FloatArray, measured: FloatArray
) -> FloatArray:
    """d r / d theta: d x / d theta is x for a latency (x = e^theta), -x for a reciprocal."""
    x = internal_of(specs, theta)
    out: FloatArray = model.jacobian(x) * (_signs(specs) * x)[None, :] / measured[:, None]
    return out


def _cauchy(n_data: int, noise_scale: float) -> Callable[[FloatArray], FloatArray]:
    """least_squares' loss: Cauchy with scale :func:`cauchy_sds` on the first ``n_data``
    residuals (already divided by s), plain squares on the prior's. rho is scaled so that both
    are negative log densities up to a constant (rho(z) ~ z for small z)."""
    c2 = cauchy_sds(noise_scale) ** 2

    def loss(z: FloatArray) -> FloatArray:
        rho = np.empty((3, z.size), dtype=np.float64)
        rho[0] = z
        rho[1] = 1.0
        rho[2] = 0.0
        d = z[:n_data] / c2
        rho[0, :n_data] = c2 * np.log1p(d)
        rho[1, :n_data] = 1.0 / (1.0 + d)
        rho[2, :n_data] = -1.0 / (c2 * (1.0 + d) ** 2)
        return rho

    return loss


def robust_weights(residuals: FloatArray, noise_scale: float) -> FloatArray:
    """The Cauchy loss's weight per residual at the optimum, rho'(z): near 1 for ordinary
    errors, (c s / r)^2 for outliers (c = :func:`cauchy_sds`)."""
    z = (residuals / noise_scale) ** 2 / cauchy_sds(noise_scale) ** 2
    weights: FloatArray = 1.0 / (1.0 + z)
    return weights


def _map_from(
    problem: FitProblem,
    theta0: FloatArray,
    noise_scale: float,
    bounds: tuple[FloatArray, FloatArray],
) -> tuple[FloatArray, float]:
    model, measured, specs = problem.model, problem.measured, problem.specs
    mu, sigma = prior_arrays(specs)
    n = measured.size

    def fun(theta: FloatArray) -> FloatArray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            r = relative_residuals(model, internal_of(specs, theta), measured) / noise_scale
        return np.concatenate([_finite(r), (theta - mu) / sigma])

    def jac(theta: FloatArray) -> FloatArray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            data = _theta_jacobian(model, specs, theta, measured) / noise_scale
        return np.vstack([_finite(data), np.diag(1.0 / sigma)])

    theta = np.clip(theta0, bounds[0], bounds[1])
    # Squares first: every run pulls in proportion to its error, so a start far from the
    # runs (a prior that contradicts them) moves towards them, where the Cauchy loss's
    # saturated gradients would leave it; the robust loss then only re-weights from there.
    for loss in ("linear", _cauchy(n, noise_scale)):
        result = least_squares(
            fun,
            theta,
            jac=jac,
            bounds=bounds,
            method="trf",
            loss=loss,
            xtol=TOLERANCE,
            ftol=TOLERANCE,
            gtol=TOLERANCE,
        )
        theta = np.asarray(result.x, dtype=np.float64)
    return theta, float(result.cost)


#: stands in for a residual or derivative that overflowed (figures whose predictions exceed
#: float64 for runs of a few cycles): large enough that no fit keeps such a start, small
#: enough that the solver's squares and products of it (the loss's z = r^2, J^T J, the
#: scaled Jacobian it decomposes) stay far within float64
OVERFLOW_RESIDUAL = 1e30


def _finite(values: FloatArray) -> FloatArray:
    """``values`` clipped to +-OVERFLOW_RESIDUAL, NaN counted as the bound: least_squares
    refuses a non-finite residual or Jacobian (and squares what it gets), and a start in an
    overflowing region must lose, not fail."""
    out: FloatArray = np.clip(
        np.nan_to_num(values, nan=OVERFLOW_RESIDUAL), -OVERFLOW_RESIDUAL, OVERFLOW_RESIDUAL
    )
    return out


#: wide starts spread each figure log-uniformly over its prior median x / WIDE_START_FACTOR
#: .. x WIDE_START_FACTOR: the model is piecewise linear (max(L, T)), and a figure that enters
#: no run at the prior (a load-bound run's MATH) gives no gradient towards the regime the runs
#: are really in; only a start on the other side finds it. The MAP objective picks the best.
WIDE_START_FACTOR = 30.0


def _starts(specs: Sequence[FigureSpec], rng: np.random.Generator, n: int) -> list[FloatArray]:
    """The prior medians, the base values (where positive), draws from the prior, then as
    many wide draws (``n`` of each kind in all)."""
    mu, sigma = prior_arrays(specs)
    starts = [mu.copy()]
    base = np.array([s.base_value for s in specs], dtype=np.float64)
    if np.all(base > 0) and not np.allclose(np.log(base), mu):
        starts.append(np.log(base))
    while len(starts) < max(n, 1):
        starts.append(mu + sigma * rng.standard_normal(mu.size))
    span = math.log(WIDE_START_FACTOR)
    starts += [mu + rng.uniform(-span, span, mu.size) for _ in range(n)]
    return starts


def _bounds(specs: Sequence[FigureSpec]) -> tuple[FloatArray, FloatArray]:
    mu, sigma = prior_arrays(specs)
    span = np.maximum(PRIOR_SPAN_SDS * sigma, LOG_SPAN_MIN)
    return mu - span, mu + span


def _information(
    problem: FitProblem, theta: FloatArray, noise_scale: float
) -> tuple[FloatArray, FloatArray]:
    """(weighted residuals, the data's Gauss-Newton information on theta at noise scale s)."""
    model, measured, specs = problem.model, problem.measured, problem.specs
    residuals = relative_residuals(model, internal_of(specs, theta), measured)
    weights = robust_weights(residuals, noise_scale)
    jac = _theta_jacobian(model, specs, theta, measured)
    information: FloatArray = (jac * weights[:, None]).T @ jac / noise_scale**2
    return residuals * np.sqrt(weights), information


def fit_posterior(
    problem: FitProblem, rng: np.random.Generator, warm_start: FloatArray | None = None
) -> EngineFit:
    """The MAP figures and the Laplace posterior around them; any number of runs >= 1.

    The noise scale and the MAP are solved together by fixed-point iteration: the MAP at a
    given s, then s^2 = sum w r^2 / (n - effective figures), topped up with pseudo-runs of
    NOISE_PRIOR to one degree of freedom (so one run, which the figures can always fit
    exactly, still has a noise scale).
    """
    specs, measured = problem.specs, problem.measured
    n = measured.size
    mu, sigma = prior_arrays(specs)
    prior_precision = np.diag(1.0 / sigma**2)
    bounds = _bounds(specs)
    # a warm start (a cross-validation fold from the full fit) needs no multistart: the
    # folds' optimum lies next to the full data's
    starts = _starts(specs, rng, problem.n_starts) if warm_start is None else [warm_start]

    def best_from(candidates: Sequence[FloatArray], noise: float) -> FloatArray:
        fits = [_map_from(problem, theta0, noise, bounds) for theta0 in candidates]
        return min(fits, key=lambda fit: fit[1])[0]

    # Every start at the assumed noise, then every start and that optimum again at a low one:
    # the noise scale then climbs to its fixed point from below, so the runs speak first.
    # From above, a prior that contradicts exact runs by many sds can hold a second fixed
    # point where the prior's pull and the residuals it causes sustain each other (a
    # noise-free latency-bound set stuck at 1 % residuals); the smallest is the data's. The
    # low-noise multistart finds regimes (Many-BSP's steps, max(L, T)) the prior's pull hid.
    noise_scale = LOW_NOISE_START
    theta = best_from([*starts, best_from(starts, NOISE_PRIOR)], noise_scale)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        predicted = problem.model.predict(internal_of(specs, theta))
    if not np.all(np.isfinite(predicted / measured)):
        raise UnfittableMeasurements(
            "no figures within the priors' range predict these runs in finite time (every "
            "start of the fit overflowed); check the runs' units and the base figures"
        )
    for _ in range(NOISE_ITERATIONS):
        weighted, information = _information(problem, theta, noise_scale)
        effective = _effective_figures(information, prior_precision)
        residual_dof = max(n - effective, 0.0)
        pseudo_runs = max(1.0 - residual_dof, 0.0)
        updated = math.sqrt(
            (pseudo_runs * NOISE_PRIOR**2 + float(weighted @ weighted))
            / (residual_dof + pseudo_runs)
        )
        updated = max(updated, NOISE_FLOOR)
        if abs(updated / noise_scale - 1.0) < 1e-3:
            noise_scale = updated
            break
        noise_scale = updated
        theta, _ = _map_from(problem, theta, noise_scale, bounds)
    _, information = _information(problem, theta, noise_scale)
    covariance = np.linalg.inv(information + prior_precision)
    covariance = (covariance + covariance.T) / 2
    posterior = Posterior(theta, covariance)
    determined = posterior.sd() <= DETERMINED_SHRINK * sigma
    warnings = []
    at_bound = (np.isclose(theta, bounds[0]) | np.isclose(theta, bounds[1])).nonzero()[0]
    if at_bound.size:
        warnings.append(
            "the fit reached the edge of the prior's range for "
            + ", ".join(specs[int(i)].name for i in at_bound)
            + f" ({PRIOR_SPAN_SDS:g} prior sds from the median): the runs contradict the "
            "prior; check their units and the device"
        )
    return EngineFit(
        theta=theta,
        x=internal_of(specs, theta),
        posterior=posterior,
        noise_scale=noise_scale,
        data_information=information,
        effective_figures=_effective_figures(information, prior_precision),
        determined=determined,
        warnings=warnings,
    )


def _effective_figures(information: FloatArray, prior_precision: FloatArray) -> float:
    """tr(I_data (I_data + I_prior)^-1): how many figures' worth the data determine."""
    return float(np.trace(np.linalg.solve(information + prior_precision, information)))


@dataclass(frozen=True, slots=True)
class DeterminedDirection:
    """A combination of figures the data determine: sum_j coefficients[j] x_j, where x_j is
    the figure in the model's internal coordinate (the value, or 1 / value for a reciprocal
    figure); ``value`` and ``relative_sd`` at the posterior."""

    coefficients: tuple[float, ...]
    value: float
    relative_sd: float


def determined_directions(fit: EngineFit, specs: Sequence[FigureSpec]) -> list[DeterminedDirection]:
    """The combinations of figures the data pin, beyond the prior: eigenvectors of the data's
    information in prior-whitened coordinates with eigenvalue >= DETERMINED_INFORMATION.

    A direction w (in theta) is the linear functional w . theta; at the posterior it is the
    functional sum_j (w_j / x_j) x_j of the internal coordinates (d theta_j = d x_j / x_j up to
    sign), which for GeMM-WS is a duration such as 2 l_load + (TM TK + TK TN) / throughput.
    """
    _, sigma = prior_arrays(specs)
    whitened = fit.data_information * sigma[:, None] * sigma[None, :]
    values, vectors = np.linalg.eigh((whitened + whitened.T) / 2)
    out = []
    sign = _signs(specs)
    for k in np.argsort(values)[::-1]:
        if values[k] < DETERMINED_INFORMATION:
            break
        w = vectors[:, k] / sigma  # back from whitened coordinates: a functional of theta
        coefficients = sign * w / fit.x
        contribution = np.abs(coefficients * fit.x)
        coefficients[contribution < 1e-3 * contribution.max()] = 0.0
        nonzero = np.abs(coefficients[coefficients != 0.0])
        scale = float(nonzero.min())
        # the sign that makes the largest contribution positive, smallest coefficient 1
        lead = int(np.argmax(contribution))
        coefficients = coefficients / scale * (1.0 if coefficients[lead] > 0 else -1.0)
        value = float(coefficients @ fit.x)
        w_used = coefficients * fit.x * sign  # d value / d theta
        variance = float(w_used @ fit.posterior.covariance @ w_used)
        out.append(
            DeterminedDirection(
                coefficients=tuple(float(c) for c in coefficients),
                value=value,
                relative_sd=math.sqrt(max(variance, 0.0)) / abs(value) if value else math.inf,
            )
        )
    return out
