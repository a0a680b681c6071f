"""Argument checks shared by the fits and the JSONL loader; each raises
:class:`CalibrationInputError` naming the field and saying how to fix it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from perfmodel.errors import CalibrationInputError


def fit_names(fit: Sequence[str] | None, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The figures to fit, in the order given (``None``: all of ``allowed``)."""
    if fit is None:
        return allowed
    if isinstance(fit, str):
        raise CalibrationInputError("fit", f"give a list of figure names, not the string {fit!r}")
    names = tuple(fit)
    if not names:
        raise CalibrationInputError(
            "fit", "name at least one figure to fit; choose from: " + ", ".join(allowed)
        )
    for name in names:
        if name not in allowed:
            raise CalibrationInputError(
                "fit", f"unknown figure {name!r}; choose from: " + ", ".join(allowed)
            )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CalibrationInputError("fit", "each figure once; repeated: " + ", ".join(repeated))
    return names


def measurement_count(n: int) -> None:
    """A fit needs at least one run; with priors, one run is a fit (the figures it does not
    determine stay where their priors hold them)."""
    if n == 0:
        raise CalibrationInputError(
            "measurements", "no measurements: give at least one measured run"
        )


def folds(value: int, n: int) -> tuple[int, list[str]]:
    """The number of cross-validation folds to use (0: none), and a warning when more folds
    than measurements were asked for (then each measurement is its own fold)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CalibrationInputError("folds", f"must be a whole number, got {value!r}")
    if value < 0 or value == 1:
        raise CalibrationInputError(
            "folds", f"must be 0 (no cross-validation) or at least 2, got {value}"
        )
    if value > n:
        return n, [f"{value} folds asked for {n} measurements: leave-one-out ({n} folds) used"]
    return value, []


def seed(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CalibrationInputError("seed", f"must be a whole number >= 0, got {value!r}")
    return value


def positive_time(value: object, field: str) -> float:
    """A measured time: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalibrationInputError(field, f"must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise CalibrationInputError(
            field, f"must be a finite time > 0, got {value}; drop runs that failed to time"
        )
    return float(value)


def whole(value: object, field: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CalibrationInputError(field, f"must be a whole number >= {minimum}, got {value!r}")
    if value < minimum:
        raise CalibrationInputError(field, f"must be at least {minimum}, got {value}")
    return value


def fit_arguments(
    fit: Sequence[str] | None,
    allowed: tuple[str, ...],
    n: int,
    fold_count: int,
    seed_value: int,
) -> tuple[tuple[str, ...], int, list[str]]:
    """The checks every fit makes before looking at the measurements themselves: the figure
    names (in order), then the folds to use and any warning about them."""
    names = fit_names(fit, allowed)
    seed(seed_value)
    measurement_count(n)
    k, warnings = folds(fold_count, n)
    return names, k, warnings
