"""GeMM-WS event simulator (warp-specialization-gemm-model.txt, §2).

One CTA computes one output tile in ``S = ceil(K / TK)`` stages. Per stage ``i`` (1-based) the
model has three events: the DMA warp starts loading tile a_i (``Sa(i)``, eq. 1), then tile b_i
(``Sb(i)``, eq. 2), and the MATH warp starts multiplying (``Sm(i)``, eq. 3). The shared-memory
circular buffer holds ``buffer_depth`` stages of tiles, so the load of stage i also waits until
MATH has released stage ``i - buffer_depth``.

Time is integer nanoseconds throughout. The paper's solver works over integers (§3.2); doing the
same here keeps the simulator and the Z3 solver bit-for-bit comparable, and it is what makes the
symmetric Table 1 configurations (e.g. 128x64 vs 64x128) tie exactly instead of differing by a
floating-point rounding error (docs/model-notes.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

NS_PER_US = 1000

#: bytes per matrix element by dtype name; sizes the shared-memory buffer only (§4.2's
#: durations are per element whatever the type, docs/model-notes.md GeMM-WS 3)
ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


class WaveTimeModel(StrEnum):
    """How a wave's duration is read off the last stage (docs/model-notes.md, "wave time")."""

    #: §2.2 as printed: wave time = Sm(S) + T_EPILOGUE (Sm(S) is when the last MATH *starts*).
    PAPER = "paper"
    #: wave time = Sm(S) + T_MATH + T_EPILOGUE: the last MATH must finish before the epilogue.
    INCLUDE_LAST_MATH = "include-last-math"


def require_counts(record: object) -> None:
    """Every field of the slotted dataclass ``record`` is a count: at least 1 (None, where a
    field allows it, means "no figure"); ValueError naming the first that is not."""
    for name in record.__slots__:  # type: ignore[attr-defined]
        value = getattr(record, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


@dataclass(frozen=True, slots=True)
class GemmWsMachine:
    """Machine figures of the GeMM-WS model (§2.2, measured for the A6000 in §4.2).

    Times in microseconds; load throughput in matrix elements per microsecond; compute
    throughput in multiply-accumulates per microsecond.
    """

    sm_count: int
    t_init_us: float
    t_epilogue_us: float
    load_startup_latency_us: float
    compute_startup_latency_us: float
    load_throughput_elements_per_us: float
    compute_throughput_macs_per_us: float
    shared_memory_per_block_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.sm_count < 1:
            raise ValueError("sm_count must be at least 1")
        for name in ("load_throughput_elements_per_us", "compute_throughput_macs_per_us"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        for name in (
            "t_init_us",
            "t_epilogue_us",
            "load_startup_latency_us",
            "compute_startup_latency_us",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative finite number, got {value}")


@dataclass(frozen=True, slots=True)
class SmLimits:
    """Per-SM residency limits (CUDA C++ Programming Guide, technical specifications).

    ``None`` means "no limit from this resource". Registers and threads limit residency only
    when the caller gives ``threads_per_cta`` (and ``registers_per_thread``).
    """

    max_blocks_per_sm: int = 1
    shared_memory_per_sm_bytes: int | None = None
    registers_per_sm: int | None = None
    max_threads_per_sm: int | None = None
    threads_per_cta: int | None = None
    registers_per_thread: int | None = None

    def __post_init__(self) -> None:
        require_counts(self)

    def ctas_per_sm(self, shared_memory_per_cta_bytes: int) -> int:
        """Resident CTAs per SM: the tightest of the block cap, shared memory, threads and
        registers; 0 when one CTA does not fit the SM's shared memory."""
        limit = self.max_blocks_per_sm
        if self.shared_memory_per_sm_bytes is not None:
            limit = min(limit, self.shared_memory_per_sm_bytes // shared_memory_per_cta_bytes)
        if self.threads_per_cta is not None:
            if self.max_threads_per_sm is not None:
                limit = min(limit, self.max_threads_per_sm // self.threads_per_cta)
            if self.registers_per_sm is not None and self.registers_per_thread is not None:
                per_cta = self.threads_per_cta * self.registers_per_thread
                limit = min(limit, self.registers_per_sm // per_cta)
        return limit


def scaled_throughputs(machine: GemmWsMachine, ratios: tuple[float, float]) -> GemmWsMachine:
    """``machine`` with its (load, compute) throughputs multiplied by ``ratios``: the figures
    of another element type, cited per profile as ratios to the fp16 ones (a throughput is
    per element and per MAC, eq. (4)/(6))."""
    if ratios == (1.0, 1.0):
        return machine
    return dataclasses.replace(
        machine,
        load_throughput_elements_per_us=machine.load_throughput_elements_per_us * ratios[0],
        compute_throughput_macs_per_us=machine.compute_throughput_macs_per_us * ratios[1],
    )


#: the raster group rows searched by default under the L2-aware memory term: Triton's
#: GROUP_SIZE_M values in its tutorials' autotune lists, 1 (row-major) and 8
DEFAULT_GROUP_M: tuple[int, ...] = (1, 8)
#: the split-K slices searched by default under it (1: none)
DEFAULT_SPLIT_K: tuple[int, ...] = (1, 2, 4, 8, 16)


@dataclass(frozen=True, slots=True)
class Tiling:
    tile_m: int
    tile_n: int
    tile_k: int
    buffer_depth: int
    #: rows of output tiles a raster group walks column by column (Triton's GROUP_SIZE_M;
    #: 1: row-major); read only by the L2-reuse memory term (perfmodel/gemm_ws_traffic.py)
    group_m: int = 1
    #: slices of the reduction over K, each a CTA of its own (1: no split-K)
    split_k: int = 1

    def __post_init__(self) -> None:
        require_counts(self)

    def shared_memory_bytes(self, element_bytes: int) -> int:
        """Bytes of the circular buffer: buffer_depth stages of one A and one B tile each."""
        stage = stage_buffer_bytes(self.tile_m, self.tile_n, self.tile_k, element_bytes)
        return self.buffer_depth * stage


def stage_buffer_bytes(tile_m: int, tile_n: int, tile_k: int, element_bytes: int) -> int:
    """Shared memory of one buffer stage: an A tile (TM x TK) and a B tile (TK x TN)."""
    return (tile_m * tile_k + tile_k * tile_n) * element_bytes


@dataclass(frozen=True, slots=True)
class GemmShape:
    """C (m x n) = A (m x k) B (k x n), in elements."""

    m: int
    n: int
    k: int

    def __post_init__(self) -> None:
        require_counts(self)


# cached: exact rational arithmetic costs ~30 us a call, and a machine's T_INIT and T_EPILOGUE
# are converted once per configuration scored one by one (a candidate list's ranks)
@functools.lru_cache(maxsize=1024)
def us_to_ns(value_us: float | Fraction) -> int:
    """Round a duration to the nearest nanosecond, halves up (deterministic, platform-free)."""
    scaled = Fraction(value_us) * NS_PER_US
    return math.floor(scaled + Fraction(1, 2))


def ns_to_us(value_ns: int) -> float:
    return value_ns / NS_PER_US


@dataclass(frozen=True, slots=True)
class StageDurations:
    """Per-stage durations in integer nanoseconds (§2.2)."""

    t_load_a_ns: int
    t_load_b_ns: int
    t_math_ns: int

    @property
    def t_load_ns(self) -> int:
        """One stage's DMA work: A then B are loaded back to back by the DMA warp."""
        return self.t_load_a_ns + self.t_load_b_ns


class DurationTable:
    """Integer-nanosecond durations of §2.2 for one machine, without repeated float math.

    ``T = work / throughput + startup`` is evaluated exactly on the rationals the machine's
    floats denote and rounded half up, using integers only (the solver evaluates it for every
    tile pair and triple of a search space).
    """

    def __init__(self, machine: GemmWsMachine) -> None:
        #: T_LOAD for a tile of ``elements`` matrix elements
        self.load_ns = _affine_ns(
            machine.load_throughput_elements_per_us, machine.load_startup_latency_us
        )
        #: T_MATH for ``macs`` multiply-accumulates
        self.math_ns = _affine_ns(
            machine.compute_throughput_macs_per_us, machine.compute_startup_latency_us
        )

    def stage(self, tiling: Tiling) -> StageDurations:
        return StageDurations(
            t_load_a_ns=self.load_ns(tiling.tile_m * tiling.tile_k),
            t_load_b_ns=self.load_ns(tiling.tile_k * tiling.tile_n),
            t_math_ns=self.math_ns(tiling.tile_m * tiling.tile_n * tiling.tile_k),
        )


def _affine_ns(throughput_per_us: float, startup_us: float) -> Callable[[int], int]:
    """work -> round_half_up(1000 * (work / throughput + startup)) in integer arithmetic."""
    thr, start = Fraction(throughput_per_us), Fraction(startup_us)
    p, q = thr.numerator, thr.denominator
    a, b = start.numerator, start.denominator
    denominator = 2 * p * b
    offset = 2 * NS_PER_US * a * p + p * b

    def duration(work: int) -> int:
        # 1000 * (work * q / p + a / b) = 1000 * (work * q * b + a * p) / (p * b)
        return (2 * NS_PER_US * work * q * b + offset) // denominator

    return duration


def stage_durations(tiling: Tiling, machine: GemmWsMachine) -> StageDurations:
    """T_LOAD-A, T_LOAD-B and T_MATH: linear in the work, offset by a startup latency (§2.2)."""
    return DurationTable(machine).stage(tiling)


def wave_count(shape: GemmShape, tiling: Tiling, sm_count: int) -> int:
    """W = ceil(ceil(M/TM) * ceil(N/TN) / SMs) (§2.1.1)."""
    output_tiles = math.ceil(shape.m / tiling.tile_m) * math.ceil(shape.n / tiling.tile_n)
    return math.ceil(output_tiles / sm_count)


def stage_count(shape: GemmShape, tiling: Tiling) -> int:
    """S = ceil(K/TK) (§2.1.2)."""
    return math.ceil(shape.k / tiling.tile_k)


@dataclass(frozen=True, slots=True)
class StageEvents:
    """Event times of one stage of one wave, nanoseconds from the wave's start."""

    stage: int
    load_a_start_ns: int
    load_b_start_ns: int
    math_start_ns: int
    math_wait_ns: int


@dataclass(frozen=True, slots=True)
class Simulation:
    shape: GemmShape
    tiling: Tiling
    durations: StageDurations
    waves: int
    stages: int
    wave_time_ns: int
    overall_time_ns: int
    #: W x sum of per-stage MATH waits (§3.2, second objective)
    total_math_wait_ns: int
    events: tuple[StageEvents, ...]

    @property
    def load_bound(self) -> bool:
        """True when one stage's DMA work outlasts one stage's MATH work."""
        return self.durations.t_load_ns > self.durations.t_math_ns


def simulate(
    shape: GemmShape,
    tiling: Tiling,
    machine: GemmWsMachine,
    wave_model: WaveTimeModel = WaveTimeModel.PAPER,
) -> Simulation:
    """Run the §2.2 recurrences stage by stage for one wave; all waves are identical (§2.1.1)."""
    durations = stage_durations(tiling, machine)
    t_a, t_b, t_math = durations.t_load_a_ns, durations.t_load_b_ns, durations.t_math_ns
    stages = stage_count(shape, tiling)
    depth = tiling.buffer_depth
    load_a: list[int] = [0] * (stages + 1)
    load_b: list[int] = [0] * (stages + 1)
    math_start: list[int] = [0] * (stages + 1)
    events: list[StageEvents] = []
    for i in range(1, stages + 1):
        # A buffer slot is free at time 0 until stage i reuses the slot of stage i - depth; the
        # paper leaves Sm(j) for j <= 0 undefined (docs/model-notes.md).
        slot_free = math_start[i - depth] + t_math if i > depth else 0
        # eq. (1): a_i waits for the DMA warp to finish b_{i-1} and for a free buffer slot.
        load_a[i] = 0 if i == 1 else max(load_b[i - 1] + t_b, slot_free)
        # eq. (2): b_i follows a_i on the same DMA warp, and also needs the free slot.
        load_b[i] = max(load_a[i] + t_a, slot_free)
        # eq. (3): MATH starts when the previous MATH is done and b_i has arrived.
        previous_math_done = math_start[i - 1] + t_math if i > 1 else 0
        math_start[i] = max(previous_math_done, load_b[i] + t_b)
        # §3.2 Wait(i): Sb(1) + T_LOAD-B for i = 1, else Sm(i) - (Sm(i-1) + T_MATH).
        wait = load_b[1] + t_b if i == 1 else math_start[i] - previous_math_done
        events.append(StageEvents(i, load_a[i], load_b[i], math_start[i], wait))
    waves = wave_count(shape, tiling, machine.sm_count)
    wave_time = wave_time_ns(math_start[stages], durations, machine, wave_model)
    return Simulation(
        shape=shape,
        tiling=tiling,
        durations=durations,
        waves=waves,
        stages=stages,
        wave_time_ns=wave_time,
        overall_time_ns=overall_time_ns(wave_time, waves, machine),
        total_math_wait_ns=waves * sum(e.math_wait_ns for e in events),
        events=tuple(events),
    )


def last_math_start_closed_form_ns(
    durations: StageDurations, stages: int, buffer_depth: int
) -> int:
    """Sm(S) without running the recurrences (docs/model-notes.md GeMM-WS 7).

    With L = T_LOAD-A + T_LOAD-B and T = T_MATH, eq. (1)-(3) give Sm(i) = L + (i - 1) max(L, T)
    for depth >= 2 and Sm(i) = L + (i - 1)(L + T) for depth 1; equal to :func:`simulate`'s
    ``events[-1].math_start_ns`` on the same integer durations.
    """
    load, t_math = durations.t_load_ns, durations.t_math_ns
    per_stage = load + t_math if buffer_depth == 1 else max(load, t_math)
    return load + (stages - 1) * per_stage


def simulate_closed_form(
    shape: GemmShape,
    tiling: Tiling,
    machine: GemmWsMachine,
    wave_model: WaveTimeModel = WaveTimeModel.PAPER,
    table: DurationTable | None = None,
) -> Simulation:
    """:func:`simulate` in O(1), without the per-stage events (``events`` is empty): the closed
    form of Sm(S), the wave and overall times of §2.1.1/§2.2 and the total MATH wait of §3.2.
    ``table`` reuses one machine's duration table."""
    durations = (table or DurationTable(machine)).stage(tiling)
    stages = stage_count(shape, tiling)
    last_math_start = last_math_start_closed_form_ns(durations, stages, tiling.buffer_depth)
    waves = wave_count(shape, tiling, machine.sm_count)
    wave = wave_time_ns(last_math_start, durations, machine, wave_model)
    # §3.2: sum_i Wait(i) telescopes to Sm(S) - (S - 1) T_MATH, times W waves
    wait = waves * (last_math_start - (stages - 1) * durations.t_math_ns)
    overall = overall_time_ns(wave, waves, machine)
    return Simulation(shape, tiling, durations, waves, stages, wave, overall, wait, events=())


def wave_time_ns(
    last_math_start_ns: int,
    durations: StageDurations,
    machine: GemmWsMachine,
    wave_model: WaveTimeModel,
) -> int:
    """Wave execution time = Sm(S) + T_EPILOGUE (§2.2), optionally + the last T_MATH."""
    tail = durations.t_math_ns if wave_model is WaveTimeModel.INCLUDE_LAST_MATH else 0
    return last_math_start_ns + tail + us_to_ns(machine.t_epilogue_us)


def overall_time_ns(wave_time: int, waves: int, machine: GemmWsMachine) -> int:
    """Overall execution time = wave time x W + T_INIT (§2.1.1)."""
    return wave_time * waves + us_to_ns(machine.t_init_us)
