"""The async-copy closed form over arrays of configurations and figure draws (numpy; for the
certified optimizer's scorer, explore shortlists and the presolve). Kept apart from
recurrences.py so the service process, which imports the model, never loads numpy
(tests/test_architecture.py).

:func:`score_async_configurations` gives what :func:`perfmodel.gemm_ws_scoring.score_configurations`
gives for the paper's model: ``overall_time_ns`` and ``total_math_wait_ns`` of shape ``(D, C)``,
equal bit for bit to :func:`perfmodel.pipelines.async_copy.recurrences.simulate_async` on every
pair. The rounded per-stage work (issue: A + B elements / load throughput; MATH: MACs / compute
throughput) is evaluated in float64 where that decides the rounding and on exact rationals
(:class:`AsyncDurationTable`) elsewhere, once per distinct work value; everything after is int64
arithmetic (docs/model-notes.md, "GeMM-WS async-copy" 1-2).
"""

from __future__ import annotations

import functools

import numpy as np

from perfmodel.gemm_ws import GemmShape, SmLimits
from perfmodel.gemm_ws_scoring import (
    MAX_SCORED_TIME_NS,
    Configurations,
    Figures,
    IntArray,
    ScoreOverflow,
    Scores,
    _durations_ns,
    _times_ns,
)
from perfmodel.pipelines.async_copy.recurrences import (
    AsyncDurationTable,
    last_math_start_formula,
)


def ctas_per_sm_array(limits: SmLimits, element_bytes: int, configs: Configurations) -> IntArray:
    """:meth:`SmLimits.ctas_per_sm` of every configuration (0: one CTA does not fit an SM)."""
    ctas = np.full(configs.count, limits.ctas_per_sm(1), dtype=np.int64)  # limits w/o smem
    if limits.shared_memory_per_sm_bytes is not None:
        smem = configs.buffer_depth * (
            configs.tile_m * configs.tile_k + configs.tile_k * configs.tile_n
        )
        ctas = np.minimum(ctas, limits.shared_memory_per_sm_bytes // (smem * element_bytes))
    return ctas


def score_async_configurations(
    shape: GemmShape,
    configs: Configurations,
    figures: Figures,
    limits: SmLimits,
    element_bytes: int,
) -> Scores:
    """Overall time and total MATH wait of every configuration under every figure draw:
    ``simulate_async(shape, tiling, machine, limits, element_bytes)`` on each pair, vectorised.
    Configurations that do not fit an SM (ctas_per_sm 0) are scored as if one CTA did: the
    caller leaves them out (:func:`ctas_per_sm_array`)."""
    columns = figures.columns()
    # one duration table per draw, built when first read (exact rationals are slow)
    table = functools.cache(lambda draw: AsyncDurationTable(figures._machine(columns, draw)))

    tm, tn, tk, depth = configs.tile_m, configs.tile_n, configs.tile_k, configs.buffer_depth
    if configs.count and min(int(a.min()) for a in (tm, tn, tk, depth)) < 1:
        raise ValueError("tile sizes and buffer depths must be at least 1")
    draws = columns["t_init_us"].shape[0]
    zero = np.zeros(draws)
    # the work parts, unshared and without startup: rounded once per distinct work value
    elements, element_index = np.unique(tm * tk + tk * tn, return_inverse=True)
    issue_work = _durations_ns(
        elements,
        columns["load_throughput_elements_per_us"],
        zero,
        lambda d: table(d).issue_ns_of_elements,
    )[:, element_index.reshape(-1)]
    macs, mac_index = np.unique(tm * tn * tk, return_inverse=True)
    math_work = _durations_ns(
        macs, columns["compute_throughput_macs_per_us"], zero, lambda d: table(d).math_ns_of_macs
    )[:, mac_index.reshape(-1)]
    latency = _times_ns(columns["load_startup_latency_us"])[:, None]
    math_startup = _times_ns(columns["compute_startup_latency_us"])[:, None]
    epilogue = _times_ns(columns["t_epilogue_us"])[:, None]
    init = _times_ns(columns["t_init_us"])[:, None]

    ctas = ctas_per_sm_array(limits, element_bytes, configs)
    tiles = -(-shape.m // tm) * -(-shape.n // tn)
    busiest = -(-tiles // figures.sm_count)  # q = ceil(tiles / SMs) (§2.1.1)
    per_sm = np.maximum(np.minimum(ctas, busiest), 1)
    full_waves, partial = np.divmod(busiest, per_sm)
    stages = -(-shape.k // tk)
    # the int64 sums below are exact when the float estimate of the largest stays in range
    estimate = (
        (per_sm * (issue_work + math_work) + latency + math_startup + epilogue).astype(np.float64)
        * (stages + 2.0)
        * 2.0
        + 1e6
    ) * busiest
    if not np.all(estimate < MAX_SCORED_TIME_NS):
        raise ScoreOverflow("an overall time exceeds the scorer's int64 range")

    def wave(share: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        d = share * issue_work  # c CTAs share the copy engine and the MATH pipes
        t = share * math_work + math_startup
        last_math_start: IntArray = last_math_start_formula(
            d, latency, t, stages, depth, np.maximum
        )
        return last_math_start + t + epilogue, last_math_start, t

    full_wave, full_ms, full_t = wave(per_sm)
    overall = init + full_waves * full_wave
    # per CTA, sum of MATH waits telescopes to M(S) - (S - 1) T (GeMM-WS 8)
    wait = full_waves * per_sm * (full_ms - (stages - 1) * full_t)
    has_rest = partial > 0
    if np.any(has_rest):  # a partial wave of fewer CTAs sharing the SM
        rest_wave, rest_ms, rest_t = wave(np.maximum(partial, 1))
        overall = overall + np.where(has_rest, rest_wave, 0)
        wait = wait + np.where(has_rest, partial * (rest_ms - (stages - 1) * rest_t), 0)
    return Scores(overall_time_ns=overall.astype(np.int64), total_math_wait_ns=wait)
