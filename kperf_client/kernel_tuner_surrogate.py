"""The Kernel Tuner strategy's model of the whole search space: kperf's prediction for each
tiling plus what the measured runs teach about every other tune parameter.

A Bayesian linear model of log time (Bishop, *Pattern Recognition and Machine Learning*,
eq. (3.50)-(3.51): posterior precision ``A = S0^-1 + X^T X / sigma^2``, mean
``A^-1 (S0^-1 m0 + X^T y / sigma^2)``) over these features of a configuration:

- ``log`` of kperf's predicted time for its tiling, centred, with prior weight 1: the model
  starts as kperf's ranking of the tilings;
- one indicator per tiling (prior 0, sd ``TILING_SD``): where a tiling runs faster or slower
  than kperf said;
- one indicator per value of each other tune parameter (prior 0, sd ``PARAMETER_SD``): thread
  shapes, vector widths, caching flags, ... that kperf does not model. Their effects are
  shared by all tilings, so what one tiling's runs teach ranks the others' configurations.

The next configuration is drawn by Thompson sampling (Russo et al., "A Tutorial on Thompson
Sampling", 2018, Algorithm 2 with a Gaussian posterior): one weight vector from the
posterior, the configuration it predicts fastest. The first draw is the posterior mean (kperf's
ranking; ties broken at random).

Only the fast region matters for the search, and an additive model cannot fit the slow
configurations' interactions (a 5x slow thread shape is not the sum of its parameters):
measured times are clipped at ``CLIP`` x the fastest so far. A failed (invalid)
configuration counts as ``CLIP`` x slower again: worse than any run, so that the draws soon
leave the parameter values that fail.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["Surrogate"]

#: sd of log time the additive model leaves unexplained (10 %: the caches' repeat noise is
#: ~1 %, the rest is the interactions the model does not hold)
NOISE_SD = 0.1
#: prior sd of one parameter value's effect on log time (15 %)
PARAMETER_SD = 0.15
#: prior sd of a tiling's departure from kperf's prediction (5 %), and of the prediction's
#: weight around 1: kperf's tiling ranking is trusted until runs say otherwise
TILING_SD = 0.05
KPERF_SD = 0.05
#: measured times are clipped at this multiple of the fastest so far (and invalid ones set
#: to it): the model fits the region the search is after
CLIP = 1.5
#: the intercept's prior precision (practically flat)
FLAT = 1e-4
#: refit from all runs (the clip moved) at least every this many runs
REFIT_EVERY = 10

Float = NDArray[np.floating[Any]]


class Surrogate:
    """The model over ``configs`` (tuples of tune parameter values). ``tiling_of[i]``: the
    tiling of ``configs[i]`` (any hashable); ``inner``: the positions of the parameters that
    are not the tiling's; ``predicted_us``: kperf's time per tiling (missing or empty: no
    prior, the tiling indicators learn alone)."""

    def __init__(
        self,
        configs: Sequence[tuple[object, ...]],
        tiling_of: Sequence[Hashable],
        inner: Sequence[int],
        rng: random.Random,
    ) -> None:
        self.rng = np.random.default_rng(rng.getrandbits(64))
        columns: dict[tuple[object, ...], int] = {}
        rows: list[list[int]] = []
        for config, tiling in zip(configs, tiling_of, strict=True):
            keys = [("tiling", tiling), *((i, config[i]) for i in inner)]
            rows.append([columns.setdefault(key, len(columns)) for key in keys])
        self.tilings = list(tiling_of)
        self.width = len(columns) + 2  # + kperf's log time, + intercept
        self.features = np.zeros((len(configs), self.width))
        for r, row in enumerate(rows):
            self.features[r, row] = 1.0
        self.features[:, -1] = 1.0
        self.prior_mean = np.zeros(self.width)
        self.prior_precision = np.full(self.width, PARAMETER_SD**-2)
        for (kind, _), column in columns.items():
            if kind == "tiling":
                self.prior_precision[column] = TILING_SD**-2
        self.prior_precision[-1] = FLAT
        self.set_prediction({})
        self.runs: list[tuple[int, float]] = []  # (row, time; inf: invalid)
        self.fastest = math.inf
        self.gram = np.zeros((self.width, self.width))
        self.moment = np.zeros(self.width)
        self.fitted_runs = 0

    def set_prediction(self, predicted_us: Mapping[Hashable, float]) -> None:
        """kperf's predicted time per tiling (us): its log, centred, is the first feature, with
        prior weight 1; without predictions the weight is 0 (no prior on the tilings)."""
        logs = [
            math.log(predicted_us[t]) if predicted_us.get(t, 0) > 0 else math.nan
            for t in self.tilings
        ]
        known = [v for v in logs if not math.isnan(v)]
        centre = sum(known) / len(known) if known else 0.0
        self.features[:, -2] = [0.0 if math.isnan(v) else v - centre for v in logs]
        self.prior_mean[-2] = 1.0 if known else 0.0
        self.prior_precision[-2] = KPERF_SD**-2
        self.fitted_runs = -1  # the design changed: refit from all runs

    def add(self, row: int, time: float) -> None:
        """A measured run of ``configs[row]`` (time in any unit; inf: invalid)."""
        self.runs.append((row, time))
        if time < self.fastest:
            self.fastest = time
            self.fitted_runs = -1  # the clip moved

    def _target(self, time: float) -> float:
        ceiling = math.log(CLIP * self.fastest)
        return ceiling + math.log(CLIP) if not math.isfinite(time) else min(math.log(time), ceiling)

    def _fit(self) -> tuple[Float, Float]:
        """The posterior's mean and its precision's Cholesky factor, from the runs."""
        if not math.isfinite(self.fastest):
            usable: list[tuple[int, float]] = []  # nothing to clip against yet
        elif self.fitted_runs < 0 or len(self.runs) - self.fitted_runs >= REFIT_EVERY:
            usable = self.runs
            self.gram = np.zeros((self.width, self.width))
            self.moment = np.zeros(self.width)
        else:
            usable = self.runs[self.fitted_runs :]
        if usable:
            x = self.features[[r for r, _ in usable]]
            self.gram += x.T @ x
            self.moment += x.T @ np.array([self._target(t) for _, t in usable])
            self.fitted_runs = len(self.runs)
        precision = self.gram / NOISE_SD**2 + np.diag(self.prior_precision)
        mean: Float = np.linalg.solve(
            precision, self.moment / NOISE_SD**2 + self.prior_precision * self.prior_mean
        )
        factor: Float = np.linalg.cholesky(precision)
        return mean, factor

    def scores(self, sample: bool) -> Float:
        """Predicted log time of every configuration: under one posterior draw (``sample``)
        or the posterior mean, plus a tie-breaking jitter far below any effect."""
        mean, factor = self._fit()
        weights = mean
        if sample:
            weights = mean + np.linalg.solve(factor.T, self.rng.standard_normal(self.width))
        jitter = 1e-9 * self.rng.random(len(self.features))
        scores: Float = self.features @ weights + jitter
        return scores
