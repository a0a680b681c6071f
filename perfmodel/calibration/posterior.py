"""What is believed about a device's figures, as draws: the posterior of its last calibration
(the Laplace approximation the MAP fit reports), or its priors where it was never calibrated.

ln(figures) ~ Normal(mean, covariance); figures no calibration fitted and no prior covers stay
at their point values in every draw. Pure: the app builds one from a profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.calibration.engine import FloatArray, Posterior
from perfmodel.calibration.priors import Prior


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
