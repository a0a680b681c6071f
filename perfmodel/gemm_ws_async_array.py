"""The async-copy GeMM-WS closed form over arrays of configurations (numpy; for scorers
and the optimizer's presolve). Kept apart from perfmodel/gemm_ws_async.py so the service
process, which imports the model, never loads numpy (tests/test_architecture.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, us_to_ns
from perfmodel.gemm_ws_async import (
    AsyncDurationTable,
    SmLimits,
    last_math_start_formula,
)

#: :func:`overall_time_async_ns_array`'s value for a configuration whose buffer does not fit
#: the shared memory of one SM
NOT_RESIDENT = -1


def overall_time_async_ns_array(
    shape: GemmShape,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    tile_m: npt.NDArray[np.integer[Any]],
    tile_n: npt.NDArray[np.integer[Any]],
    tile_k: npt.NDArray[np.integer[Any]],
    buffer_depth: npt.NDArray[np.integer[Any]],
) -> npt.NDArray[np.int64]:
    """:func:`overall_time_async_closed_form_ns` over arrays of configurations (int64 ns,
    exactly equal); :data:`NOT_RESIDENT` where no CTA fits an SM.

    The rounded per-stage work is computed once per distinct (A+B elements, MACs) value with
    exact rationals; everything after is integer array arithmetic.
    """
    tm, tn, tk, depth = (
        np.asarray(a, dtype=np.int64) for a in (tile_m, tile_n, tile_k, buffer_depth)
    )
    table = AsyncDurationTable(machine)
    elements = tm * tk + tk * tn
    macs = tm * tn * tk
    issue_work = _lookup(elements, table.issue_ns_of_elements)
    math_work = _lookup(macs, table.math_ns_of_macs)
    ctas = np.full(tm.shape, limits.ctas_per_sm(1), dtype=np.int64)  # limits without smem
    if limits.shared_memory_per_sm_bytes is not None:
        smem = depth * elements * element_bytes
        ctas = np.minimum(ctas, limits.shared_memory_per_sm_bytes // smem)
    tiles = -(-shape.m // tm) * -(-shape.n // tn)
    busiest = -(-tiles // machine.sm_count)
    resident = ctas >= 1
    per_sm = np.maximum(np.minimum(ctas, busiest), 1)
    full_waves, partial = np.divmod(busiest, per_sm)
    stages = -(-shape.k // tk)
    epilogue = us_to_ns(machine.t_epilogue_us)

    def wave(share: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        d = share * issue_work
        t = share * math_work + table.math_startup_ns
        lam = table.latency_ns
        result: npt.NDArray[np.int64] = (
            last_math_start_formula(d, lam, t, stages, depth, np.maximum) + t + epilogue
        )
        return result

    overall = us_to_ns(machine.t_init_us) + full_waves * wave(per_sm)
    overall = overall + np.where(partial > 0, wave(np.maximum(partial, 1)), 0)
    out: npt.NDArray[np.int64] = np.where(resident, overall, NOT_RESIDENT).astype(np.int64)
    return out


def _lookup(values: npt.NDArray[np.int64], rounded: Callable[[int], int]) -> npt.NDArray[np.int64]:
    unique, inverse = np.unique(values, return_inverse=True)
    table = np.array([rounded(int(v)) for v in unique], dtype=np.int64)
    out: npt.NDArray[np.int64] = table[inverse.reshape(values.shape)]
    return out
