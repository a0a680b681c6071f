"""Per-configuration constants and lower bounds ("cuts") of the async-copy variant, over arrays
of configurations (numpy; worker side only). The async twin of solver/bounds.py.

For one configuration (c CTAs sharing an SM, issue cost d, latency lambda, MATH T, depth D,
S stages), (A1)-(A3) (docs/model-notes.md, "GeMM-WS async-copy" 1) imply

* ``M(S) >= d + lambda + (S-1) max(d, T)``: the arrival of stage 1, then S-1 steps of the
  copy-engine chain (A1) or of the MATH chain (A3), whichever is slower;
* ``M(S) >= d + lambda + K (d + lambda + T)``, K = floor((S-1)/D): K laps round the slot cycle
  M(j) -> I(j+D) -> A(j+D) -> M(j+D) of (A1)-(A3).

Each is a path of the event graph, so each holds for every solution of the recurrences whether
or not it is tight; the wave time adds T + T_EPILOGUE, the overall time counts the full and the
partial wave as the model does, and the total MATH wait, which telescopes to
sum over CTAs of M(S) - (S-1) T (GeMM-WS 8), is bounded at the same M(S) bound. The certificate
(solver/per_configuration.py) encodes only configurations these bounds leave able to beat the
incumbent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.gemm_ws_scoring import Configurations, IntArray, rounded_once
from perfmodel.pipelines.async_copy.recurrences import AsyncDurations, AsyncDurationTable
from perfmodel.pipelines.async_copy.scoring import ctas_per_sm_array


@dataclass(frozen=True, slots=True)
class AsyncConfig:
    """One configuration to encode, with everything that is constant once it is chosen."""

    tiling: Tiling
    stages: int
    full_waves: int
    ctas_per_sm: int
    partial_wave_ctas: int
    full: AsyncDurations
    #: durations of the partial wave (r CTAs sharing); unused when partial_wave_ctas is 0
    partial: AsyncDurations


@dataclass(frozen=True, slots=True)
class AsyncPlan:
    """What is constant once a configuration is chosen, per configuration (int64 arrays)."""

    #: CTAs sharing an SM in a full wave (c), full waves, CTAs of the partial wave (0: none)
    ctas_per_sm: IntArray
    full_waves: IntArray
    partial_wave_ctas: IntArray
    stages: IntArray
    #: the machine's unshared per-stage work and its latencies, integer ns (exact rationals)
    table: AsyncDurationTable
    #: lower bound on the overall time (the module docstring)
    overall_time_floor_ns: IntArray
    #: lower bound on the total MATH wait: sum over CTAs of M(S) - (S - 1) T, at M(S)'s bound
    total_math_wait_floor_ns: IntArray


def async_plan(
    shape: GemmShape,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    configs: Configurations,
) -> AsyncPlan:
    """Constants and overall-time bounds of ``configs`` (each must fit an SM)."""
    table = AsyncDurationTable(machine)
    tm, tn, tk, depth = configs.tile_m, configs.tile_n, configs.tile_k, configs.buffer_depth
    issue = rounded_once(tm * tk + tk * tn, table.issue_ns_of_elements)
    math = rounded_once(tm * tn * tk, table.math_ns_of_macs)
    ctas = ctas_per_sm_array(limits, element_bytes, configs)
    if configs.count and int(ctas.min()) < 1:
        raise ValueError("every configuration must fit the shared memory of one SM")
    busiest = -(-(-(-shape.m // tm) * -(-shape.n // tn)) // machine.sm_count)
    per_sm = np.minimum(ctas, busiest)
    full_waves, partial = np.divmod(busiest, per_sm)
    stages = -(-shape.k // tk)
    lam, startup = table.latency_ns, table.math_startup_ns

    def floors(share: IntArray) -> tuple[IntArray, IntArray]:
        """(wave time, one CTA's MATH wait) bounds of a wave of ``share`` CTAs per SM."""
        d, t = share * issue, share * math + startup
        chains = d + lam + (stages - 1) * np.maximum(d, t)
        laps = d + lam + ((stages - 1) // depth) * (d + lam + t)
        last_math_start = np.maximum(chains, laps)
        return last_math_start + t + table.epilogue_ns, last_math_start - (stages - 1) * t

    full_wave, full_wait = floors(per_sm)
    rest_wave, rest_wait = floors(np.maximum(partial, 1))
    has_rest = partial > 0
    floor = table.init_ns + full_waves * full_wave + np.where(has_rest, rest_wave, 0)
    wait_floor = full_waves * per_sm * full_wait + np.where(has_rest, partial * rest_wait, 0)
    return AsyncPlan(
        ctas_per_sm=per_sm,
        full_waves=full_waves,
        partial_wave_ctas=partial,
        stages=stages,
        table=table,
        overall_time_floor_ns=floor.astype(np.int64),
        total_math_wait_floor_ns=wait_floor.astype(np.int64),
    )


def encoded_configs(
    shape: GemmShape,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    configs: Configurations,
) -> list[AsyncConfig]:
    """The encoding's per-configuration constants (solver/encodings/async_copy.py)."""
    plan = async_plan(shape, machine, limits, element_bytes, configs)
    out = []
    for i, tiling in enumerate(configs.tilings()):
        c, r = int(plan.ctas_per_sm[i]), int(plan.partial_wave_ctas[i])
        out.append(
            AsyncConfig(
                tiling=tiling,
                stages=int(plan.stages[i]),
                full_waves=int(plan.full_waves[i]),
                ctas_per_sm=c,
                partial_wave_ctas=r,
                full=plan.table.durations(tiling, c),
                partial=plan.table.durations(tiling, max(r, 1)),
            )
        )
    return out
