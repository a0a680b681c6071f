"""The async-copy pipeline variant of GeMM-WS (docs/model-notes.md "GeMM-WS async-copy").

The paper's eq. (1)-(3) let the DMA warp start the next load only when the previous one has
*ended*, each load carrying its startup latency, so every buffer depth >= 2 predicts the same
time (GeMM-WS note 7). Here a stage's copy is *issued* (cost from the load throughput) and its
data *arrive* a latency later, so up to ``buffer_depth`` stages are in flight and depth hides
latency; and several CTAs may share an SM, sharing its load and MATH throughput.

Per stage i (1-based), with d the issue cost, lambda the load latency, T the MATH time, D the
buffer depth (all integer ns):

    I(i) = max(I(i-1) + d, M(i-D) + T)      (A1) copy issue: copy engine free, slot free
    A(i) = I(i) + d + lambda                  (A2) arrival
    M(i) = max(A(i), M(i-1) + T)              (A3) MATH waits for arrival and MATH i-1

with I(1) = 0 and the terms of stages <= 0 absent. Wave time = M(S) + T + T_EPILOGUE (the last
MATH must finish). Durations use integer ns; the work part and the startup part are rounded
separately so c CTAs sharing an SM multiply the work part by exactly c.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

from perfmodel.gemm_ws import (
    NS_PER_US,
    GemmShape,
    GemmWsMachine,
    SmLimits,
    Tiling,
    stage_count,
    us_to_ns,
    wave_count,
)


class Bound(StrEnum):
    """What sets the steady-state period of a stage (docs/model-notes.md, async-copy 3)."""

    LATENCY = "latency"
    LOAD = "load"
    MATH = "math"


@dataclass(frozen=True, slots=True)
class AsyncDurations:
    """Integer-ns durations of one stage of one CTA when ``ctas`` CTAs share the SM."""

    ctas: int
    #: d: cost of issuing one stage's copies (A and B tiles) on the shared copy engine
    issue_ns: int
    #: lambda: from the end of the issue to the data in shared memory
    latency_ns: int
    #: T: one stage's MATH on the shared MATH pipes
    math_ns: int


class AsyncDurationTable:
    """Unshared per-stage work in integer ns, computed once per machine (exact rationals)."""

    def __init__(self, machine: GemmWsMachine) -> None:
        self.load_ns_per_element = Fraction(NS_PER_US) / Fraction(
            machine.load_throughput_elements_per_us
        )
        self.math_ns_per_mac = Fraction(NS_PER_US) / Fraction(
            machine.compute_throughput_macs_per_us
        )
        self.latency_ns = us_to_ns(machine.load_startup_latency_us)
        self.math_startup_ns = us_to_ns(machine.compute_startup_latency_us)
        self.epilogue_ns = us_to_ns(machine.t_epilogue_us)
        self.init_ns = us_to_ns(machine.t_init_us)
        self._issue: dict[int, int] = {}
        self._math: dict[int, int] = {}

    def issue_ns_of_elements(self, elements: int) -> int:
        """``elements`` (one stage's A and B) / load throughput, rounded half up (one CTA alone)."""
        # Memoised: a search space has few distinct tile sizes, and rational arithmetic
        # dominates the optimizer's presolve otherwise.
        if elements not in self._issue:
            self._issue[elements] = _round_half_up(elements * self.load_ns_per_element)
        return self._issue[elements]

    def math_ns_of_macs(self, macs: int) -> int:
        """``macs`` (one stage's) / compute throughput, rounded half up (one CTA alone)."""
        if macs not in self._math:
            self._math[macs] = _round_half_up(macs * self.math_ns_per_mac)
        return self._math[macs]

    def durations(self, tiling: Tiling, ctas: int) -> AsyncDurations:
        # c CTAs share the SM's copy engine and MATH pipes: each sees 1/c of the throughput,
        # while latencies are per request and do not scale.
        tm, tn, tk = tiling.tile_m, tiling.tile_n, tiling.tile_k
        return AsyncDurations(
            ctas=ctas,
            issue_ns=ctas * self.issue_ns_of_elements(tm * tk + tk * tn),
            latency_ns=self.latency_ns,
            math_ns=ctas * self.math_ns_of_macs(tm * tn * tk) + self.math_startup_ns,
        )


def _round_half_up(value: Fraction) -> int:
    return math.floor(value + Fraction(1, 2))


@dataclass(frozen=True, slots=True)
class AsyncStageEvents:
    """Event times of one stage in one CTA, ns from the wave's start."""

    stage: int
    issue_start_ns: int
    arrival_ns: int
    math_start_ns: int
    math_wait_ns: int


@dataclass(frozen=True, slots=True)
class AsyncSimulation:
    shape: GemmShape
    tiling: Tiling
    ctas_per_sm: int
    #: durations of a full wave (ctas_per_sm CTAs sharing each SM)
    durations: AsyncDurations
    stages: int
    full_waves: int
    #: CTAs sharing the busiest SM in its last, partial wave (0: no partial wave)
    partial_wave_ctas: int
    wave_time_ns: int
    overall_time_ns: int
    #: sum over the busiest SM's waves of each CTA's per-stage MATH waits (§3.2 Wait(i))
    total_math_wait_ns: int
    stages_in_flight: int
    bound: Bound
    events: tuple[AsyncStageEvents, ...]

    @property
    def waves(self) -> int:
        return self.full_waves + (1 if self.partial_wave_ctas else 0)


def run_stages(durations: AsyncDurations, stages: int, depth: int) -> list[AsyncStageEvents]:
    """Eq. (A1)-(A3) stage by stage for one CTA."""
    d, lam, t = durations.issue_ns, durations.latency_ns, durations.math_ns
    issue = [0] * (stages + 1)
    math_start = [0] * (stages + 1)
    events: list[AsyncStageEvents] = []
    for i in range(1, stages + 1):
        # (A1): the copy engine is free after issuing stage i-1; the slot of stage i-D is free
        # once its MATH is done.
        engine_free = issue[i - 1] + d if i > 1 else 0
        slot_free = math_start[i - depth] + t if i > depth else 0
        issue[i] = max(engine_free, slot_free)
        arrival = issue[i] + d + lam  # (A2)
        previous_math_done = math_start[i - 1] + t if i > 1 else 0
        math_start[i] = max(arrival, previous_math_done)  # (A3)
        wait = math_start[i] - previous_math_done
        events.append(AsyncStageEvents(i, issue[i], arrival, math_start[i], wait))
    return events


def last_math_start_ns(durations: AsyncDurations, stages: int, depth: int) -> int:
    """M(S) in O(1) (docs/model-notes.md, async-copy 2).

    M(S) is the longest path to M(S) in the event graph of (A1)-(A3); a path that goes round
    the slot cycle M(j) -> I(j+D) -> M(j+D) k times has length
    (k+1)(d+lambda) + k T + (S-1-kD) max(d, T), linear in k, so its maximum is at k = 0 or
    k = floor((S-1)/D).
    """
    return int(
        last_math_start_formula(
            durations.issue_ns, durations.latency_ns, durations.math_ns, stages, depth, max
        )
    )


def last_math_start_formula(
    d: Any, lam: Any, t: Any, stages: Any, depth: Any, maximum: Callable[[Any, Any], Any]
) -> Any:
    """The closed form of M(S) on ints, or element-wise on int64 arrays with ``maximum`` =
    np.maximum (perfmodel/pipelines/async_copy/scoring.py); one formula for both."""
    per_stage = maximum(d, t)
    laps = (stages - 1) // depth
    straight = (stages - 1) * per_stage
    cycling = laps * (d + lam + t) + (stages - 1 - laps * depth) * per_stage
    return d + lam + maximum(straight, cycling)


def steady_state(durations: AsyncDurations, depth: int) -> tuple[Bound, int]:
    """(bound, stages in flight) of the steady state (docs/model-notes.md, async-copy 3).

    The period per stage is max(d, T, (d + lambda + T) / D): the copy engine, the MATH pipes,
    or the slot cycle of D stages each needing an issue, a latency and a MATH.
    """
    d, lam, t = durations.issue_ns, durations.latency_ns, durations.math_ns
    cycle = d + lam + t
    if cycle > depth * max(d, t):
        return Bound.LATENCY, depth
    if d > t:
        # The copy engine sets the pace; a stage holds its slot from issue to MATH end.
        return Bound.LOAD, min(depth, -(-cycle // d))
    # MATH sets the pace; copies run ahead until every slot is taken.
    return Bound.MATH, depth


def simulate_async(
    shape: GemmShape,
    tiling: Tiling,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    table: AsyncDurationTable | None = None,
    *,
    events: bool = True,
) -> AsyncSimulation:
    """Eq. (A1)-(A3) for one configuration; ValueError when one CTA does not fit an SM.

    The busiest SM runs q = ceil(tiles / SMs) CTAs: floor(q / c) full waves of c CTAs sharing
    it, then one wave of the q mod c left (they share the SM among fewer, so run faster).
    Wave count = ceil(q / c) = ceil(tiles / (SMs x c)): waves count CTA slots.

    ``events=False``: the closed form, each wave's last MATH start in O(1) from
    :func:`last_math_start_ns` instead of stage by stage, without per-stage events
    (``events`` is empty): every other field equal (the total MATH wait telescopes to
    M(S) - (S - 1) T per CTA, GeMM-WS 8).
    """
    table = table or AsyncDurationTable(machine)
    ctas = limits.ctas_per_sm(tiling.shared_memory_bytes(element_bytes))
    if ctas < 1:
        raise ValueError(
            "buffer_depth x stage buffer exceeds the shared memory of one SM: no CTA fits"
        )
    busiest = wave_count(shape, tiling, machine.sm_count)  # q, §2.1.1's W
    per_sm = min(ctas, busiest)  # an SM never holds more CTAs than it is given
    full_waves, partial = divmod(busiest, per_sm)
    stages, depth = stage_count(shape, tiling), tiling.buffer_depth
    overall, wait, wave = table.init_ns, 0, 0
    first_wave: tuple[AsyncStageEvents, ...] = ()
    for sharing, count in ((per_sm, full_waves), (partial, 1)):
        if not (sharing and count):
            continue
        durations = table.durations(tiling, sharing)
        if events:
            stepped = run_stages(durations, stages, depth)
            last, cta_wait = stepped[-1].math_start_ns, sum(e.math_wait_ns for e in stepped)
            first_wave = first_wave or tuple(stepped)
        else:
            last = last_math_start_ns(durations, stages, depth)
            cta_wait = last - (stages - 1) * durations.math_ns
        this_wave = last + durations.math_ns + table.epilogue_ns
        wave = wave or this_wave
        overall += count * this_wave
        wait += count * sharing * cta_wait
    full = table.durations(tiling, per_sm)
    bound, in_flight = steady_state(full, depth)
    return AsyncSimulation(
        shape=shape,
        tiling=tiling,
        ctas_per_sm=per_sm,
        durations=full,
        stages=stages,
        full_waves=full_waves,
        partial_wave_ctas=partial,
        wave_time_ns=wave,
        overall_time_ns=overall,
        total_math_wait_ns=wait,
        stages_in_flight=in_flight,
        bound=bound,
        events=first_wave,
    )
