"""Kernel execution time from the level-1 supersteps: eq. (4)-(25) of
many-bsp-supplementary.txt §1, with the worked examples' reading where they differ from the
printed equations (docs/model-notes.md, "Many-BSP")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from perfmodel.manybsp.types import (
    UNIT_COLUMNS,
    InstructionCost,
    InstructionKind,
    KernelEstimate,
    LaunchShape,
    ManyBspDevice,
    Superstep,
)


def occupancy_rho(launch: LaunchShape, device: ManyBspDevice) -> int:
    """eq. (21): resident blocks per SM; a resource the kernel does not use sets no limit."""
    limits = [device.max_threads_per_sm // launch.n_t]
    if device.max_blocks_per_sm is not None:
        limits.append(device.max_blocks_per_sm)  # the SM's block slots (Programming Guide)
    if launch.registers_per_thread > 0:
        limits.append(device.registers_per_sm // (launch.n_t * launch.registers_per_thread))
    if launch.shared_bytes_per_block > 0:
        limits.append(device.shared_memory_per_sm_bytes // launch.shared_bytes_per_block)
    return max(1, min(limits))


def dynamic_counts(
    costs: Sequence[InstructionCost], level1: Sequence[Superstep]
) -> tuple[int, int, int, int]:
    """(l, l_c, l_m, l_b): executed instructions, computational, global-memory, barriers.

    The parameter blocks count executed instructions (MM: l = 32 + 10 x 112 + 11 = 1163,
    l_m = 10 x 2 + 1 = 21, l_b = 10 x 2 = 20).
    """
    l_total = l_m = l_b = 0
    for s in level1:
        for c in costs[s.start : s.end + 1]:
            l_total += s.iterations
            if c.kind is InstructionKind.GLOBAL_MEMORY:
                l_m += s.iterations
            elif c.kind is InstructionKind.BARRIER:
                l_b += s.iterations
    return l_total, l_total - l_m - l_b, l_m, l_b


def last_comm_cycles(
    costs: Sequence[InstructionCost], level1: Sequence[Superstep], w: int
) -> float:
    """comm of the kernel's last global-memory access: it cannot overlap later work, so the
    examples leave it out of block_comm_Delta (Hotspot: 2292 - 764 = 1528)."""
    for s in reversed(level1):
        if s.iterations == 0:
            continue
        for c in reversed(costs[s.start : s.end + 1]):
            if c.kind is InstructionKind.GLOBAL_MEMORY:
                return w * c.n_ma * c.latency_cycles
    return 0.0


@dataclass(frozen=True, slots=True)
class BlockTotals:
    """One block's sums over its level-1 supersteps (eq. (10)-(12)) and instruction counts.

    They depend on the code, the block size and the per-instruction figures, but not on mu or
    the launch overheads: a calibration varies those and re-evaluates only
    :func:`kernel_from_totals`.
    """

    w: int
    parallel_comp: float
    block_bar_ovh: float
    block_comm: float
    block_comm_delta: float
    l: int  # noqa: E741 - the paper's name (Table 1-8)
    l_c: int
    l_m: int
    l_b: int
    #: one warp's issue cycles and its busiest unit's occupancy over the whole kernel body
    #: (throughput floor, :func:`throughput_floor`)
    warp_issue_cycles: float = 0.0
    warp_unit_cycles: float = 0.0
    #: threads of a block that run this code (0: the whole block); the floor counts their warps
    threads: int = 0
    #: a block class that touches no memory: its blocks leave at once (throughput_floor)
    leaves_at_once: bool = False


def warp_work(
    costs: Sequence[InstructionCost], level1: Sequence[Superstep], device: ManyBspDevice
) -> tuple[float, float]:
    """(issue cycles, busiest unit's cycles) one warp needs for the executed instructions:
    the issue column and the '32/T_i' occupancy of Table N-2 for w = 1, without latencies,
    times the level-1 iterations. A global access occupies LDST for its issue like a shared
    one (its latency is comm, not occupancy)."""
    issue = 0.0
    units = [0.0, 0.0, 0.0, 0.0]
    cols = {fu: k for k, fu in enumerate(UNIT_COLUMNS)}
    # Volta and later (profiles with 32-byte sectors): a scheduler dispatches one warp
    # instruction per cycle whatever the unit's width, and the SP column is two 16-lane
    # pipes (INT32 and FP32) that work side by side (Volta/Ampere/Hopper whitepapers)
    split = device.sector_bytes is not None
    for s in level1:
        if s.iterations == 0:
            continue
        for c in costs[s.start : s.end + 1]:
            if c.kind in (InstructionKind.BARRIER, InstructionKind.UNCOSTED) or split:
                issue += s.iterations * device.issue_cycle
                if c.kind in (InstructionKind.BARRIER, InstructionKind.UNCOSTED):
                    continue
            else:
                issue += (
                    s.iterations * device.issue_cycle * math.ceil(device.warp_size / c.units_per_ws)
                )
            col = cols.get(c.fu)
            if col is not None:
                replays = c.n_ma if c.kind is InstructionKind.SHARED_MEMORY else 1
                units[col] += s.iterations * device.warp_size / c.throughput_per_ws * replays
    if split:
        units[0] /= 2
    return issue, max(units)


def throughput_floor(totals: BlockTotals, launch: LaunchShape, device: ManyBspDevice) -> float:
    """Cycles the SMs need to issue and execute every warp of the grid at full throughput:
    warps of the grid / (n_sm x n_ws) x one warp's bottleneck. No latency can make a kernel
    faster than this; eq. (24)/(25) can fall below it when many resident blocks hide more
    latency than mu allows for (docs/model-notes.md, "Throughput floor")."""
    warps = launch.n_b * math.ceil((totals.threads or launch.n_t) / device.warp_size)
    per_warp = max(totals.warp_issue_cycles, totals.warp_unit_cycles)
    # eq. (24) counts one launch: the others overlap resident blocks' work. Blocks a bounds
    # check sends out at once (a grid larger than its data) have no work to overlap: each
    # takes block_lnch_ovh of its SM's time (docs/model-notes.md, "Block launches")
    launches = launch.n_b / device.n_sm * device.block_launch_overhead_cycles
    # the peak rates are per cycle of the profile's clock; throughput_efficiency is what a
    # board sustains of them (clock below or above the rated boost, issue stalls)
    work = warps / (device.n_sm * device.n_ws) * per_warp / device.throughput_efficiency
    return work + (launches if totals.leaves_at_once else 0.0)


def _touches_memory(costs: Sequence[InstructionCost], level1: Sequence[Superstep]) -> bool:
    memory = (InstructionKind.GLOBAL_MEMORY, InstructionKind.SHARED_MEMORY)
    return any(c.kind in memory for s in level1 if s.iterations for c in costs[s.start : s.end + 1])


def block_totals(
    costs: Sequence[InstructionCost],
    level1: Sequence[Superstep],
    w: int,
    device: ManyBspDevice | None = None,
    threads: int = 0,
) -> BlockTotals:
    """eq. (10)-(12), block_comm_Delta and the dynamic counts of one block; with ``device``
    also one warp's work for the throughput floor (over ``threads`` of the block, 0: all)."""
    parallel_comp = sum(s.iterations * s.comp_cycles for s in level1)  # eq. (10)
    block_bar_ovh = sum(s.iterations * s.ovh_cycles for s in level1)  # eq. (11)
    block_comm = sum(s.iterations * s.comm_cycles for s in level1)  # eq. (12)
    l_total, l_c, l_m, l_b = dynamic_counts(costs, level1)
    work = warp_work(costs, level1, device) if device is not None else (0.0, 0.0)
    return BlockTotals(
        w=w,
        parallel_comp=parallel_comp,
        block_bar_ovh=block_bar_ovh,
        block_comm=block_comm,
        block_comm_delta=max(0.0, block_comm - last_comm_cycles(costs, level1, w)),
        l=l_total,
        l_c=l_c,
        l_m=l_m,
        l_b=l_b,
        warp_issue_cycles=work[0],
        warp_unit_cycles=work[1],
        threads=threads,
        leaves_at_once=bool(threads) and not _touches_memory(costs, level1),
    )


def estimate_kernel(
    costs: Sequence[InstructionCost],
    level1: Sequence[Superstep],
    w: int,
    launch: LaunchShape,
    device: ManyBspDevice,
    threads: int = 0,
) -> KernelEstimate:
    """eq. (4)-(25) for a grid of identical blocks (``threads``: of each block, those that
    run this code; 0: all)."""
    return kernel_from_totals(block_totals(costs, level1, w, device, threads), launch, device)


@dataclass(frozen=True, slots=True)
class KernelTerms:
    """The addends of eq. (24)/(25), cycles; :attr:`total` is kernel_exec_cycle."""

    block_launch_overhead: float
    #: n_b / n_sm x comp / min(mu, (1 + rho) / 2)
    blocks: float
    #: eq. (25) only, else 0: (K - 1) x (tau - rho) / (tau - 1) x novlp
    rounds: float
    #: novlp / 2
    tail: float
    equation: str

    @property
    def total(self) -> float:
        # the order of the sum is the equation's, so the total is bit-for-bit the same
        base = self.block_launch_overhead + self.blocks + self.tail
        return base + self.rounds if self.equation == "25" else base


def kernel_terms(
    *,
    block_launch_overhead_cycles: float,
    n_b: int,
    n_sm: int,
    comp: float,
    novlp: float,
    rho: int,
    K: float,  # noqa: N803 - the paper's name
    tau: int,
    mu: float,
    interleaved_warps: int = 1,
) -> KernelTerms:
    """eq. (24) when rho >= tau, else eq. (25), term by term.

    ``interleaved_warps``: on Volta and later, w (eq. 6) -- each warp has its own program
    counter and the scheduler interleaves warps at instruction granularity, so the resident
    warps per scheduler, not only the resident blocks, overlap each other's latency:
    min(mu, (1 + rho w) / 2) (docs/model-notes.md, "Throughput floor")."""
    speedup = min(mu, (1 + rho * interleaved_warps) / 2)
    blocks = n_b / n_sm * comp / speedup
    if rho >= tau:  # eq. (24)
        return KernelTerms(block_launch_overhead_cycles, blocks, 0.0, novlp / 2, "24")
    # eq. (25): (K - 1) counts the rounds after the first; with fewer blocks than resident
    # slots (K < 1) there are none, and the term must not turn negative (docs/model-notes.md).
    rounds = max(0.0, K - 1) * (tau - rho) / (tau - 1) * novlp
    return KernelTerms(block_launch_overhead_cycles, blocks, rounds, novlp / 2, "25")


def kernel_from_totals(
    totals: BlockTotals, launch: LaunchShape, device: ManyBspDevice
) -> KernelEstimate:
    """eq. (4)-(5) and (13)-(25) from one block's totals."""
    w = totals.w
    parallel_comp, block_bar_ovh = totals.parallel_comp, totals.block_bar_ovh
    block_comm, block_comm_delta = totals.block_comm, totals.block_comm_delta
    l_total, l_c, l_m, l_b = totals.l, totals.l_c, totals.l_m, totals.l_b
    COMP = w * device.warp_launch_overhead_cycles + parallel_comp  # eq. (5)
    warp_comp = COMP / w
    warp_comm_delta = block_comm_delta / w
    rho = occupancy_rho(launch, device)  # eq. (21)
    interleaved = device.sector_bytes is not None
    # eq. (15): warps needed to hide the overlappable communication.
    warps_need: float
    if l_m > 1 and warp_comp > 0 and warp_comm_delta > 0:
        warps_need = device.n_ws * (math.ceil(warp_comm_delta * l_c / (warp_comp * (l_m - 1))) + 1)
    else:
        warps_need = float(device.n_ws)
    # Volta and later interleave every resident warp of the SM, not only the block's own
    # (docs/model-notes.md, "Throughput floor, warp interleaving")
    resident_warps = w * device.n_ws * (rho if interleaved else 1)
    hidden_fraction = min(1.0, resident_warps / warps_need)
    overlapped = hidden_fraction * block_comm_delta / w  # eq. (16)
    if block_comm > 0:  # eq. (17)
        nonoverlapped = min(
            block_comm / w,
            device.mem_lat_cycles + block_comm_delta / w * max(0.0, 1.0 - hidden_fraction),
        )
    else:
        nonoverlapped = 0.0
    block_exec_cycle = (
        device.block_launch_overhead_cycles + block_bar_ovh + nonoverlapped + COMP
    )  # eq. (4)
    # All blocks run the same code, so the averages of eq. (19)-(20) are one block's values.
    comp = COMP + block_bar_ovh  # eq. (19)
    novlp = nonoverlapped  # eq. (20)
    K = launch.n_b / (device.n_sm * rho)  # eq. (22)
    # eq. (23) prints a floor; every worked example takes the ceiling (KNN 940MX:
    # ceil(918/573) + 1 = 3). We follow the examples.
    tau = math.ceil(novlp / comp) + 1 if comp > 0 else 1
    terms = kernel_terms(
        block_launch_overhead_cycles=device.block_launch_overhead_cycles,
        n_b=launch.n_b,
        n_sm=device.n_sm,
        comp=comp,
        novlp=novlp,
        rho=rho,
        K=K,
        # interleaved warps overlap the next round's communication as they overlap the
        # block's own: eq. (24)
        tau=min(tau, rho) if interleaved else tau,
        mu=device.mu,
        interleaved_warps=w if interleaved else 1,
    )
    kernel, equation = terms.total, terms.equation
    floor = 0.0
    if interleaved:
        # the launch of the first block and the last block's drain (novlp / 2) stand beside
        # either bound, so block classes can add their bounds and count these once
        floor = throughput_floor(totals, launch, device)
        kernel = terms.block_launch_overhead + terms.tail + max(terms.blocks + terms.rounds, floor)
    return KernelEstimate(
        w=w,
        parallel_comp=parallel_comp,
        block_bar_ovh=block_bar_ovh,
        block_comm=block_comm,
        block_comm_delta=block_comm_delta,
        COMP=COMP,
        warp_comp=warp_comp,
        warp_comm_delta=warp_comm_delta,
        l=l_total,
        l_c=l_c,
        l_m=l_m,
        l_b=l_b,
        warps_need=warps_need,
        overlapped=overlapped,
        nonoverlapped=nonoverlapped,
        block_exec_cycle=block_exec_cycle,
        comp=comp,
        novlp=novlp,
        rho=rho,
        K=K,
        tau=tau,
        mu=device.mu,
        kernel_exec_cycle=kernel,
        equation=equation,
        throughput_floor_cycles=floor,
        latency_bound_cycles=terms.blocks + terms.rounds,
    )


def combine_block_classes(
    base: KernelEstimate, estimates: Sequence[KernelEstimate], device: ManyBspDevice
) -> KernelEstimate:
    """``base`` with the grid's time, throughput floor and latency-bound terms of a grid
    whose blocks fall into classes (each estimated as its own grid). Without a throughput
    floor the classes' times add. With one, eq. (18)-(20) average every block's profile into
    one eq. (24) for the whole grid: its latency-bound terms add over the classes, so do
    their floors, and the max of the two is taken once, so that one class's latency overlaps
    another's slack (docs/model-notes.md, "Block classes share the SMs"); the launch of the
    first block and the longest drain count once."""
    latency = sum(e.latency_bound_cycles for e in estimates)
    floor = sum(e.throughput_floor_cycles for e in estimates)
    if device.sector_bytes is None or not estimates:
        kernel = sum(e.kernel_exec_cycle for e in estimates)
    else:
        tail = max(e.novlp / 2 for e in estimates)
        kernel = device.block_launch_overhead_cycles + tail + max(latency, floor)
    return replace(
        base, kernel_exec_cycle=kernel, throughput_floor_cycles=floor, latency_bound_cycles=latency
    )


def sum_block_classes(estimates: Sequence[KernelEstimate], device: ManyBspDevice) -> float:
    """kernel_exec_cycle of a grid whose blocks fall into classes (combine_block_classes)."""
    if not estimates:
        return 0.0
    return combine_block_classes(estimates[0], estimates, device).kernel_exec_cycle
