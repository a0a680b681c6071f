"""The async-copy closed form the calibration fits, vectorised over runs.

docs/model-notes.md, "GeMM-WS async-copy" 1-2: with c CTAs sharing an SM, d = c a (TM TK + TK
TN), lambda = l_load, T = c b TM TN TK + l_math (a = 1/load throughput, b = 1/compute
throughput),

    M(S) = d + lambda + max( (S-1) max(d, T),  K (d + lambda + T) + (S-1-K D) max(d, T) )
    wave(c) = M(S) + T + T_EPILOGUE,            K = floor((S-1)/D)
    time = floor(q/c) wave(c) + [r > 0] wave(r) + T_INIT,   q = ceil(tiles/SMs), r = q mod c

which is linear in (a, b, l_load, l_math, T_INIT, T_EPILOGUE) once it is known which of d and
T is larger and which branch of the outer max holds in each wave: piecewise linear like the
paper's closed form (gemm_ws_model.py), so the Jacobian below is exact within a regime. The
CTAs per SM of each run are fixed (shared memory, the profile's cap, and the run's threads
and registers when it gives them): they depend on the tiling, never on the fitted figures.
Residuals are reported with the service's integer-ns model
(recurrences.simulate_async, closed form).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.calibration.engine import BoolArray, FloatArray, IntArray
from perfmodel.calibration.gemm_ws_model import (
    internal_values,
    shape_and_tiling,
)
from perfmodel.calibration.records import GEMM_WS_FIGURES, GemmWsMeasurement
from perfmodel.errors import CalibrationInputError
from perfmodel.gemm_ws import ELEMENT_BYTES, GemmWsMachine, SmLimits, stage_count, wave_count


def run_limits(limits: SmLimits, run: GemmWsMeasurement) -> SmLimits:
    """``limits`` with the run's own ``threads_per_cta`` / ``registers_per_thread`` when it
    carries them."""
    threads, registers = run.threads_per_cta, run.registers_per_thread
    if threads is None and registers is None:
        return limits
    return dataclasses.replace(
        limits,
        threads_per_cta=threads if threads is not None else limits.threads_per_cta,
        registers_per_thread=registers if registers is not None else limits.registers_per_thread,
    )


def ctas_per_sm_of_run(limits: SmLimits, run: GemmWsMeasurement, index: int) -> int:
    """Resident CTAs per SM of ``run`` (CalibrationInputError naming ``measurements[index]``
    when not one fits)."""
    shape, tiling = shape_and_tiling(run)
    element_bytes = ELEMENT_BYTES[run.dtype]
    ctas = run_limits(limits, run).ctas_per_sm(tiling.shared_memory_bytes(element_bytes))
    if ctas < 1:
        raise CalibrationInputError(
            f"measurements[{index}]",
            f"tiling {run.tile_m}x{run.tile_n}x{run.tile_k} with buffer depth "
            f"{run.buffer_depth} cannot be resident on an SM of this device (shared memory "
            "per SM, threads or registers): no CTA fits",
        )
    return ctas


@dataclass(frozen=True, slots=True)
class _AsyncRuns:
    """Per-run constants of the async closed form, as arrays over the measurements."""

    load_elements: FloatArray  # TM TK + TK TN per stage (at the dtype's throughput)
    macs: FloatArray  # TM TN TK per stage (at the dtype's throughput)
    stages: FloatArray  # S
    depth: FloatArray  # D
    laps: FloatArray  # K = floor((S-1)/D)
    full_ctas: FloatArray  # c of the full waves
    full_waves: FloatArray  # floor(q/c)
    partial_ctas: FloatArray  # r = q mod c (0: no partial wave)

    def subset(self, rows: IntArray) -> _AsyncRuns:
        return _AsyncRuns(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


def _async_runs(
    runs: Sequence[GemmWsMeasurement],
    sm_count: int,
    limits: SmLimits,
    dtype_ratios: Mapping[str, tuple[float, float]],
) -> _AsyncRuns:
    cols: list[list[float]] = [[] for _ in dataclasses.fields(_AsyncRuns)]
    for i, run in enumerate(runs):
        shape, tiling = shape_and_tiling(run)
        load_ratio, compute_ratio = dtype_ratios.get(run.dtype, (1.0, 1.0))
        stages = stage_count(shape, tiling)
        busiest = wave_count(shape, tiling, sm_count)  # q
        per_sm = min(ctas_per_sm_of_run(limits, run, i), busiest)
        full, partial = divmod(busiest, per_sm)
        values = (
            run.tile_k * (run.tile_m + run.tile_n) / load_ratio,
            run.tile_m * run.tile_n * run.tile_k / compute_ratio,
            stages,
            run.buffer_depth,
            (stages - 1) // run.buffer_depth,
            per_sm,
            full,
            partial,
        )
        for col, value in zip(cols, values, strict=True):
            col.append(float(value))
    return _AsyncRuns(*(np.array(c, dtype=np.float64) for c in cols))


class AsyncResidualModel:
    """Async-copy closed-form predictions (us) of a list of runs; ``x`` holds the fitted
    figures' internal values (1/throughput or latency) in the order of ``fitted``."""

    def __init__(self, runs: _AsyncRuns, base_internal: FloatArray, fitted: IntArray) -> None:
        self._runs = runs
        self._base = base_internal  # all six figures, GEMM_WS_FIGURES order
        self._fitted = fitted

    def subset(self, rows: IntArray) -> AsyncResidualModel:
        return AsyncResidualModel(self._runs.subset(rows), self._base, self._fitted)

    def _figures(self, x: FloatArray) -> FloatArray:
        full = self._base.copy()
        full[self._fitted] = x
        return full

    def _wave(self, x: FloatArray, ctas: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(wave time, d(wave)/d(all six internal figures), shape (n, 6)) at ``ctas`` CTAs
        per SM (0 where the wave is absent: its terms are then multiplied by 0 waves)."""
        a, b, l_load, l_math, _, t_epilogue = self._figures(x)
        r = self._runs
        d = ctas * a * r.load_elements
        t = ctas * b * r.macs + l_math
        per_stage = np.maximum(d, t)
        straight = (r.stages - 1) * per_stage
        rest = r.stages - 1 - r.laps * r.depth
        cycling = r.laps * (d + l_load + t) + rest * per_stage
        cycles = cycling > straight
        wave = d + l_load + np.maximum(straight, cycling) + t + t_epilogue
        # d M(S) / d(d, lambda, T) in the branch that holds (ties: the straight branch and
        # d >= T, one side of each kink, as the paper's closed form counts ties load-bound)
        chain = np.where(cycles, rest, r.stages - 1)
        laps = np.where(cycles, r.laps, 0.0)
        issue_sets = d >= t
        d_issue = 1 + laps + np.where(issue_sets, chain, 0.0)
        d_latency = 1 + laps
        d_math = laps + np.where(issue_sets, 0.0, chain) + 1  # + the last MATH
        jac = np.column_stack(
            [
                d_issue * ctas * r.load_elements,
                d_math * ctas * r.macs,
                d_latency,
                d_math,
                np.zeros_like(d),
                np.ones_like(d),
            ]
        )
        return wave, jac

    def _terms(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        r = self._runs
        t_init = self._figures(x)[4]
        full, full_jac = self._wave(x, r.full_ctas)
        part, part_jac = self._wave(x, np.maximum(r.partial_ctas, 1.0))
        has_partial = (r.partial_ctas > 0).astype(np.float64)
        total = r.full_waves * full + has_partial * part + t_init
        jac = r.full_waves[:, None] * full_jac + has_partial[:, None] * part_jac
        jac[:, 4] = 1.0
        return total, jac

    def predict(self, x: FloatArray) -> FloatArray:
        return self._terms(x)[0]

    def jacobian(self, x: FloatArray) -> FloatArray:
        return np.asarray(self._terms(x)[1][:, self._fitted], dtype=np.float64)

    def _issue_bound(self, x: FloatArray) -> BoolArray:
        a, b, _, l_math, _, _ = self._figures(x)
        r = self._runs
        d = r.full_ctas * a * r.load_elements
        t = r.full_ctas * b * r.macs + l_math
        bound: BoolArray = d >= t
        return bound

    def load_bound_runs(self, x: FloatArray) -> int:
        """Runs whose copy issue outlasts their MATH (d >= T) at ``x``."""
        return int(self._issue_bound(x).sum())

    def overlapped_runs(self) -> int:
        """Every run: under async-copy even depth 1 overlaps the issue of stage i+1 with
        nothing but the MATH of stage i (A1), so both throughputs enter every run."""
        return int(self._runs.stages.size)

    def ctas_per_sm(self) -> FloatArray:
        return self._runs.full_ctas


def async_closed_form_model(
    base: GemmWsMachine,
    runs: Sequence[GemmWsMeasurement],
    names: Sequence[str],
    limits: SmLimits,
    dtype_ratios: Mapping[str, tuple[float, float]] | None = None,
) -> AsyncResidualModel:
    """The async closed-form model of ``runs`` on SMs of ``limits`` with figures ``names``
    free (in that order) and the others at ``base``'s values."""
    return AsyncResidualModel(
        _async_runs(runs, base.sm_count, limits, dtype_ratios or {}),
        internal_values(base, GEMM_WS_FIGURES),
        np.array([GEMM_WS_FIGURES.index(n) for n in names], dtype=np.intp),
    )
