"""Where a GEMM's tile loads come from: L2 reuse between the CTAs of a wave, and split-K.

Model-agnostic: it turns a configuration (tile, ``group_m``, ``split_k``, CTAs per SM) into the
stage quantities a pipeline model consumes, an effective per-SM load throughput and load
latency, plus what a candidate reports (DRAM bytes, L2 hit rate) and the split-K reduction.
Vectorised over configurations (numpy int64/float64 arrays of shape (C,)).
Derivation: docs/model-notes.md, "L2 reuse and split-K".

- Raster order: CTA ids run over the output tiles in Triton's grouped order (``GROUP_SIZE_M``):
  ``group_m`` rows of tiles at a time, column by column inside a group. With ``split_k`` s the
  grid has s slices of ``tiles_m x tiles_n`` CTAs, slice after slice (blockIdx.z outermost);
  a CTA of slice z reduces k-range z of s.
- Waves: ``P = sm_count x ctas_per_sm`` consecutive CTA ids run together. A wave loads each
  distinct A row panel (tile_m x k/s) and B column panel (k/s x tile_n) of its CTAs from DRAM
  once; its other CTAs hit L2. A panel also used by the previous wave is still in L2 when the
  two waves' panels together fit the L2 (a fraction ``L2 / footprint`` of it when they do not).
- SMs: the block scheduler spreads a wave's CTAs over the SMs before it doubles any up, so a
  wave of n CTAs occupies min(SMs, n) SMs whatever the CTAs per SM that fit.
- Bandwidth: a wave's loads take max(DRAM bytes / DRAM bandwidth, requested bytes / its SMs'
  share of the L2 bandwidth); every byte a CTA loads passes through L2, and the L2 figure is
  what all SMs draw together (an SM's fill path carries its share).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: waves evaluated one by one per configuration: the first, the partial one and up to
#: MAX_EXACT_WAVES - 2 others; more full waves are evaluated on that many sampled ones (each
#: standing for its share of them). 18 keeps a shape's geometry over the default space
#: (~3,800 traffic-distinct configurations) to a few hundred ms
MAX_EXACT_WAVES = 18
#: bytes of one partial-sum element (split-K accumulates in fp32 whatever the input type)
PARTIAL_SUM_BYTES = 4


@dataclass(frozen=True, slots=True)
class MemoryFigures:
    """The device's memory hierarchy (device_profiles ``memory`` section)."""

    sm_count: int
    dram_bandwidth_gb_per_s: float
    l2_bandwidth_gb_per_s: float
    l2_size_bytes: float
    dram_latency_us: float
    l2_latency_us: float
    #: the SM clock the GEMM runs at over the clock the L2 figures were measured at (a
    #: tensor-core GEMM's, device_profiles/memory.py ``tensor_clock_ratio``): the L2's
    #: bandwidth scales with it and its latency inversely; the figures above stay the
    #: profile's, so a fit reports and stores them in the profile's terms
    sm_clock_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.sm_count < 1:
            raise ValueError("sm_count must be at least 1")
        if not 0 < self.sm_clock_ratio <= 1:
            raise ValueError("sm_clock_ratio must be in (0, 1]")
        for name in ("dram_bandwidth_gb_per_s", "l2_bandwidth_gb_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("l2_size_bytes", "dram_latency_us", "l2_latency_us"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be non-negative")


@dataclass(frozen=True, slots=True)
class Grid:
    """C configurations as int64 arrays of shape (C,)."""

    tile_m: IntArray
    tile_n: IntArray
    tile_k: IntArray
    group_m: IntArray
    split_k: IntArray
    ctas_per_sm: IntArray

    @classmethod
    def of(
        cls,
        tile_m: object,
        tile_n: object,
        tile_k: object,
        group_m: object = 1,
        split_k: object = 1,
        ctas_per_sm: object = 1,
    ) -> Grid:
        arrays = np.broadcast_arrays(
            *(
                np.asarray(v, dtype=np.int64).reshape(-1)
                for v in (tile_m, tile_n, tile_k, group_m, split_k, ctas_per_sm)
            )
        )
        if arrays[0].size and min(int(a.min()) for a in arrays) < 1:
            raise ValueError("tiles, group_m, split_k and ctas_per_sm must be at least 1")
        return cls(*(np.ascontiguousarray(a) for a in arrays))


@dataclass(frozen=True, slots=True)
class Traffic:
    """Per configuration, shape (C,)."""

    #: bytes read from DRAM for the A and B tiles, whole GEMM
    dram_bytes: FloatArray
    #: bytes the CTAs request (every one passes through L2), whole GEMM
    requested_bytes: FloatArray
    #: 1 - dram_bytes / requested_bytes
    l2_hit_rate: FloatArray
    #: per-SM load throughput, matrix elements per us, the waves' bandwidth bound averaged
    load_throughput_elements_per_us: FloatArray
    #: first-byte latency of a load: L2's on a hit, DRAM's on a miss, by the hit rate
    load_latency_us: FloatArray
    #: k each CTA reduces: ceil(k / split_k)
    k_per_cta: IntArray
    #: CTAs of the grid: tiles_m x tiles_n x split_k
    ctas: IntArray
    #: extra DRAM bytes of split-K's partial sums (written, then read by the reduction)
    reduction_bytes: FloatArray


def distinct_in_slice(
    a: IntArray, b: IntArray, tiles_m: IntArray, tiles_n: IntArray, group_m: IntArray
) -> tuple[IntArray, IntArray]:
    """(distinct tile rows, distinct tile columns) of the CTA ids [a, b) of one slice in grouped
    raster order; 0 <= a < b <= tiles_m x tiles_n, element-wise."""
    g = np.minimum(group_m, tiles_m)
    per_group = g * tiles_n  # ids in every group but the last, which may hold fewer rows
    ga, gb = a // per_group, (b - 1) // per_group
    size_a = np.minimum(tiles_m - ga * g, g)
    size_b = np.minimum(tiles_m - gb * g, g)
    la, lb = a - ga * per_group, b - gb * per_group  # offsets inside groups ga and gb
    # one group: ids cycle through its rows, a column per `size` ids
    one_rows = np.minimum(size_a, lb - la)
    one_cols = (lb - 1) // size_a - la // size_a + 1
    # several groups: the tail of ga, whole groups between, the head of gb
    head_len = size_a * tiles_n - la
    middle = gb - ga - 1
    rows = np.minimum(size_a, head_len) + middle * g + np.minimum(size_b, lb)
    first_col = la // size_a  # ga covers columns first_col .. tiles_n - 1
    last_col = (lb - 1) // size_b  # gb covers columns 0 .. last_col
    cols = np.where(middle >= 1, tiles_n, np.minimum(tiles_n, tiles_n - first_col + last_col + 1))
    same = ga == gb
    return np.where(same, one_rows, rows), np.where(same, one_cols, cols)


def distinct_panels(
    start: IntArray, end: IntArray, tiles_m: IntArray, tiles_n: IntArray, group_m: IntArray
) -> tuple[IntArray, IntArray]:
    """(distinct A row panels, distinct B column panels) of the CTA ids [start, end) of the
    whole grid: slices hold different k-ranges, so their panels are distinct."""
    per_slice = tiles_m * tiles_n
    za, zb = start // per_slice, (end - 1) // per_slice
    same = za == zb
    a0, b0 = start - za * per_slice, end - zb * per_slice
    # one slice: [a0, b0); else: [a0, T) of slice za, whole slices, [0, b0) of slice zb
    first_end = np.where(same, b0, per_slice)
    rows1, cols1 = distinct_in_slice(a0, first_end, tiles_m, tiles_n, group_m)
    zero = np.zeros_like(b0)
    rows2, cols2 = distinct_in_slice(zero, np.maximum(b0, 1), tiles_m, tiles_n, group_m)
    whole = np.maximum(zb - za - 1, 0)
    rows = rows1 + np.where(same, 0, rows2 + whole * tiles_m)
    cols = cols1 + np.where(same, 0, cols2 + whole * tiles_n)
    return rows, cols


@dataclass(frozen=True, slots=True)
class WavePanels:
    """The figure-free part of :func:`gemm_traffic`: per configuration (rows) and evaluated
    wave (columns, weighted), the bytes each wave requests, its distinct panels' bytes, the
    bytes of its panels the previous wave also used, both waves' panels' bytes, and the SMs
    it occupies. Computed once per shape; :meth:`traffic` applies the memory figures."""

    weight: FloatArray
    requested: FloatArray
    distinct: FloatArray
    shared: FloatArray
    footprint: FloatArray
    sms: FloatArray
    element_bytes: int
    k_per_cta: IntArray
    ctas: IntArray
    reduction_bytes: FloatArray

    def traffic(self, figures: MemoryFigures) -> Traffic:
        kept = np.minimum(1.0, figures.l2_size_bytes / np.maximum(self.footprint, 1.0))
        dram = self.distinct - kept * self.shared
        # a wave's loads: DRAM and L2 bandwidth bounds (bytes per us = GB/s x 1e3), L2's the
        # share of the SMs the wave occupies
        l2 = figures.l2_bandwidth_gb_per_s * figures.sm_clock_ratio
        l2_share = l2 * 1e3 * self.sms / figures.sm_count
        load_us = np.maximum(
            dram / (figures.dram_bandwidth_gb_per_s * 1e3), self.requested / l2_share
        )
        dram_total = (self.weight * dram).sum(axis=1)
        requested_total = (self.weight * self.requested).sum(axis=1)
        sm_time = (self.weight * load_us * self.sms).sum(axis=1)
        hit = 1.0 - dram_total / requested_total
        return Traffic(
            dram_bytes=dram_total,
            requested_bytes=requested_total,
            l2_hit_rate=hit,
            load_throughput_elements_per_us=requested_total / self.element_bytes / sm_time,
            load_latency_us=hit * figures.l2_latency_us / figures.sm_clock_ratio
            + (1.0 - hit) * figures.dram_latency_us,
            k_per_cta=self.k_per_cta,
            ctas=self.ctas,
            reduction_bytes=self.reduction_bytes,
        )


def gemm_traffic(
    m: int,
    n: int,
    k: int,
    element_bytes: int,
    grid: Grid,
    figures: MemoryFigures,
    batch: int = 1,
) -> Traffic:
    """DRAM bytes, L2 hit rate and the effective per-SM load throughput and latency of every
    configuration of ``grid`` for ``batch`` GEMMs m x n x k (module docstring)."""
    return wave_panels(m, n, k, element_bytes, grid, figures.sm_count, batch).traffic(figures)


def unique_rows(keys: IntArray) -> tuple[IntArray, IntArray]:
    """(distinct rows of the non-negative (C, F) ``keys`` in sorted order, each row's index
    among them), as ``np.unique(keys, axis=0, return_inverse=True)``: the rows packed into
    one int64 each where their ranges allow (a 1-D unique sorts several times faster)."""
    if keys.shape[0] <= 1:
        return keys, np.zeros(keys.shape[0], dtype=np.intp)
    radix = keys.max(axis=0).astype(object) + 1
    if int(np.prod(radix)) >= 1 << 62:
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        return unique, inverse.reshape(-1)
    packed = np.zeros(keys.shape[0], dtype=np.int64)
    for column, size in zip(keys.T, radix, strict=True):
        packed = packed * int(size) + column
    _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    return keys[first], inverse.reshape(-1)


def wave_panels(
    m: int, n: int, k: int, element_bytes: int, grid: Grid, sm_count: int, batch: int = 1
) -> WavePanels:
    """The panels of every evaluated wave of every configuration (:class:`WavePanels`). A
    batch of independent GEMMs adds slices as split-K does: their panels are distinct."""
    tm, tn, tk = grid.tile_m, grid.tile_n, grid.tile_k
    # which panels a wave touches does not depend on tile_k (it sets only a panel's bytes):
    # the panel counts are computed once per (tile_m, tile_n, group_m, split_k, CTAs per SM)
    keys = np.stack([tm, tn, grid.group_m, grid.split_k, grid.ctas_per_sm], axis=1)
    unique, inverse = unique_rows(keys)
    distinct_grid = Grid.of(
        unique[:, 0],
        unique[:, 1],
        1,
        group_m=unique[:, 2],
        split_k=unique[:, 3],
        ctas_per_sm=unique[:, 4],
    )
    counts = _wave_counts(m, n, distinct_grid, sm_count, batch)
    k_per_cta = -(-k // grid.split_k)
    k_loaded = -(-k_per_cta // tk) * tk  # whole k tiles, as the stages load them
    a_panel = (tm * k_loaded * element_bytes).astype(np.float64)[:, None]
    b_panel = (tn * k_loaded * element_bytes).astype(np.float64)[:, None]
    rows, cols = counts.rows[inverse], counts.cols[inverse]
    union_rows, union_cols = counts.union_rows[inverse], counts.union_cols[inverse]
    shared_rows, shared_cols = counts.shared_rows[inverse], counts.shared_cols[inverse]
    reduction = np.where(
        grid.split_k > 1, 2.0 * grid.split_k * batch * m * n * PARTIAL_SUM_BYTES, 0.0
    ).astype(np.float64)
    return WavePanels(
        weight=counts.weight[inverse],
        requested=counts.ctas_in_wave[inverse] * (a_panel + b_panel),
        distinct=rows * a_panel + cols * b_panel,
        shared=shared_rows * a_panel + shared_cols * b_panel,
        footprint=union_rows * a_panel + union_cols * b_panel,
        sms=counts.sms[inverse],
        element_bytes=element_bytes,
        k_per_cta=k_per_cta,
        ctas=counts.ctas[inverse],
        reduction_bytes=reduction,
    )


@dataclass(frozen=True, slots=True)
class _WaveCounts:
    """Per configuration and evaluated wave: its weight, CTAs, SMs, and distinct tile rows
    and columns (its own, with the previous wave, and shared with it)."""

    weight: FloatArray
    ctas_in_wave: IntArray
    sms: FloatArray
    rows: IntArray
    cols: IntArray
    union_rows: IntArray
    union_cols: IntArray
    shared_rows: IntArray
    shared_cols: IntArray
    ctas: IntArray


def _wave_counts(m: int, n: int, grid: Grid, sm_count: int, batch: int) -> _WaveCounts:
    """The panel counts of :func:`wave_panels`, tile_k aside."""
    tiles_m, tiles_n = -(-m // grid.tile_m), -(-n // grid.tile_n)
    ctas = tiles_m * tiles_n * grid.split_k * batch
    per_wave = sm_count * grid.ctas_per_sm
    full_waves = ctas // per_wave
    has_partial = ctas % per_wave > 0
    # column 0: the first wave (it alone has no previous wave); columns 1 .. samples: the
    # other full waves, all or up to MAX_EXACT_WAVES - 2 sampled ones; then the partial
    slots = MAX_EXACT_WAVES - 2
    rest = np.maximum(full_waves - 1, 0)[:, None]
    samples = np.minimum(rest, slots)
    width = int(samples.max(initial=0)) + 2
    columns = np.arange(width, dtype=np.int64)[None, :]
    offset = columns - 1
    # a low-discrepancy (golden-ratio) sequence of waves: evenly spaced ones alias with the
    # period of the raster's groups
    golden = np.floor(np.mod(offset * 0.6180339887498949, 1.0) * rest).astype(np.int64)
    spread = 1 + np.minimum(golden, rest - 1)
    sampled = np.where(rest <= slots, columns, spread)
    is_first = (columns == 0) & (full_waves[:, None] >= 1)
    is_rest = (columns >= 1) & (offset < samples)
    is_partial = (columns == samples + 1) & has_partial[:, None]
    wave = np.where(is_rest, sampled, np.where(is_partial, full_waves[:, None], 0))
    weight = np.where(is_rest, rest / np.maximum(samples, 1), 1.0) * (
        is_first | is_rest | is_partial
    )

    def col(x: IntArray) -> IntArray:
        return np.broadcast_to(x[:, None], wave.shape)

    pw, total = col(per_wave), col(ctas)
    start = wave * pw
    end = np.minimum(start + pw, total)
    shape = (col(tiles_m), col(tiles_n), col(grid.group_m))
    rows, cols = distinct_panels(start, end, *shape)
    previous = np.maximum(start - pw, 0)
    union_rows, union_cols = distinct_panels(previous, end, *shape)
    has_previous = wave > 0
    prev_rows, prev_cols = distinct_panels(previous, np.maximum(start, 1), *shape)
    # the block scheduler places a wave's CTAs one per SM first (module docstring)
    sms = np.minimum(sm_count, end - start)
    return _WaveCounts(
        weight=weight,
        ctas_in_wave=end - start,
        sms=sms.astype(np.float64),
        rows=rows,
        cols=cols,
        union_rows=union_rows,
        union_cols=union_cols,
        shared_rows=np.where(has_previous, prev_rows + rows - union_rows, 0),
        shared_cols=np.where(has_previous, prev_cols + cols - union_cols, 0),
        ctas=ctas,
    )


def split_k_reduction_us(
    traffic: Traffic,
    figures: MemoryFigures,
    reduction_overhead_us: float | FloatArray,
    bandwidth_scale: float | FloatArray = 1.0,
) -> FloatArray:
    """Time of split-K's reduction: its partial-sum traffic at DRAM bandwidth (times
    ``bandwidth_scale``, a draw's) plus a calibrated fixed cost (a second pass over the
    output); 0 without split-K."""
    bandwidth = figures.dram_bandwidth_gb_per_s * bandwidth_scale * 1e3
    out: FloatArray = np.where(
        traffic.reduction_bytes > 0,
        traffic.reduction_bytes / bandwidth + reduction_overhead_us,
        0.0,
    )
    return out
