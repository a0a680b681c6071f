"""GeMM-WS times with L2 reuse and split-K: both pipeline models' closed forms, fed each
configuration's effective load throughput and latency (perfmodel/gemm_ws_traffic.py).

The transformation is model-agnostic: a configuration's stage quantities (load throughput,
load latency, stages, CTAs) are replaced by the ones its traffic gives, then the pipeline
model's closed form runs unchanged, element-wise in float64 over configurations:

- async-copy: M(S) of docs/model-notes.md "GeMM-WS async-copy" 2 (``last_math_start_formula``),
  d = c (TM + TN) TK / theta_eff, lambda = lambda_eff, T = c TM TN TK / theta_math + l_math;
- paper: Sm(S) = L + (S - 1) max(L, T) (GeMM-WS 7), L = (TM + TN) TK / theta_eff + 2 lambda_eff
  (eq. (4): A and B each pay the startup latency), one CTA per SM, wave = Sm(S) + T_EPILOGUE.

A stage's MATH is also bounded by the shared-memory reads of its A and B tiles, (TM + TN) TK
element bytes at the SM's shared-memory bandwidth (32 banks x 4 bytes per clock): a 64 x 32
tf32 tile on an H100 reaches 72 % of the tensor rate, a 128 x 128 one all of it.

Each wave's epilogue also stores its C tiles: the wave's C bytes at DRAM bandwidth (a 4096 x
4096 fp32 C is 64 MB, 20 us on an H100: the paper's fixed T_EPILOGUE, measured on one small
output, leaves it out). Stores do not hold the threads that issue them, so a wave's store
drains while the next wave runs; the kernel ends when the last wave's store has landed.

The kernel starts with L2 cold: its first stage's loads wait DRAM's latency, not the hit-rate
mix. Resident CTAs per SM are bounded by the accumulators' registers as well as shared memory.

Split-K runs S = ceil(ceil(k / split_k) / TK) stages on tiles x split_k CTAs and adds the
reduction of perfmodel.gemm_ws_traffic. Derivation and limits: docs/model-notes.md, "Memory
hierarchy, L2 reuse, split-K and tf32" 3.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from perfmodel.gemm_ws import SmLimits
from perfmodel.gemm_ws_traffic import (
    FloatArray,
    Grid,
    IntArray,
    MemoryFigures,
    Traffic,
    WavePanels,
    split_k_reduction_us,
    wave_panels,
)
from perfmodel.pipelines.async_copy.recurrences import last_math_start_formula

BoolArray = npt.NDArray[np.bool_]
#: the pipeline models whose closed forms run on the effective stage quantities (the registry's
#: names, perfmodel/pipelines)
Recurrences = Literal["paper", "async-copy"]

DEFAULT_TILES: tuple[int, ...] = (16, 32, 64, 128, 256)
DEFAULT_DEPTHS: tuple[int, ...] = tuple(range(2, 9))
#: Triton's GROUP_SIZE_M values in its tutorials' autotune lists: 1 (row-major) and 8
DEFAULT_GROUP_M: tuple[int, ...] = (1, 8)
DEFAULT_SPLIT_K: tuple[int, ...] = (1, 2, 4, 8, 16)


@dataclass(frozen=True, slots=True)
class MemoryModelFigures:
    """Figures of the L2-aware prediction. Times in us; MATH in MACs per us per SM for the
    request's element type; ``reduction_overhead_us`` the fixed cost of a split-K reduction."""

    t_init_us: float
    t_epilogue_us: float
    compute_startup_latency_us: float
    compute_throughput_macs_per_us: float
    memory: MemoryFigures
    reduction_overhead_us: float
    #: per-SM shared-memory bandwidth: the MMAs read each stage's A and B tiles from it, so
    #: it bounds MATH for small tiles (infinite: no bound)
    shared_memory_bytes_per_us: float = math.inf


@dataclass(frozen=True, slots=True)
class Space:
    """C configurations as int64 arrays of shape (C,)."""

    tile_m: IntArray
    tile_n: IntArray
    tile_k: IntArray
    buffer_depth: IntArray
    group_m: IntArray
    split_k: IntArray

    @classmethod
    def product(
        cls,
        tiles: Sequence[int] = DEFAULT_TILES,
        depths: Sequence[int] = DEFAULT_DEPTHS,
        group_m: Sequence[int] = DEFAULT_GROUP_M,
        split_k: Sequence[int] = DEFAULT_SPLIT_K,
    ) -> Space:
        rows = np.array(
            list(itertools.product(tiles, tiles, tiles, depths, group_m, split_k)), dtype=np.int64
        )
        return cls(*(np.ascontiguousarray(rows[:, i]) for i in range(6)))

    @property
    def count(self) -> int:
        return int(self.tile_m.shape[0])

    def where(self, keep: BoolArray) -> Space:
        """The configurations where ``keep`` holds."""
        return self.take(np.flatnonzero(keep))

    def take(self, index: IntArray) -> Space:
        return Space(
            self.tile_m[index],
            self.tile_n[index],
            self.tile_k[index],
            self.buffer_depth[index],
            self.group_m[index],
            self.split_k[index],
        )


def ctas_per_sm(space: Space, element_bytes: int, limits: SmLimits) -> IntArray:
    """Resident CTAs per SM of every configuration (0: it does not fit one SM): the block cap,
    shared memory for the buffer and the register file for the accumulators. Tensor-core MMAs
    (mma.sync, wgmma) and FFMA tiles alike accumulate C in 32-bit registers, one per element of
    the CTA's TM x TN tile (fp32 accumulation); the file must also hold the threads' addresses
    and loop state, so the accumulators take strictly fewer registers than the SM has (a
    256 x 256 tile's 65,536 fill an SM's whole file: not resident)."""
    smem = space.buffer_depth * (space.tile_m + space.tile_n) * space.tile_k * element_bytes
    ctas = np.full(space.count, limits.ctas_per_sm(1), dtype=np.int64)
    if limits.shared_memory_per_sm_bytes is not None:
        ctas = np.minimum(ctas, limits.shared_memory_per_sm_bytes // smem)
    if limits.registers_per_sm is not None:
        ctas = np.minimum(ctas, (limits.registers_per_sm - 1) // (space.tile_m * space.tile_n))
    return ctas


def feasible(
    space: Space,
    k: int,
    element_bytes: int,
    shared_memory_per_block_bytes: int | None,
    resident: IntArray,
) -> BoolArray:
    """Configurations that can run: the buffer fits a CTA's shared memory and an SM, and each
    split-K slice holds at least one k tile (split_k <= ceil(k / tile_k))."""
    smem = space.buffer_depth * (space.tile_m + space.tile_n) * space.tile_k * element_bytes
    fits = resident >= 1
    if shared_memory_per_block_bytes is not None:
        fits &= smem <= shared_memory_per_block_bytes
    out: BoolArray = fits & (space.split_k <= -(-k // space.tile_k))
    return out


class ShapeModel:
    """One GEMM shape over one space: the figure-free traffic geometry computed once, so a
    fit evaluates :meth:`times_us` many times cheaply."""

    def __init__(
        self,
        m: int,
        n: int,
        k: int,
        element_bytes: int,
        space: Space,
        sm_count: int,
        limits: SmLimits,
        pipeline: Recurrences,
        batch: int = 1,
        output_bytes: int | None = None,
    ) -> None:
        self.m, self.n, self.k, self.batch = m, n, k, batch
        #: bytes of one element of C: the input type's, at least 2 (fp8 GEMMs store fp16)
        self.output_bytes = max(element_bytes, 2) if output_bytes is None else output_bytes
        self.space, self.sm_count, self.pipeline = space, sm_count, pipeline
        self.element_bytes = element_bytes
        resident = ctas_per_sm(space, element_bytes, limits)
        self.resident = resident
        # CTAs sharing an SM: as many as fit under async copies, one under the paper's eq. (1)-(3)
        per_sm = np.maximum(resident, 1) if _SHARES_SM[pipeline] else np.ones_like(resident)
        self.ctas_per_sm = np.broadcast_to(np.asarray(per_sm, dtype=np.int64), (space.count,))
        # traffic depends on the tile, group_m, split_k and CTAs per SM, not on the depth
        keys = np.stack(
            [
                space.tile_m,
                space.tile_n,
                space.tile_k,
                space.group_m,
                space.split_k,
                self.ctas_per_sm,
            ],
            axis=1,
        )
        unique, self._inverse = np.unique(keys, axis=0, return_inverse=True)
        self._inverse = self._inverse.reshape(-1)
        grid = Grid.of(*(unique[:, i] for i in range(6)))
        self.panels: WavePanels = wave_panels(m, n, k, element_bytes, grid, sm_count, batch)

    def subset(self, index: IntArray) -> ShapeModel:
        """The same shape over the configurations ``index`` of the space (their geometry is
        kept, not recomputed)."""
        out = object.__new__(ShapeModel)
        out.__dict__.update(self.__dict__)
        rows, inverse = np.unique(self._inverse[index], return_inverse=True)
        p = self.panels
        out.panels = dataclasses.replace(
            p,
            **{
                name: getattr(p, name)[rows]
                for name in (
                    "weight",
                    "requested",
                    "distinct",
                    "shared",
                    "footprint",
                    "sms",
                    "k_per_cta",
                    "ctas",
                    "reduction_bytes",
                )
            },
        )
        out._inverse = inverse.reshape(-1)
        out.space = self.space.take(index)
        out.resident = self.resident[index]
        out.ctas_per_sm = self.ctas_per_sm[index]
        return out

    def traffic(self, memory: MemoryFigures) -> Traffic:
        """Per configuration of the space (expanded over depths)."""
        t = self.panels.traffic(memory)
        i = self._inverse
        return Traffic(
            dram_bytes=t.dram_bytes[i],
            requested_bytes=t.requested_bytes[i],
            l2_hit_rate=t.l2_hit_rate[i],
            load_throughput_elements_per_us=t.load_throughput_elements_per_us[i],
            load_latency_us=t.load_latency_us[i],
            k_per_cta=t.k_per_cta[i],
            ctas=t.ctas[i],
            reduction_bytes=t.reduction_bytes[i],
        )

    def times_us(self, figures: MemoryModelFigures) -> tuple[FloatArray, Traffic]:
        """Predicted time of every configuration (us) and its traffic."""
        s = self.space
        traffic = self.traffic(figures.memory)
        theta = traffic.load_throughput_elements_per_us
        lam = traffic.load_latency_us
        elements = ((s.tile_m + s.tile_n) * s.tile_k).astype(np.float64)
        macs = (s.tile_m * s.tile_n * s.tile_k).astype(np.float64)
        stages = -(-traffic.k_per_cta // s.tile_k)
        busiest = -(-traffic.ctas // self.sm_count)  # q = ceil(CTAs / SMs), §2.1.1
        math_startup = figures.compute_startup_latency_us
        # the epilogue stores the wave's C tiles: at least their bytes at DRAM bandwidth
        store_per_cta = (s.tile_m * s.tile_n * self.output_bytes) / (
            figures.memory.dram_bandwidth_gb_per_s * 1e3
        )
        # one CTA's MATH per stage: the MAC rate, or the shared-memory reads of its A and B
        # tiles, whichever is slower
        smem_us = elements * self.element_bytes / figures.shared_memory_bytes_per_us
        math_us = np.maximum(macs / figures.compute_throughput_macs_per_us, smem_us)
        stage = _Stage(
            load_us=elements / theta,
            latency_us=lam,
            math_us=math_us,
            math_startup_us=math_startup,
            epilogue_us=figures.t_epilogue_us,
            store_per_cta_us=store_per_cta,
            stages=stages,
            depth=s.buffer_depth,
            busiest=busiest,
            ctas=traffic.ctas,
            ctas_per_sm=self.ctas_per_sm,
            sm_count=self.sm_count,
        )
        total = _CLOSED_FORMS[self.pipeline](stage)
        # the kernel starts with L2 cold: its first stage's loads wait DRAM's latency, not the
        # hit-rate mix the other stages see
        cold = _COLD_LOADS[self.pipeline] * np.maximum(figures.memory.dram_latency_us - lam, 0.0)
        total = total + cold
        reduction = split_k_reduction_us(traffic, figures.memory, figures.reduction_overhead_us)
        out: FloatArray = figures.t_init_us + total + reduction
        return out, traffic


@dataclass(frozen=True, slots=True)
class _Stage:
    """Per configuration, the effective stage quantities both closed forms read (us)."""

    load_us: FloatArray  # one CTA's A and B elements at the effective load throughput
    latency_us: FloatArray
    math_us: FloatArray
    math_startup_us: float
    epilogue_us: float
    store_per_cta_us: FloatArray
    stages: IntArray
    depth: IntArray
    busiest: IntArray  # q = ceil(CTAs / SMs), §2.1.1
    ctas: IntArray
    ctas_per_sm: IntArray
    sm_count: int


def _async_copy_total_us(s: _Stage) -> FloatArray:
    """Full waves of c CTAs sharing the SM, then the partial wave (async-copy 2); each wave's C
    store drains during the next wave (:func:`_overlapped_stores_us`)."""
    per_sm = np.minimum(s.ctas_per_sm, s.busiest)
    full, partial = np.divmod(s.busiest, per_sm)

    def wave(share: IntArray) -> tuple[FloatArray, FloatArray]:
        d = share * s.load_us
        t = share * s.math_us + s.math_startup_us
        last: FloatArray = last_math_start_formula(
            d, s.latency_us, t, s.stages, s.depth, np.maximum
        )
        stored = np.minimum(share * s.sm_count, s.ctas) * s.store_per_cta_us
        return last + t + s.epilogue_us, stored

    main_full, store_full = wave(per_sm)
    main_partial, store_partial = wave(np.maximum(partial, 1))
    has_partial = partial > 0
    # waves in order: `full` full ones, then the partial one if any
    first_main = np.where(full > 0, main_full, main_partial)
    later_full = np.maximum(full - 1, 0) * np.maximum(main_full, store_full)
    after_full = np.where(full > 0, np.maximum(main_partial, store_full), main_partial)
    out: FloatArray = np.where(
        has_partial,
        np.where(full > 0, first_main + later_full + after_full, main_partial) + store_partial,
        first_main + later_full + store_full,
    )
    return out


def _paper_total_us(s: _Stage) -> FloatArray:
    """W waves of Sm(S) + T_EPILOGUE (GeMM-WS 7), A and B each paying the latency (eq. (4));
    each wave's C store drains during the next wave (:func:`_async_copy_total_us`)."""
    load = s.load_us + 2 * s.latency_us
    t = s.math_us + s.math_startup_us
    per_stage = np.where(s.depth == 1, load + t, np.maximum(load, t))
    stored = np.minimum(s.sm_count, s.ctas) * s.store_per_cta_us
    main = load + (s.stages - 1) * per_stage + s.epilogue_us
    out: FloatArray = main + (s.busiest - 1) * np.maximum(main, stored) + stored
    return out


_CLOSED_FORMS: dict[str, Callable[[_Stage], FloatArray]] = {
    "paper": _paper_total_us,
    "async-copy": _async_copy_total_us,
}
_SHARES_SM: dict[str, bool] = {"paper": False, "async-copy": True}
#: loads of a stage that each pay the startup latency: A and B in turn under eq. (4), one
#: asynchronous copy of both under async-copy
_COLD_LOADS: dict[str, int] = {"paper": 2, "async-copy": 1}
