"""A solve's time limit, the arithmetic every solver path shares."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def ms_until(at: float) -> int:
    """What is left until ``at`` (perf_counter seconds), in whole milliseconds, at least 1 (a
    Z3 timeout of 0 means none)."""
    return max(1, int((at - time.perf_counter()) * 1000))


@dataclass(frozen=True, slots=True)
class Deadline:
    """``time_limit_s`` from ``started`` (perf_counter seconds; default: now)."""

    time_limit_s: float
    started: float = field(default_factory=time.perf_counter)

    @property
    def at(self) -> float:
        return self.started + self.time_limit_s

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000
