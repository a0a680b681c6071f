"""The MAP engine where predictions overflow float64: a start there loses, it never fails, and
runs no figure within the priors' range predicts in finite time are refused naming them."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.belief import Prior
from perfmodel.calibration.engine import FigureSpec, FitProblem, fit_posterior
from perfmodel.errors import ModelInputError


class _Power:
    """predict = x ** exponent per run: overflows float64 for large x and exponents."""

    def __init__(self, exponents: np.ndarray) -> None:
        self.exponents = exponents

    def predict(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.asarray(x[0] ** self.exponents, dtype=np.float64)

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            column = self.exponents * x[0] ** (self.exponents - 1.0)
        return np.asarray(column, dtype=np.float64)[:, None]

    def subset(self, rows: np.ndarray) -> _Power:
        return _Power(self.exponents[rows])


def _problem(exponents: list[float], measured: list[float], median: float) -> FitProblem:
    model = _Power(np.asarray(exponents, dtype=np.float64))
    spec = FigureSpec("x", median, False, Prior(median, 1.0, "test"))
    return FitProblem(
        model=model,
        measured=np.asarray(measured, dtype=np.float64),
        specs=[spec],
        n_starts=4,
        report=lambda x, rows: model.subset(rows).predict(x),
    )


def test_starts_that_overflow_lose_to_the_ones_that_fit() -> None:
    # x = 10 gives 10^100 and 10^200: finite; the wide starts (x up to 30 x 10 e^...) overflow
    problem = _problem([100.0, 200.0], [1e100, 1e200], median=10.0)
    fit = fit_posterior(problem, np.random.default_rng(0))
    assert float(fit.x[0]) == pytest.approx(10.0, rel=1e-6)


def test_runs_that_overflow_at_every_start_are_a_model_input_error() -> None:
    # any x within the prior's range (around 1e10) raised to 1e6 overflows float64
    problem = _problem([1e6], [1.0], median=1e10)
    with pytest.raises(ModelInputError) as caught:
        fit_posterior(problem, np.random.default_rng(0))
    assert caught.value.field == "measurements"
