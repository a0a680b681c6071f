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

The closed forms (:func:`kernel_times`) are one function over float us (the benches, the
fits) and integer ticks (:meth:`ShapeModel.times_ns`, the optimizer's
perfmodel/pipelines/l2_reuse.py): one model in one place.

Split-K runs S = ceil(ceil(k / split_k) / TK) stages on tiles x split_k CTAs and adds the
reduction of perfmodel.gemm_ws_traffic. Derivation and limits: docs/model-notes.md, "Memory
hierarchy, L2 reuse, split-K and tf32" 3.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from perfmodel.gemm_ws import DEFAULT_GROUP_M, DEFAULT_SPLIT_K, SmLimits
from perfmodel.gemm_ws_traffic import (
    FloatArray,
    Grid,
    IntArray,
    MemoryFigures,
    Traffic,
    WavePanels,
    split_k_reduction_us,
    unique_rows,
    wave_panels,
)
from perfmodel.pipelines.async_copy.recurrences import last_math_start_formula

BoolArray = npt.NDArray[np.bool_]
#: the pipeline models whose closed forms run on the effective stage quantities (the registry's
#: names, perfmodel/pipelines)
Recurrences = Literal["paper", "async-copy"]

DEFAULT_TILES: tuple[int, ...] = (16, 32, 64, 128, 256)
DEFAULT_DEPTHS: tuple[int, ...] = tuple(range(2, 9))


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
        unique, self._inverse = unique_rows(keys)
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

    def stage_times_us(
        self, figures: MemoryModelFigures, scale: FigureScale | None = None
    ) -> tuple[StageTimes, Traffic]:
        """Per configuration, the stage quantities of both closed forms (us) and the traffic;
        with ``scale``, under each of its draws of the figures (rows; the traffic, which the
        hit rates set, stays the point figures').

        Both pipeline models are the async-copy recurrences (A1)-(A3) on a stage of issue d,
        latency lambda and MATH T: async-copy with d = (TM + TN) TK / theta_eff and lambda =
        lambda_eff, c CTAs sharing an SM; the paper's eq. (1)-(3) with d = L = (TM + TN) TK /
        theta_eff + 2 lambda_eff (eq. (4): A and B each pay the latency) and lambda = 0, one
        CTA per SM. With lambda = 0 and D >= 2, (A1)-(A3) give M(S) = L + (S - 1) max(L, T)
        (GeMM-WS 7); at D = 1 every stage takes L + T, as eq. (1)-(3) do."""
        s = self.space
        traffic = self.traffic(figures.memory)
        r = scale or FigureScale()
        # the bandwidths scale together, so the hit-rate mix's throughput scales with them
        theta = traffic.load_throughput_elements_per_us * r.bandwidth
        lam = traffic.load_latency_us * r.latency
        elements = ((s.tile_m + s.tile_n) * s.tile_k).astype(np.float64)
        macs = (s.tile_m * s.tile_n * s.tile_k).astype(np.float64)
        # the epilogue stores the wave's C tiles: at least their bytes at DRAM bandwidth
        store_per_cta = (s.tile_m * s.tile_n * self.output_bytes) / (
            figures.memory.dram_bandwidth_gb_per_s * r.bandwidth * 1e3
        )
        # one CTA's MATH per stage: the MAC rate, or the shared-memory reads of its A and B
        # tiles, whichever is slower
        smem_us = elements * self.element_bytes / figures.shared_memory_bytes_per_us
        # its epilogue stages the C tile through shared memory (written from the accumulators,
        # read back by the store): twice the tile's bytes at the shared-memory bandwidth
        staged_us = (
            2.0 * (s.tile_m * s.tile_n * self.output_bytes) / figures.shared_memory_bytes_per_us
        )
        math_us = np.maximum(macs / (figures.compute_throughput_macs_per_us * r.compute), smem_us)
        loads = _COLD_LOADS[self.pipeline]
        serial = not _SHARES_SM[self.pipeline]
        issue = elements / theta + (loads * lam if serial else 0.0)
        # the kernel starts with L2 cold: its first stage's loads wait DRAM's latency, not the
        # hit-rate mix the other stages see
        cold = loads * np.maximum(figures.memory.dram_latency_us * r.latency - lam, 0.0)
        reduction = split_k_reduction_us(
            traffic,
            figures.memory,
            figures.reduction_overhead_us * r.launch,
            bandwidth_scale=r.bandwidth,
        )
        stage = StageTimes(
            issue=issue,
            latency=np.zeros_like(lam) if serial else lam,
            math=math_us,
            # zeros + value broadcasts a (D, 1) draw over the configurations
            math_startup=np.zeros_like(lam) + figures.compute_startup_latency_us * r.math_startup,
            epilogue=np.zeros_like(lam) + figures.t_epilogue_us * r.epilogue,
            epilogue_per_cta=np.broadcast_to(staged_us, lam.shape).astype(np.float64),
            store_per_cta=store_per_cta,
            fixed=figures.t_init_us * r.launch + cold + reduction,
            tail_math=not serial,
            stages=-(-traffic.k_per_cta // s.tile_k),
            depth=s.buffer_depth,
            busiest=-(-traffic.ctas // self.sm_count),  # q = ceil(CTAs / SMs), §2.1.1
            ctas=traffic.ctas,
            ctas_per_sm=self.ctas_per_sm,
            sm_count=self.sm_count,
        )
        return stage, traffic

    def times_us(self, figures: MemoryModelFigures) -> tuple[FloatArray, Traffic]:
        """Predicted time of every configuration (us) and its traffic."""
        stage, traffic = self.stage_times_us(figures)
        total, _ = kernel_times(stage)
        return total, traffic

    def times_ns(
        self, figures: MemoryModelFigures
    ) -> tuple[IntArray, IntArray, StageTimes, Traffic]:
        """The same model in exact integer arithmetic, the optimizer's: each stage quantity of
        one CTA rounded to a tick (TICKS_PER_NS per ns), the closed forms on ticks (c CTAs
        sharing an SM multiply the rounded work by exactly c), overall time and total MATH
        wait rounded to ns at the end (:func:`ticks_to_ns`). With ticks of 1 ps the rounding
        stays far below a ns where ns durations would not (a 16 x 16 x 16 stage's loads take
        under 1 ns on an H100). Also the stage quantities in ticks and the traffic."""
        stage, traffic = self.stage_times_us(figures)
        ticks = stage.in_ticks()
        total, wait = kernel_times(ticks)
        return ticks_to_ns(total), ticks_to_ns(wait), ticks, traffic


@dataclass(frozen=True, slots=True)
class FigureScale:
    """Draws of the figures as multiples of their point values, each 1 or a (D, 1) array (one
    row per draw): the explore shortlist's belief (solver/explore.py) on this model. The DRAM
    and L2 bandwidths move together (``bandwidth``), as do the DRAM and L2 latencies
    (``latency``); ``launch`` scales T_INIT and split-K's reduction launch alike."""

    launch: float | FloatArray = 1.0
    epilogue: float | FloatArray = 1.0
    latency: float | FloatArray = 1.0
    math_startup: float | FloatArray = 1.0
    bandwidth: float | FloatArray = 1.0
    compute: float | FloatArray = 1.0


#: the integer time unit of :meth:`ShapeModel.times_ns`: 1 ps
TICKS_PER_NS = 1000


def ticks_to_ns(ticks: Any) -> Any:
    """Ticks to ns, rounded half up (int64 arrays or ints alike)."""
    return (ticks + TICKS_PER_NS // 2) // TICKS_PER_NS


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Per configuration, the stage quantities the closed forms read: us as float64, or ticks
    as int64 (:meth:`in_ticks`); the closed forms are the same functions on either."""

    issue: npt.NDArray[Any]  # d of one CTA alone on its SM
    latency: npt.NDArray[Any]  # lambda
    math: npt.NDArray[Any]  # T of one CTA alone, without the MATH startup
    math_startup: npt.NDArray[Any]
    epilogue: npt.NDArray[Any]
    #: one CTA's C tile through shared memory, paid by each CTA sharing the SM in a wave
    epilogue_per_cta: npt.NDArray[Any]
    store_per_cta: npt.NDArray[Any]  # one CTA's C tile at DRAM bandwidth
    fixed: npt.NDArray[Any]  # T_INIT + the cold first stage + split-K's reduction
    #: the wave ends after its last MATH (async-copy), or when it starts (the paper's Sm(S))
    tail_math: bool
    stages: IntArray
    depth: IntArray
    busiest: IntArray  # q = ceil(CTAs / SMs), §2.1.1
    ctas: IntArray
    ctas_per_sm: IntArray
    sm_count: int

    def in_ticks(self) -> StageTimes:
        """The same quantities as int64 ticks (TICKS_PER_NS per ns), each rounded."""

        def ns(us: npt.NDArray[Any]) -> IntArray:
            scaled = np.asarray(us, dtype=np.float64) * (1000.0 * TICKS_PER_NS)
            return np.rint(scaled).astype(np.int64)

        ticks: dict[str, Any] = {
            name: ns(getattr(self, name))
            for name in (
                "issue",
                "latency",
                "math",
                "math_startup",
                "epilogue",
                "epilogue_per_cta",
                "store_per_cta",
                "fixed",
            )
        }
        return dataclasses.replace(self, **ticks)

    def take(self, index: IntArray) -> StageTimes:
        arrays: dict[str, Any] = {
            f.name: getattr(self, f.name)[index]
            for f in dataclasses.fields(self)
            if f.name not in ("tail_math", "sm_count")
        }
        return dataclasses.replace(self, **arrays)

    def wave_shares(self) -> tuple[IntArray, IntArray, IntArray]:
        """(CTAs sharing an SM in a full wave, full waves, CTAs sharing the busiest SM in the
        partial wave (0: none))."""
        per_sm = np.minimum(self.ctas_per_sm, self.busiest)
        full, partial = np.divmod(self.busiest, per_sm)
        return per_sm, full, partial

    def wave(self, share: IntArray) -> tuple[Any, Any, Any]:
        """(d, lambda, T) of a stage when ``share`` CTAs share the SM."""
        return share * self.issue, self.latency, share * self.math + self.math_startup

    def after_last_math(self, t: Any, share: Any, at: Any = slice(None)) -> Any:
        """What a wave's main part adds after its last MATH start when ``share`` CTAs share
        the SM: that MATH (async-copy), T_EPILOGUE and the CTAs' C tiles through shared
        memory; ``at`` picks the configurations (every one by default)."""
        tail = t if self.tail_math else 0
        return tail + self.epilogue[at] + share * self.epilogue_per_cta[at]

    def wave_end(self, last_math_start: Any, t: Any, share: Any) -> Any:
        """A wave's main part when ``share`` CTAs share the SM (after_last_math)."""
        return last_math_start + self.after_last_math(t, share)

    def stored(self, share: IntArray) -> Any:
        """The C store of a wave of ``share`` CTAs per SM."""
        return np.minimum(share * self.sm_count, self.ctas) * self.store_per_cta


def kernel_times(s: StageTimes) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """(overall time, total MATH wait) of every configuration: full waves of c CTAs sharing
    the SM, then the partial wave (async-copy 2); each wave's C store drains during the next
    wave, the kernel ends when the last store has landed. The MATH wait sums the busiest
    SM's CTAs' waits, M(S) - (S - 1) T per CTA (GeMM-WS 8)."""
    per_sm, full, partial = s.wave_shares()

    def wave(share: IntArray) -> tuple[Any, Any, Any]:
        d, lam, t = s.wave(share)
        last = last_math_start_formula(d, lam, t, s.stages, s.depth, np.maximum)
        end = s.wave_end(last, t, share)
        return end, s.stored(share), share * (last - (s.stages - 1) * t)

    main_full, store_full, wait_full = wave(per_sm)
    main_partial, store_partial, wait_partial = wave(np.maximum(partial, 1))
    has_partial = partial > 0
    # waves in order: `full` full ones, then the partial one if any
    first_main = np.where(full > 0, main_full, main_partial)
    later_full = np.maximum(full - 1, 0) * np.maximum(main_full, store_full)
    after_full = np.where(full > 0, np.maximum(main_partial, store_full), main_partial)
    total = np.where(
        has_partial,
        np.where(full > 0, first_main + later_full + after_full, main_partial) + store_partial,
        first_main + later_full + store_full,
    )
    wait = full * wait_full + np.where(has_partial, wait_partial, 0)
    return s.fixed + total, wait


_SHARES_SM: dict[str, bool] = {"paper": False, "async-copy": True}
#: loads of a stage that each pay the startup latency: A and B in turn under eq. (4), one
#: asynchronous copy of both under async-copy
_COLD_LOADS: dict[str, int] = {"paper": 2, "async-copy": 1}
