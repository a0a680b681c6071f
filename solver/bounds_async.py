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
partial wave as the model does. The certificate (solver/certify_async.py) encodes only
configurations whose bound does not exceed the incumbent's time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.gemm_ws import GemmShape, GemmWsMachine
from perfmodel.gemm_ws_async import AsyncDurationTable, SmLimits
from perfmodel.gemm_ws_async_array import _lookup, ctas_per_sm_array
from perfmodel.gemm_ws_scoring import Configurations, IntArray


@dataclass(frozen=True, slots=True)
class AsyncPlan:
    """What is constant once a configuration is chosen, per configuration (int64 arrays)."""

    #: CTAs sharing an SM in a full wave (c), full waves, CTAs of the partial wave (0: none)
    ctas_per_sm: IntArray
    full_waves: IntArray
    partial_wave_ctas: IntArray
    stages: IntArray
    #: unshared per-stage work, integer ns (exact rationals, AsyncDurationTable)
    issue_work_ns: IntArray
    math_work_ns: IntArray
    latency_ns: int
    math_startup_ns: int
    epilogue_ns: int
    init_ns: int
    #: lower bound on the overall time (the module docstring)
    overall_time_floor_ns: IntArray


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
    issue = _lookup(tm * tk + tk * tn, table.issue_ns_of_elements)
    math = _lookup(tm * tn * tk, table.math_ns_of_macs)
    ctas = ctas_per_sm_array(limits, element_bytes, configs)
    if configs.count and int(ctas.min()) < 1:
        raise ValueError("every configuration must fit the shared memory of one SM")
    busiest = -(-(-(-shape.m // tm) * -(-shape.n // tn)) // machine.sm_count)
    per_sm = np.minimum(ctas, busiest)
    full_waves, partial = np.divmod(busiest, per_sm)
    stages = -(-shape.k // tk)
    lam, startup = table.latency_ns, table.math_startup_ns

    def wave_floor(share: IntArray) -> IntArray:
        d, t = share * issue, share * math + startup
        chains = d + lam + (stages - 1) * np.maximum(d, t)
        laps = d + lam + ((stages - 1) // depth) * (d + lam + t)
        floor: IntArray = np.maximum(chains, laps) + t + table.epilogue_ns
        return floor

    floor = (
        table.init_ns
        + full_waves * wave_floor(per_sm)
        + np.where(partial > 0, wave_floor(np.maximum(partial, 1)), 0)
    )
    return AsyncPlan(
        ctas_per_sm=per_sm,
        full_waves=full_waves,
        partial_wave_ctas=partial,
        stages=stages,
        issue_work_ns=issue,
        math_work_ns=math,
        latency_ns=lam,
        math_startup_ns=startup,
        epilogue_ns=table.epilogue_ns,
        init_ns=table.init_ns,
        overall_time_floor_ns=floor.astype(np.int64),
    )
