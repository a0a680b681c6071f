"""Plain, picklable data of the Many-BSP model (many-bsp-supplementary.txt §1).

The model core (:mod:`perfmodel.manybsp.block`, :mod:`perfmodel.manybsp.kernel`) works on a
per-instruction table like the paper's Table N-1, so it can be checked against the published
tables without going through the PTX front end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class FunctionalUnit(StrEnum):
    """Functional units of Table 1-1 footnotes: SPs = FU1, DPU = FU2, SFU = FU3, LDST = FU4.

    ``MI`` marks multi-instruction operations (``bar.sync``) that occupy no single unit;
    ``none`` an uncosted instruction, whose unit the device figures do not say.
    """

    SP = "SPs"
    DPU = "DPU"
    SFU = "SFU"
    LDST = "LDST"
    MI = "MI"
    NONE = "none"


#: The four units with an occupancy column in the BLOCK table (Table N-2: FU1..FU4).
UNIT_COLUMNS: tuple[FunctionalUnit, ...] = (
    FunctionalUnit.SP,
    FunctionalUnit.DPU,
    FunctionalUnit.SFU,
    FunctionalUnit.LDST,
)


class InstructionKind(StrEnum):
    """How an instruction enters the BLOCK table."""

    COMPUTE = "compute"  # occupies a functional unit for its latency (comp)
    GLOBAL_MEMORY = "global_memory"  # global/local memory access: costs comm, not comp
    SHARED_MEMORY = "shared_memory"  # on-chip access: comp on LDST, n_ma replays
    BARRIER = "barrier"  # bar.sync: ovh by block size (Tables 1-5..1-7)
    BRANCH = "branch"  # guarded branch: ends a level-2 superstep (sync 1)
    UNIFORM_BRANCH = "uniform_branch"  # bra.uni: no sync
    UNCOSTED = "uncosted"  # no figures for it: one issue slot, no unit, latency or sync


@dataclass(frozen=True, slots=True)
class InstructionCost:
    """One row of Table N-1: the figures the BLOCK data structure is built from.

    ``consumer`` is u (the index, in this table, of the first later instruction that reads
    a register this one writes; ``None`` when nothing does). ``n_ma`` is the number of
    memory transactions per warp (1 for non-memory instructions).
    """

    line: int
    opcode: str
    fu: FunctionalUnit
    kind: InstructionKind
    units_per_ws: int  # n_fu^i: units available to one warp scheduler
    throughput_per_ws: float  # T_i: results per cycle per warp scheduler
    latency_cycles: float  # comp latency, or comm latency for global memory
    consumer: int | None = None
    n_ma: int = 1
    barrier_overhead_cycles: float = 0.0


@dataclass(frozen=True, slots=True)
class Level1Span:
    """A level-1 superstep: inclusive range of table indices and its iteration count."""

    start: int
    end: int
    iterations: int


@dataclass(frozen=True, slots=True)
class LaunchShape:
    """Launch and resources of one kernel: n_b blocks of n_t threads (Table 1-8)."""

    n_b: int
    n_t: int
    registers_per_thread: int
    shared_bytes_per_block: int


@dataclass(frozen=True, slots=True)
class ManyBspDevice:
    """Device parameters of Table 1-8 plus the per-SM limits of eq. (21)."""

    warp_size: int
    n_sm: int
    n_ws: int
    n_du: int
    issue_cycle: float
    mem_lat_cycles: float
    warp_launch_overhead_cycles: float
    block_launch_overhead_cycles: float
    max_threads_per_sm: int
    registers_per_sm: int
    shared_memory_per_sm_bytes: int
    mu: float
    max_threads_per_block: int | None = None
    shared_memory_per_block_bytes: int | None = None
    max_registers_per_thread: int | None = None
    segment_bytes: int = 128
    #: Volta and later: L1/L2 traffic moves 32-byte sectors; None: the paper's segments alone
    sector_bytes: int | None = None
    l2_hit_latency_cycles: float | None = None
    l2_cache_bytes: int | None = None
    max_blocks_per_sm: int | None = None
    #: the fraction of the per-warp issue/unit peak the SMs sustain, at the profile's clock:
    #: divides the throughput floor's work term (docs/model-notes.md, "Throughput efficiency")
    throughput_efficiency: float = 1.0
    #: Whether the instruction after an eq. (8) stall opens its level-2 superstep with its
    #: latency exposed. The worked tables differ by device (Table 2-2 row 60 "419+2" on the
    #: GTX 760; Table 5-2 rows 39 and 60 "8" on the 940MX); docs/model-notes.md, "Many-BSP".
    latency_exposed_after_eq8_stall: bool = True


@dataclass(frozen=True, slots=True)
class BlockRow:
    """One row of the BLOCK data structure (Table N-2)."""

    index: int
    issue_cycles: float
    fu_cycles: tuple[float, float, float, float]  # FU1..FU4 occupancy
    comm_cycles: float
    ovh_cycles: float
    sync_cycles: float
    latency_exposed: bool


@dataclass(frozen=True, slots=True)
class Superstep:
    """A superstep ``<start ~ end, comp, comm, ovh>`` (Table N-3); indices are inclusive."""

    start: int
    end: int
    comp_cycles: float
    comm_cycles: float
    ovh_cycles: float
    iterations: int = 1


@dataclass(frozen=True, slots=True)
class BlockAnalysis:
    rows: tuple[BlockRow, ...]
    level1: tuple[Superstep, ...]
    level2: tuple[Superstep, ...]
    w: int


@dataclass(frozen=True, slots=True)
class KernelEstimate:
    """Every intermediate quantity of eq. (4)-(25), by the paper's names."""

    w: int
    parallel_comp: float
    block_bar_ovh: float
    block_comm: float
    block_comm_delta: float
    COMP: float
    warp_comp: float
    warp_comm_delta: float
    l: int  # noqa: E741 - the paper's name (Table 1-8)
    l_c: int
    l_m: int
    l_b: int
    warps_need: float
    overlapped: float
    nonoverlapped: float
    block_exec_cycle: float
    comp: float
    novlp: float
    rho: int
    K: float
    tau: int
    mu: float
    kernel_exec_cycle: float
    equation: str = field(default="24")
    #: the grid's warps at full issue/unit throughput (0: not evaluated); kernel_exec_cycle
    #: is never below it
    throughput_floor_cycles: float = 0.0
    #: eq. (24)/(25)'s latency-bound addends (blocks + rounds terms) before the max with the
    #: throughput floor; block classes add these over the grid before taking that max
    latency_bound_cycles: float = 0.0
