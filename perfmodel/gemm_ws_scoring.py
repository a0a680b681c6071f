"""Vectorised GeMM-WS scorer: the closed form of Sm(S) over many configurations and many
figure draws at once, exact in integer nanoseconds (warp-specialization-gemm-model.txt, §2).

:func:`score_configurations` returns ``overall_time_ns`` and ``total_math_wait_ns`` of shape
``(D, C)`` (D figure draws, C configurations), equal bit for bit to
``perfmodel.gemm_ws.simulate(...)`` on every pair: the same per-duration rounding of
``DurationTable`` (``round_half_up(1000 * (work / throughput + startup))`` on the exact
rationals the figures' floats denote), then integer arithmetic only.

Exactness without big integers: a duration is first evaluated in float64; where that value
lies within a rounding-error margin of a rounding boundary (a half nanosecond) the float cannot
decide the rounding, and only those durations are recomputed exactly with
:class:`perfmodel.gemm_ws.DurationTable`. Durations depend on the work only (elements of a tile,
MACs of a stage), so each distinct work is evaluated once per draw.

The pipeline model's closed form sits in one function (:func:`_paper_pipeline_closed_form`);
another pipeline model's closed form can sit beside it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from perfmodel.gemm_ws import (
    DurationTable,
    GemmShape,
    GemmWsMachine,
    Tiling,
    WaveTimeModel,
    us_to_ns,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: largest overall time the scorer represents: int64 with headroom for the sums of the closed
#: form (a space whose times exceed it is refused with ScoreOverflow, never wrapped)
MAX_SCORED_TIME_NS = 1 << 60
#: relative error bound of the float64 evaluation of one duration (a few ulps, generously)
_FLOAT_RELATIVE_ERROR = 1e-13


#: the default of a column a caller leaves out (replaced by ones in __post_init__)
_NO_COLUMN: IntArray = np.zeros(0, dtype=np.int64)


class ScoreOverflow(ValueError):
    """A configuration's time in ns does not fit the scorer's int64 range."""


@dataclass(frozen=True, slots=True)
class Configurations:
    """C tilings as int64 arrays of shape (C,): tile sizes in elements, buffer depth in stages,
    raster group rows and split-K slices (both 1 unless given)."""

    tile_m: IntArray
    tile_n: IntArray
    tile_k: IntArray
    buffer_depth: IntArray
    group_m: IntArray = field(default_factory=lambda: _NO_COLUMN)
    split_k: IntArray = field(default_factory=lambda: _NO_COLUMN)

    def __post_init__(self) -> None:
        for name in ("group_m", "split_k"):
            if getattr(self, name) is _NO_COLUMN:
                object.__setattr__(self, name, np.ones_like(self.tile_m))
        shapes = {getattr(self, f).shape for f in self.__slots__}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            raise ValueError("every column of a configuration must be 1-D, same length")

    @property
    def count(self) -> int:
        return int(self.tile_m.shape[0])

    @classmethod
    def of(
        cls,
        tile_m: object,
        tile_n: object,
        tile_k: object,
        buffer_depth: object,
        group_m: object = 1,
        split_k: object = 1,
    ) -> Configurations:
        columns = [
            np.asarray(v, dtype=np.int64).reshape(-1)
            for v in (tile_m, tile_n, tile_k, buffer_depth, group_m, split_k)
        ]
        count = columns[0].shape[0]
        for i in (4, 5):  # a scalar group_m / split_k applies to every configuration
            if columns[i].shape[0] == 1 and count != 1:
                columns[i] = np.full(count, columns[i][0], dtype=np.int64)
        return cls(*columns)

    @classmethod
    def of_tilings(cls, tilings: Sequence[Tiling]) -> Configurations:
        """The columns of ``tilings``, one per field of the configuration record."""
        return cls.of(*([getattr(t, f) for t in tilings] for f in cls.__slots__))

    def tilings(self) -> list[Tiling]:
        """One configuration record per row."""
        columns = [getattr(self, f).tolist() for f in self.__slots__]
        return [Tiling(*values) for values in zip(*columns, strict=True)]

    @classmethod
    def concat(cls, parts: Sequence[Configurations]) -> Configurations:
        if not parts:
            return cls.of(*([] for _ in cls.__slots__))
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__slots__))

    def take(self, index: npt.NDArray[np.intp] | slice) -> Configurations:
        return Configurations(*(getattr(self, f)[index] for f in self.__slots__))


@dataclass(frozen=True, slots=True)
class Figures:
    """The six calibratable GeMM-WS figures (§2.2), each a scalar or a (D,) array of draws.

    Units as :class:`perfmodel.gemm_ws.GemmWsMachine`: microseconds, elements per
    microsecond, multiply-accumulates per microsecond. ``sm_count`` is not drawn.
    """

    sm_count: int
    t_init_us: float | FloatArray
    t_epilogue_us: float | FloatArray
    load_startup_latency_us: float | FloatArray
    compute_startup_latency_us: float | FloatArray
    load_throughput_elements_per_us: float | FloatArray
    compute_throughput_macs_per_us: float | FloatArray

    @classmethod
    def of_machine(cls, machine: GemmWsMachine) -> Figures:
        """The machine's figures (every field of this class is one of GemmWsMachine's)."""
        return cls(**{f.name: getattr(machine, f.name) for f in dataclasses.fields(cls)})

    def columns(self) -> dict[str, FloatArray]:
        """Each drawn figure as a (D,) float64 array, validated as GemmWsMachine validates one
        machine (throughputs > 0, times >= 0, all finite), without building D machines."""
        arrays = {
            name: np.asarray(getattr(self, name), dtype=np.float64).reshape(-1)
            for name in _DRAWN_FIGURES
        }
        count = max(a.shape[0] for a in arrays.values())
        if any(a.shape[0] not in (1, count) for a in arrays.values()):
            raise ValueError("every drawn figure must be a scalar or hold the same D draws")
        if self.sm_count < 1:
            raise ValueError("sm_count must be at least 1")
        for name, values in arrays.items():
            positive = name in _THROUGHPUT_FIGURES
            valid = np.isfinite(values) & ((values > 0) if positive else (values >= 0))
            if not np.all(valid):
                kind = "a positive" if positive else "a non-negative"
                bad = float(values[np.argmin(valid)])
                raise ValueError(f"{name} must be {kind} finite number, got {bad}")
        return {name: np.broadcast_to(a, (count,)) for name, a in arrays.items()}

    def draws(self) -> list[GemmWsMachine]:
        """One machine per draw (validated: throughputs > 0, times >= 0, all finite)."""
        columns = self.columns()
        count = columns["t_init_us"].shape[0]
        return [self._machine(columns, d) for d in range(count)]

    def _machine(self, columns: dict[str, FloatArray], draw: int) -> GemmWsMachine:
        """Draw ``draw`` as a machine (for the exact fallbacks of the few undecided roundings)."""
        value = {name: float(column[draw]) for name, column in columns.items()}
        return GemmWsMachine(
            self.sm_count,
            t_init_us=value["t_init_us"],
            t_epilogue_us=value["t_epilogue_us"],
            load_startup_latency_us=value["load_startup_latency_us"],
            compute_startup_latency_us=value["compute_startup_latency_us"],
            load_throughput_elements_per_us=value["load_throughput_elements_per_us"],
            compute_throughput_macs_per_us=value["compute_throughput_macs_per_us"],
        )


#: the drawn figures, in GemmWsMachine's field order
_DRAWN_FIGURES = (
    "t_init_us",
    "t_epilogue_us",
    "load_startup_latency_us",
    "compute_startup_latency_us",
    "load_throughput_elements_per_us",
    "compute_throughput_macs_per_us",
)
_THROUGHPUT_FIGURES = ("load_throughput_elements_per_us", "compute_throughput_macs_per_us")


@dataclass(frozen=True, slots=True)
class Scores:
    """Per draw and configuration, integer ns: shape (D, C)."""

    overall_time_ns: IntArray
    total_math_wait_ns: IntArray


def _durations_ns(
    work: IntArray,
    throughput: FloatArray,
    startup_us: FloatArray,
    exact: Callable[[int], Callable[[int], int]],
) -> IntArray:
    """round_half_up(1000 * (work / throughput + startup)) for every draw (rows) and distinct
    work (columns), exact: float64 where it decides the rounding, DurationTable elsewhere.
    ``exact(d)`` gives draw d's callable work -> ns evaluated on rationals (built only for
    the draws that need one)."""
    w = work.astype(np.float64)[None, :]
    term = 1000.0 * w / throughput[:, None]
    start = 1000.0 * startup_us[:, None]
    value = term + start + 0.5
    if not np.all(value < MAX_SCORED_TIME_NS):
        raise ScoreOverflow("a stage duration exceeds the scorer's int64 range")
    floor = np.floor(value)
    margin = _FLOAT_RELATIVE_ERROR * (term + start) + 1e-9
    # the float floor is right unless the exact value may sit on the other side of an integer
    undecided = (value - floor < margin) | (floor + 1.0 - value < margin)
    result = floor.astype(np.int64)
    for d, j in zip(*np.nonzero(undecided), strict=True):
        result[d, j] = exact(int(d))(int(work[j]))
    return result


def _times_ns(values_us: FloatArray) -> IntArray:
    """us_to_ns of every value, exact: float64 where it decides the rounding, us_to_ns (on
    the rationals the floats denote) elsewhere."""
    scaled = 1000.0 * values_us
    value = scaled + 0.5
    if not np.all(value < MAX_SCORED_TIME_NS):
        raise ScoreOverflow("a time exceeds the scorer's int64 range")
    floor = np.floor(value)
    margin = _FLOAT_RELATIVE_ERROR * scaled + 1e-9
    undecided = (value - floor < margin) | (floor + 1.0 - value < margin)
    result = floor.astype(np.int64)
    for d in np.nonzero(undecided)[0]:
        result[d] = us_to_ns(float(values_us[d]))
    return result


def _paper_pipeline_closed_form(
    t_load_a: IntArray,
    t_load_b: IntArray,
    t_math: IntArray,
    stages: IntArray,
    buffer_depth: IntArray,
) -> IntArray:
    """Sm(S) of eq. (1)-(3) in closed form (docs/model-notes.md GeMM-WS 7): with
    L = T_LOAD-A + T_LOAD-B and T = T_MATH, Sm(S) = L + (S-1) max(L, T) for depth >= 2 and
    L + (S-1)(L + T) for depth 1 (the load of stage i waits for MATH of stage i-1)."""
    load = t_load_a + t_load_b
    per_stage = np.where(buffer_depth == 1, load + t_math, np.maximum(load, t_math))
    result: IntArray = load + (stages - 1) * per_stage
    return result


def score_configurations(
    shape: GemmShape,
    configs: Configurations,
    figures: Figures,
    wave_model: WaveTimeModel = WaveTimeModel.PAPER,
) -> Scores:
    """Overall time and total MATH wait (§2.1.1, §3.2) of every configuration under every
    figure draw; ``simulate(shape, tiling, machine, wave_model)`` on each pair, vectorised.

    Under several draws, configurations that differ only in a buffer depth of 2 or more share
    their scores (the closed form reads the depth only as "1 or more than 1"): each distinct
    (tile_m, tile_n, tile_k, depth 1 or not) is scored once and the columns copied."""
    columns = figures.columns()
    if configs.count and min(int(a.min()) for a in _columns(configs)) < 1:
        raise ValueError("tile sizes and buffer depths must be at least 1")
    if configs.count > 1 and columns["t_init_us"].shape[0] > 1:
        _, first, inverse = np.unique(
            _pipeline_keys(configs), axis=0, return_index=True, return_inverse=True
        )
        if first.shape[0] < configs.count:
            distinct = _score(shape, configs.take(first), figures, columns, wave_model)
            inverse = inverse.reshape(-1)
            return Scores(
                distinct.overall_time_ns[:, inverse], distinct.total_math_wait_ns[:, inverse]
            )
    return _score(shape, configs, figures, columns, wave_model)


def _pipeline_keys(configs: Configurations) -> npt.NDArray[np.int64]:
    """One key per configuration, equal for configurations the closed form cannot tell apart:
    (tile_m, tile_n, tile_k, depth 1 or not) as one mixed-radix int64 when it fits (a sort
    of integers), else as rows."""
    tm, tn, tk = configs.tile_m, configs.tile_n, configs.tile_k
    depth_one = (configs.buffer_depth == 1).astype(np.int64)
    base_n, base_k = int(tn.max()) + 1, int(tk.max()) + 1
    if (int(tm.max()) + 1) * base_n * base_k * 2 < 1 << 62:
        key: npt.NDArray[np.int64] = ((tm * base_n + tn) * base_k + tk) * 2 + depth_one
        return key
    return np.stack([tm, tn, tk, depth_one], axis=1)


def _columns(configs: Configurations) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    return configs.tile_m, configs.tile_n, configs.tile_k, configs.buffer_depth


def _score(
    shape: GemmShape,
    configs: Configurations,
    figures: Figures,
    columns: dict[str, FloatArray],
    wave_model: WaveTimeModel,
) -> Scores:
    """:func:`score_configurations` of every column as given (``columns``: the figures')."""
    # one duration table per draw, built when first read (exact rationals are slow)
    table = functools.cache(lambda draw: DurationTable(figures._machine(columns, draw)))

    tm, tn, tk, depth = configs.tile_m, configs.tile_n, configs.tile_k, configs.buffer_depth

    # T_LOAD for each distinct tile size in elements, T_MATH for each distinct MAC count (§2.2)
    load_work, load_index = np.unique(np.concatenate([tm * tk, tk * tn]), return_inverse=True)
    load_ns = _durations_ns(
        load_work,
        columns["load_throughput_elements_per_us"],
        columns["load_startup_latency_us"],
        lambda d: table(d).load_ns,
    )
    count = configs.count
    t_load_a = load_ns[:, load_index[:count]]
    t_load_b = load_ns[:, load_index[count:]]
    math_work, math_index = np.unique(tm * tn * tk, return_inverse=True)
    t_math = _durations_ns(
        math_work,
        columns["compute_throughput_macs_per_us"],
        columns["compute_startup_latency_us"],
        lambda d: table(d).math_ns,
    )[:, math_index]

    stages = -(-shape.k // tk)  # S = ceil(K / TK) (§2.1.2)
    # W = ceil(ceil(M/TM) ceil(N/TN) / SMs) (§2.1.1)
    waves = -(-((-(-shape.m // tm)) * (-(-shape.n // tn))) // figures.sm_count)
    # the int64 sums below are exact when the float estimate of the largest stays in range
    estimate = (
        (t_load_a + t_load_b + t_math).astype(np.float64) * (stages + 1) * 2.0 + 1e6
    ) * waves
    if not np.all(estimate < MAX_SCORED_TIME_NS):
        raise ScoreOverflow("an overall time exceeds the scorer's int64 range")
    last_math_start = _paper_pipeline_closed_form(t_load_a, t_load_b, t_math, stages, depth)
    t_epilogue = _times_ns(columns["t_epilogue_us"])
    t_init = _times_ns(columns["t_init_us"])
    # wave time = Sm(S) + T_EPILOGUE (§2.2), + the last T_MATH in the include-last-math model
    wave = last_math_start + t_epilogue[:, None]
    if wave_model is WaveTimeModel.INCLUDE_LAST_MATH:
        wave = wave + t_math
    overall = wave * waves + t_init[:, None]
    # §3.2: sum_i Wait(i) telescopes to Sm(S) - (S - 1) T_MATH, times W waves
    wait = (last_math_start - (stages - 1) * t_math) * waves
    return Scores(overall_time_ns=overall, total_math_wait_ns=wait)


#: configurations per chunk of :func:`enumerate_configurations`: small enough that one chunk
#: (the least a deadline-bound solve scores) takes a few milliseconds
DEFAULT_CHUNK_CONFIGURATIONS = 1 << 15


def enumerate_configurations(
    tile_m: tuple[int, ...],
    tile_n: tuple[int, ...],
    tile_k: tuple[int, ...],
    buffer_depth: tuple[int, ...],
    element_bytes: int,
    shared_memory_per_block_bytes: int | None,
    chunk_configurations: int = DEFAULT_CHUNK_CONFIGURATIONS,
) -> Iterator[Configurations]:
    """Every configuration of the product space whose circular buffer fits the shared memory
    per CTA (buffer_depth x (TM TK + TK TN) x element_bytes, as the Z3 encoding limits it;
    None: no limit), in chunks of at most ``chunk_configurations``, in bounded memory."""
    values = [np.asarray(v, dtype=np.int64) for v in (tile_m, tile_n, tile_k, buffer_depth)]
    dims = tuple(len(v) for v in values)
    total = int(np.prod(dims))
    step = max(1, chunk_configurations)
    for start in range(0, total, step):
        # the chunk's slice of the product space, in tile_m-major order
        index = np.unravel_index(np.arange(start, min(start + step, total)), dims)
        tm, tn, tk, depth = (v[i] for v, i in zip(values, index, strict=True))
        if shared_memory_per_block_bytes is not None:
            fits = depth * (tm * tk + tk * tn) * element_bytes <= shared_memory_per_block_bytes
            tm, tn, tk, depth = tm[fits], tn[fits], tk[fits], depth[fits]
        if tm.shape[0]:
            yield Configurations(tm, tn, tk, depth)


def lexicographic_order(
    overall_time_ns: IntArray, total_math_wait_ns: IntArray, configs: Configurations
) -> npt.NDArray[np.intp]:
    """Indices sorting configurations as the optimizer ranks them (§3.2 objectives, then the
    tie-break): smaller overall time, smaller total MATH wait, larger tile_m, larger tile_n,
    larger tile_k, smaller buffer_depth, then smaller split_k and smaller group_m."""
    return np.lexsort(
        (
            configs.group_m,
            configs.split_k,
            configs.buffer_depth,
            -configs.tile_k,
            -configs.tile_n,
            -configs.tile_m,
            total_math_wait_ns,
            overall_time_ns,
        )
    )


def rounded_once(values: IntArray, rounded: Callable[[int], int]) -> IntArray:
    """``rounded`` of every value, evaluated once per distinct value (a duration table's
    exact rounding over an array of work)."""
    unique, inverse = np.unique(values, return_inverse=True)
    table = np.array([rounded(int(v)) for v in unique], dtype=np.int64)
    out: IntArray = table[inverse.reshape(values.shape)]
    return out
