"""What is believed about a device's figures: log-normal priors (cited data in the device
profiles) and the joint log-normal posterior a calibration reports, as draws.

Plain numpy, no fitting: the solver's explore shortlists and the service's intervals draw from
a :class:`FigureBelief` without loading the calibration engine (scipy). ln(figures) ~
Normal(mean, covariance) throughout (docs/model-notes.md, "Priors" and "MAP calibration").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.prior import Prior

FloatArray = NDArray[np.float64]

__all__ = ["INTERVAL_QUANTILES", "FigureBelief", "Posterior", "Prior", "interval_of"]

#: the quantiles of every interval the service reports (10-90 %)
INTERVAL_QUANTILES = (0.1, 0.9)


def interval_of(
    samples: NDArray[np.number], point: NDArray[np.number] | float | None = None
) -> tuple[FloatArray, FloatArray]:
    """The 10 % and 90 % quantiles of ``samples`` over draws (axis 0), widened to contain
    ``point`` when given: max(L, T) is convex, so near a kink most draws are slower than the
    point prediction and the draws' quantiles can miss it (docs/model-notes.md, "MAP
    calibration")."""
    low, high = np.quantile(samples, INTERVAL_QUANTILES, axis=0)
    if point is not None:
        low, high = np.minimum(low, point), np.maximum(high, point)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Posterior:
    """The Laplace approximation: theta = ln(figure values) ~ Normal(mean, covariance)."""

    mean: FloatArray
    covariance: FloatArray

    def sd(self) -> FloatArray:
        out: FloatArray = np.sqrt(np.maximum(np.diag(self.covariance), 0.0))
        return out

    def draws(self, rng: np.random.Generator, n: int) -> FloatArray:
        """``n`` draws of theta, shape (n, p)."""
        root = _covariance_root(self.covariance)
        out: FloatArray = self.mean + rng.standard_normal((n, self.mean.size)) @ root.T
        return out


def _covariance_root(covariance: FloatArray) -> FloatArray:
    """A matrix R with R R^T = covariance (eigen-decomposition: robust to near-singularity)."""
    values, vectors = np.linalg.eigh(covariance)
    root: FloatArray = vectors * np.sqrt(np.maximum(values, 0.0))
    return root


@dataclass(frozen=True, slots=True)
class FigureBelief:
    """A joint log-normal belief about the figures ``names`` (in that order)."""

    names: tuple[str, ...]
    posterior: Posterior

    @classmethod
    def from_priors(cls, priors: Mapping[str, Prior], values: Mapping[str, float]) -> FigureBelief:
        """Independent log-normals centred on the point ``values`` (the profile's figures,
        which the priors' medians are for an uncalibrated profile) with the priors' spreads:
        the draws then scatter around what the point answer uses."""
        names = tuple(n for n in priors if values.get(n, 0.0) > 0)
        mean = np.array([math.log(values[n]) for n in names], dtype=np.float64)
        sd = np.array([priors[n].sigma_log for n in names], dtype=np.float64)
        return cls(names, Posterior(mean, np.diag(sd**2)))

    @classmethod
    def from_calibration(
        cls,
        names: Sequence[str],
        mean_log: Sequence[float],
        covariance_log: Sequence[Sequence[float]],
    ) -> FigureBelief:
        """The Laplace posterior a calibration reported (CalibrationResult.posterior_*)."""
        return cls(
            tuple(names),
            Posterior(
                np.array(mean_log, dtype=np.float64), np.array(covariance_log, dtype=np.float64)
            ),
        )

    def draws(self, rng: np.random.Generator, n: int) -> dict[str, FloatArray]:
        """``n`` joint draws, as one array of values per figure name."""
        theta = self.posterior.draws(rng, n)
        return {name: np.exp(theta[:, j]) for j, name in enumerate(self.names)}
