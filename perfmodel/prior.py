"""A figure's log-normal prior: plain data, no numerical stack (the service's own process
reads profiles' priors without loading numpy; docs/model-notes.md, "Priors")."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prior:
    """ln(value) ~ Normal(ln(median), sigma_log^2); ``median`` in the figure's own unit."""

    median: float
    sigma_log: float
    source: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median > 0):
            raise ValueError(f"a prior's median must be positive and finite, got {self.median}")
        if not (math.isfinite(self.sigma_log) and self.sigma_log > 0):
            raise ValueError(f"a prior's sigma_log must be positive, got {self.sigma_log}")
