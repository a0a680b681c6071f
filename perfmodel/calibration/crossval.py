"""k-fold cross-validation of a calibration: each fold predicted by a fit of the others."""

from __future__ import annotations

import numpy as np

from perfmodel.calibration.engine import FitProblem, FloatArray, IntArray, fit_internal


def fold_rows(n: int, folds: int, seed: int) -> list[IntArray]:
    """``folds`` disjoint sets of rows covering 0..n-1, sizes within one of each other."""
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(order[f::folds]) for f in range(folds)]


def cross_validated_predictions(
    problem: FitProblem, folds: int, seed: int
) -> tuple[FloatArray | None, list[str]]:
    """Each measurement predicted by the fit of the other folds (None and a warning when a
    fold leaves too few measurements to fit)."""
    n, p = len(problem.measured), len(problem.specs)
    rows = fold_rows(n, folds, seed)
    smallest_training = n - max(len(r) for r in rows)
    if smallest_training <= p:
        return None, [
            f"cross-validation skipped: with {folds} folds a fold trains on {smallest_training} "
            f"measurements, and fitting {p} figures needs at least {p + 1}; give more "
            "measurements or fewer folds"
        ]
    predicted = np.empty(n, dtype=np.float64)
    all_rows = np.arange(n)
    rng = np.random.default_rng(seed)
    for held_out in rows:
        train = np.setdiff1d(all_rows, held_out)
        fitted = fit_internal(problem.subset(train), rng)
        predicted[held_out] = problem.report(fitted.x, held_out)
    return predicted, []
