"""k-fold cross-validation of a calibration: each fold predicted by a fit of the others."""

from __future__ import annotations

import numpy as np

from perfmodel.calibration.engine import FitProblem, FloatArray, IntArray, fit_posterior


def fold_rows(n: int, folds: int, seed: int) -> list[IntArray]:
    """``folds`` disjoint sets of rows covering 0..n-1, sizes within one of each other."""
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(order[f::folds]) for f in range(folds)]


def cross_validated_predictions(
    problem: FitProblem, folds: int, seed: int, warm_start: FloatArray | None = None
) -> tuple[FloatArray | None, list[str]]:
    """Each measurement predicted by the fit of the other folds (None and a warning when
    there is a single measurement: no fold would have one to train on). With priors a fit of
    one run is a fit, so any fold of at least one training run counts. ``warm_start``: the
    full fit's theta, from which each fold's fit starts (no multistart)."""
    n = len(problem.measured)
    if n < 2:
        return None, ["cross-validation skipped: one run leaves nothing to train a fold on"]
    rows = fold_rows(n, min(folds, n), seed)
    predicted = np.empty(n, dtype=np.float64)
    all_rows = np.arange(n)
    rng = np.random.default_rng(seed)
    for held_out in rows:
        train = np.setdiff1d(all_rows, held_out)
        fitted = fit_posterior(problem.subset(train), rng, warm_start)
        predicted[held_out] = problem.report(fitted.x, held_out)
    return predicted, []
