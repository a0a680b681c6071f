"""The closed form of the GeMM-WS model the calibration fits, vectorised over runs.

The fit works on the closed form of the recurrences (docs/model-notes.md GeMM-WS 7): with
L = T_LOAD-A + T_LOAD-B = a (TM TK + TK TN) + 2 l_load and T = T_MATH = b TM TN TK + l_math
(eq. (4)/(6) with a = 1/load throughput, b = 1/compute throughput),

    Sm(S) = L + (S - 1) max(L, T)      (depth >= 2),   L + (S - 1)(L + T)   (depth 1)
    time  = W (Sm(S) [+ T] + T_EPILOGUE) + T_INIT          (§2.1.1, §2.2)

which is linear in (a, b, l_load, l_math, T_INIT, T_EPILOGUE) once it is known which of L
and T is larger in each run: piecewise linear, so the Jacobian below is exact. Residuals are
reported with the service's own integer-nanosecond model (gemm_ws.predict_gemm_ws_us).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.calibration.engine import BoolArray, FloatArray, IntArray
from perfmodel.calibration.records import GEMM_WS_FIGURES, GemmWsMeasurement
from perfmodel.gemm_ws import (
    GemmShape,
    GemmWsMachine,
    Tiling,
    WaveTimeModel,
    stage_count,
    wave_count,
)

THROUGHPUTS = ("load_throughput_elements_per_us", "compute_throughput_macs_per_us")
#: relative |L - T| under which a run is on the kink of max(L, T): both slopes are checked
KINK_TOLERANCE = 1e-6


def shape_and_tiling(run: GemmWsMeasurement) -> tuple[GemmShape, Tiling]:
    return GemmShape(run.m, run.n, run.k), Tiling(
        run.tile_m, run.tile_n, run.tile_k, run.buffer_depth
    )


@dataclass(frozen=True, slots=True)
class _Runs:
    """Per-run constants of the closed form, as arrays over the measurements."""

    load_elements: FloatArray  # TM TK + TK TN, elements loaded per stage
    macs: FloatArray  # TM TN TK per stage
    stages: FloatArray  # S
    waves: FloatArray  # W
    serial: BoolArray  # depth 1: load and MATH do not overlap

    def subset(self, rows: IntArray) -> _Runs:
        return _Runs(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


def _runs(
    measurements: Sequence[GemmWsMeasurement],
    sm_count: int,
    dtype_ratios: Mapping[str, tuple[float, float]],
) -> _Runs:
    """Per-run constants; a run of a dtype whose throughputs are ``ratios`` times the
    reference figures counts its elements and MACs divided by them (eq. (4)/(6) at that
    dtype's throughput)."""
    cols: list[list[float]] = [[], [], [], []]
    serial = []
    for m in measurements:
        shape, tiling = shape_and_tiling(m)
        load_ratio, compute_ratio = dtype_ratios.get(m.dtype, (1.0, 1.0))
        cols[0].append(m.tile_k * (m.tile_m + m.tile_n) / load_ratio)
        cols[1].append(m.tile_m * m.tile_n * m.tile_k / compute_ratio)
        cols[2].append(stage_count(shape, tiling))
        cols[3].append(wave_count(shape, tiling, sm_count))
        serial.append(m.buffer_depth == 1)
    load_elements, macs, stages, waves = (np.array(c, dtype=np.float64) for c in cols)
    return _Runs(load_elements, macs, stages, waves, np.array(serial, dtype=np.bool_))


class GemmWsResidualModel:
    """Closed-form predictions (µs) of a list of runs; ``x`` holds the fitted figures'
    internal values (1/throughput or latency) in the order of ``fitted``."""

    def __init__(
        self,
        runs: _Runs,
        base_internal: FloatArray,
        fitted: IntArray,
        include_last_math: bool,
    ) -> None:
        self._runs = runs
        self._base = base_internal  # all six figures, GEMM_WS_FIGURES order
        self._fitted = fitted
        self._tail = 1.0 if include_last_math else 0.0

    def subset(self, rows: IntArray) -> GemmWsResidualModel:
        return GemmWsResidualModel(
            self._runs.subset(rows), self._base, self._fitted, bool(self._tail)
        )

    def _figures(self, x: FloatArray) -> FloatArray:
        full = self._base.copy()
        full[self._fitted] = x
        return full

    def _durations(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        a, b, l_load, l_math, _, _ = self._figures(x)
        r = self._runs
        load = a * r.load_elements + 2 * l_load  # eq. (4): A then B tile, each with a startup
        t_math = b * r.macs + l_math  # eq. (6)
        return load, t_math

    def _load_bound(self, x: FloatArray, ties_load_bound: bool) -> BoolArray:
        """Overlapped runs whose stage is set by the loads (L > T); a run within
        ``KINK_TOLERANCE`` of L = T counts as load-bound iff ``ties_load_bound``."""
        load, t_math = self._durations(x)
        gap = (load - t_math) / np.maximum(load, t_math)
        bound: BoolArray = ~self._runs.serial & (
            gap >= -KINK_TOLERANCE if ties_load_bound else gap > KINK_TOLERANCE
        )
        return bound

    def predict(self, x: FloatArray) -> FloatArray:
        load, t_math = self._durations(x)
        r = self._runs
        t_init, t_epilogue = self._figures(x)[4:]
        per_stage = np.where(r.serial, load + t_math, np.maximum(load, t_math))
        last_math_start = load + (r.stages - 1) * per_stage
        total: FloatArray = r.waves * (last_math_start + self._tail * t_math + t_epilogue) + t_init
        return total

    def jacobian(self, x: FloatArray) -> FloatArray:
        return self._jacobian(x, ties_load_bound=True)

    def _jacobian(self, x: FloatArray, ties_load_bound: bool) -> FloatArray:
        load_bound = self._load_bound(x, ties_load_bound)
        r = self._runs
        after_first = r.stages - 1
        # d Sm(S) / d L and d Sm(S) / d T in each regime of the closed form
        d_load = np.where(r.serial | load_bound, r.stages, 1.0)
        d_math = np.where(load_bound, 0.0, after_first) + self._tail
        full = np.column_stack(
            [
                r.waves * d_load * r.load_elements,
                r.waves * d_math * r.macs,
                r.waves * d_load * 2,
                r.waves * d_math,
                np.ones_like(r.waves),
                r.waves,
            ]
        )
        return np.asarray(full[:, self._fitted], dtype=np.float64)

    def load_bound_runs(self, x: FloatArray) -> int:
        return int(self._load_bound(x, ties_load_bound=True).sum())

    def overlapped_runs(self) -> int:
        """Runs with buffer depth >= 2 (where load and MATH overlap)."""
        return int((~self._runs.serial).sum())


def closed_form_model(
    base: GemmWsMachine,
    runs: Sequence[GemmWsMeasurement],
    names: Sequence[str],
    wave_model: WaveTimeModel,
    dtype_ratios: Mapping[str, tuple[float, float]] | None = None,
) -> GemmWsResidualModel:
    """The closed-form model of ``runs`` with figures ``names`` free (in that order) and the
    others at ``base``'s values; ``dtype_ratios``: per dtype, (load, compute) throughput over
    the reference figures (absent dtypes: 1)."""
    return GemmWsResidualModel(
        _runs(runs, base.sm_count, dtype_ratios or {}),
        internal_values(base, GEMM_WS_FIGURES),
        np.array([GEMM_WS_FIGURES.index(n) for n in names], dtype=np.intp),
        wave_model is WaveTimeModel.INCLUDE_LAST_MATH,
    )


def internal_values(machine: GemmWsMachine, names: Sequence[str]) -> FloatArray:
    """``machine``'s figures ``names`` in the fit's coordinates (1/throughput, latency)."""
    return np.array(
        [1.0 / getattr(machine, n) if n in THROUGHPUTS else getattr(machine, n) for n in names],
        dtype=np.float64,
    )
