"""From a parsed PTX function to the model's per-instruction table (Table N-1) and level-1
spans: instruction classes, u/d dependencies, n_ma, loop iterations.

Level-1 supersteps (Step 4; Tables 2-3..7-3) are the straight-line stretches between loop
boundaries: code before a loop, the loop body, code after it. Within a loop, a conditional
branch that leaves the loop before the latch splits the body: what follows it runs on every
iteration but the last (Hotspot: 97~170 twice, 171~182 once). A bounds-check guard that jumps
to a return before any memory access, barrier or loop is its own level-1 superstep (KNN:
1~14, 15~28).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perfmodel.errors import ModelInputError
from perfmodel.manybsp.classify import Classified, classify
from perfmodel.manybsp.hopper import wgmma_n
from perfmodel.manybsp.memory import WarpAccess, warp_access
from perfmodel.manybsp.types import (
    FunctionalUnit,
    InstructionCost,
    InstructionKind,
    Level1Span,
)
from perfmodel.ptx import (
    BasicBlock,
    Function,
    Instruction,
    Loop,
    build_cfg,
    find_loops,
    tid_x_stride_bytes,
)
from perfmodel.ptx.linear import LinearForm, LinearValues
from perfmodel.ptx.roles import WarpRole


@dataclass(frozen=True)
class ClassFigures:
    """A device's row of Tables 1-5..1-7 for one instruction class."""

    fu: FunctionalUnit
    units_per_ws: int
    throughput_per_ws: float
    latency_cycles: float


@dataclass(frozen=True)
class LaunchContext:
    """What the launch tells the front end on devices with 32-byte sectors (Volta and
    later): register values for this block/grid shape and these kernel arguments, and the
    cache figures of the hit model (docs/model-notes.md, "Memory of today's GPUs")."""

    values: LinearValues
    block: tuple[int, int, int]
    grid: tuple[int, int, int]
    sector_bytes: int | None = None  #: None: the paper's 128-byte segment model alone
    l2_hit_latency_cycles: float | None = None
    l2_cache_bytes: int | None = None


@dataclass(frozen=True)
class FrontEndResult:
    costs: tuple[InstructionCost, ...]
    spans: tuple[Level1Span, ...]
    class_keys: tuple[str, ...]
    n_ma_inferred: tuple[bool, ...]  # True where n_ma came from the stride, not an override
    warnings: tuple[str, ...]
    loop_headers: frozenset[str] = frozenset()  #: loops of the analysed code, by header label
    #: per row: 32-byte sectors a warp's access moves (0: no memory access, or no sector model)
    sectors: tuple[int, ...] = ()
    #: per row: where a global load is served from by the hit model ("L1", "L2" or "")
    cache_level: tuple[str, ...] = ()


#: class key reported for an instruction the device figures cannot cost
UNCOSTED = "uncosted"

#: the ``wgmma_mma_async`` figures of a profile are for the m64n8kK shape: a warp's share of
#: m64nNkK is N/8 times that work (same K x element bits, 256, for every wgmma type)
_WGMMA_FIGURE_N = 8


_FALLBACK_CLASS = {
    InstructionKind.GLOBAL_MEMORY: "ld_global",
    InstructionKind.SHARED_MEMORY: "ld_shared",
}


def _access_bytes(ins: Instruction) -> int:
    width = 4
    for m in ins.modifiers:
        if m[:1] in "fubs" and m[1:].isdigit():
            width = max(1, int(m[1:]) // 8)
    for m in ins.modifiers:
        if m in ("v2", "v4", "v8"):
            width *= int(m[1:])
    return width


def _global_transactions(stride: int, width: int, segment: int, warp: int) -> int:
    """Segments one warp's access touches: consecutive threads ``stride`` bytes apart."""
    if stride == 0:
        return max(1, math.ceil(width / segment))
    span = (warp - 1) * abs(stride) + width
    return max(1, min(warp, math.ceil(span / segment)))


def _shared_transactions(stride: int) -> int:
    """Bank-conflict degree of 32 four-byte banks for a word stride (1 = conflict free)."""
    if stride == 0 or stride % 4:
        return 1
    return math.gcd(abs(stride) // 4, 32)


def build_table(
    fn: Function,
    figures: Mapping[str, ClassFigures],
    *,
    mem_lat_cycles: float,
    l1_hit_latency_cycles: float | None,
    barrier_overhead_cycles: float,
    loop_trip_counts: Mapping[str, int],
    memory_transactions: Mapping[int, int],
    segment_bytes: int,
    warp_size: int,
    role: WarpRole | None = None,
    classified: Sequence[Classified | None] | None = None,
    launch: LaunchContext | None = None,
    iterations_run: Mapping[int, tuple[int, int]] | None = None,
) -> FrontEndResult:
    """Table N-1 and the level-1 spans of ``fn``; with ``role``, of the instructions that
    role's warps execute, its fixed branches taken as fixed (perfmodel/ptx/roles.py).
    ``iterations_run``: guarded ``bra`` index -> (iterations that run the code it skips, the
    loop's trip count) (perfmodel/ptx/block_classes.py): that code's iterations are scaled.
    ``classified``: :func:`classify` of every instruction, when the caller has it already
    (one function, several roles).

    ``loop_trip_counts`` keys are checked against the loops found here only without a role
    (with roles, a key may name another role's loop: the caller checks the union)."""
    warnings: list[str] = []
    instrs = fn.instructions
    kept: list[int] = []
    classes: list[Classified] = []
    memory_lines: set[int] = set()
    if classified is None:
        classified = [classify(ins) for ins in instrs]
    for idx, ins in enumerate(instrs):
        c = classified[idx]
        if c is None:
            continue
        if c.kind in (InstructionKind.GLOBAL_MEMORY, InstructionKind.SHARED_MEMORY):
            memory_lines.add(ins.line)
        if role is not None and idx not in role.instructions:
            continue
        if c.fallback_reason:
            warnings.append(f"line {ins.line}: {c.fallback_reason}")
        kept.append(idx)
        classes.append(c)
    if not kept and role is None:
        raise ModelInputError("ptx", f"kernel {fn.name!r} has no instructions to model")

    for line, n in memory_transactions.items():
        if line not in memory_lines:
            raise ModelInputError(
                f"memory_transactions.{line}",
                f"line {line} holds no memory instruction of kernel {fn.name!r}; "
                "key the override by the line of a ld/st/atom instruction",
            )
        if n < 1:
            raise ModelInputError(f"memory_transactions.{line}", "n_ma must be >= 1")

    fixed = role.fixed_branches if role is not None else None
    spans_orig, iterations, headers = _level1(fn, loop_trip_counts, warnings, fixed, launch)
    for branch, (run, trip) in (iterations_run or {}).items():
        target = instrs[branch].branch_target
        end = fn.label_index.get(target, len(instrs)) if target is not None else branch
        for start, stop in spans_orig:
            if branch < start and stop < end:  # a span inside the code the guard skips
                iterations[start] = iterations[start] * run // trip
    pos_of = {orig: k for k, orig in enumerate(kept)}
    uncosted: dict[str, list[int]] = {}  # full opcode -> lines

    # u: first later instruction (program order) reading a register this one writes.
    uses_at: dict[str, list[int]] = {}
    for k, orig in enumerate(kept):
        for r in instrs[orig].uses:
            uses_at.setdefault(r, []).append(k)

    costs: list[InstructionCost] = []
    keys: list[str] = []
    inferred: list[bool] = []
    sectors: list[int] = []
    levels: list[str] = []
    last_global: dict[tuple[str, ...], tuple[int, int]] = {}  # base regs -> (block id, offset)
    block_id = 0
    for k, (orig, c) in enumerate(zip(kept, classes, strict=True)):
        ins = instrs[orig]
        if ins.labels or (k and instrs[kept[k - 1]].is_branch):
            block_id += 1
        key = c.class_key
        kind = c.kind
        sectors.append(0)
        levels.append("")
        if key not in figures and c.quiet_fallback:
            # the first of the finer rows' fallbacks the device has (the last one otherwise,
            # which then takes the warned fallback below)
            key = next((k for k in c.quiet_fallback if k in figures), c.quiet_fallback[-1])
        elif key not in figures and c.noted_fallback is not None:
            key = c.noted_fallback[0]
            warnings.append(f"line {ins.line}: {c.noted_fallback[1]}")
        if key not in figures and c.uncosted_without_figures:
            uncosted.setdefault(ins.full_opcode, []).append(ins.line)
            costs.append(
                InstructionCost(
                    line=ins.line,
                    opcode=ins.full_opcode,
                    fu=FunctionalUnit.NONE,
                    kind=InstructionKind.UNCOSTED,
                    units_per_ws=warp_size,  # unused: one issue slot (block.py)
                    throughput_per_ws=float(warp_size),  # unused: occupies no unit
                    latency_cycles=0.0,
                    consumer=None,
                )
            )
            keys.append(UNCOSTED)
            inferred.append(False)
            continue
        if key not in figures and kind is not InstructionKind.BARRIER:
            fallback = _FALLBACK_CLASS.get(kind, "alu")
            if key.startswith("st_"):
                fallback = key  # required classes: always present
            warnings.append(
                f"line {ins.line}: the device profile has no {key!r} figures; costed as {fallback}"
            )
            key = fallback
        consumer = None
        for r in ins.defs:
            lst = uses_at.get(r, [])
            j = bisect.bisect_right(lst, k)
            if j < len(lst) and (consumer is None or lst[j] < consumer):
                consumer = lst[j]
        n_ma = 1
        was_inferred = False
        latency: float
        if kind is InstructionKind.BARRIER:
            fig = figures.get("alu")
            assert fig is not None  # required class, checked when the device is built
            costs.append(
                InstructionCost(
                    line=ins.line,
                    opcode=ins.full_opcode,
                    fu=FunctionalUnit.MI,
                    kind=kind,
                    units_per_ws=fig.units_per_ws,
                    throughput_per_ws=fig.throughput_per_ws,
                    latency_cycles=0.0,
                    consumer=consumer,
                    barrier_overhead_cycles=barrier_overhead_cycles,
                )
            )
            keys.append("bar_sync")
            inferred.append(False)
            continue
        fig = figures[key]
        latency = fig.latency_cycles
        throughput = fig.throughput_per_ws
        if key == "wgmma_mma_async":
            throughput *= _WGMMA_FIGURE_N / (wgmma_n(ins) or _WGMMA_FIGURE_N)
        if kind in (InstructionKind.GLOBAL_MEMORY, InstructionKind.SHARED_MEMORY):
            if ins.line in memory_transactions:
                n_ma = memory_transactions[ins.line]
            elif c.n_ma is not None:
                n_ma = c.n_ma  # fixed by the opcode (ldmatrix/stmatrix: one per matrix)
            elif launch is not None and launch.sector_bytes:
                was_inferred = True
                access = _launch_access(ins, launch, segment_bytes, warp_size)
                if access is None:
                    pass
                elif kind is InstructionKind.GLOBAL_MEMORY:
                    n_ma = access.lines
                    sectors[-1] = access.sectors
                elif key == "ld_const":
                    n_ma = access.distinct
                else:
                    n_ma = access.bank_degree
                if access is not None and access.assumed_uniform_part:
                    warnings.append(
                        f"line {ins.line}: the address of {ins.full_opcode} depends on loaded "
                        "or non-affine values that differ between threads; taken as the same "
                        "for a warp's threads (override n_ma in memory_transactions)"
                    )
            else:
                stride = tid_x_stride_bytes(fn, orig)
                was_inferred = True
                if stride is None:
                    warnings.append(
                        f"line {ins.line}: cannot relate the address of {ins.full_opcode} to "
                        "%tid.x; assuming 1 memory transaction per warp (override it in "
                        "memory_transactions)"
                    )
                elif kind is InstructionKind.GLOBAL_MEMORY:
                    n_ma = _global_transactions(
                        stride, _access_bytes(ins), segment_bytes, warp_size
                    )
                else:
                    n_ma = _shared_transactions(stride)
            if kind is InstructionKind.GLOBAL_MEMORY:
                latency = mem_lat_cycles if key != "ld_global_nc" else fig.latency_cycles
                hit = _l1_hit(ins, block_id, last_global, segment_bytes)
                level = (
                    _reuse_level(ins, launch, l1_hit_latency_cycles)
                    if launch is not None
                    and launch.sector_bytes
                    and not hit
                    and c.class_key.startswith("ld_global")
                    else ""
                )
                if level == "L1" and l1_hit_latency_cycles is not None:
                    # every warp of the block reads the same address: the first one brings
                    # the line, the others (and the block's later loads) hit L1
                    kind = InstructionKind.SHARED_MEMORY
                    latency = l1_hit_latency_cycles
                    levels[-1] = "L1"
                elif level == "L2" and launch is not None and launch.l2_hit_latency_cycles:
                    latency = launch.l2_hit_latency_cycles
                    levels[-1] = "L2"
                if hit and l1_hit_latency_cycles is not None and key == "ld_global":
                    # Table 3-1 row 23: a load of the line an earlier load of this block
                    # fetched hits L1 and costs a computational latency, no comm.
                    kind = InstructionKind.SHARED_MEMORY
                    latency = l1_hit_latency_cycles
                    levels[-1] = "L1"
        costs.append(
            InstructionCost(
                line=ins.line,
                opcode=ins.full_opcode,
                fu=fig.fu,
                kind=kind,
                units_per_ws=fig.units_per_ws,
                throughput_per_ws=throughput,
                latency_cycles=latency,
                consumer=consumer,
                n_ma=n_ma,
            )
        )
        keys.append(key)
        inferred.append(was_inferred)

    for opcode, lines in uncosted.items():
        shown = ", ".join(str(x) for x in lines[:5]) + (", ..." if len(lines) > 5 else "")
        warnings.append(
            f"uncosted: {opcode} ({len(lines)} x, lines {shown}): the device figures have no "
            "row for it and no public source gives one (docs/model-notes.md, Hopper "
            "instructions); each counts one issue slot, its latency and throughput are not "
            "in the prediction"
        )
    spans: list[Level1Span] = []
    for s_orig, e_orig in spans_orig:
        ks = [pos_of[i] for i in range(s_orig, e_orig + 1) if i in pos_of]
        if not ks:
            continue
        spans.append(Level1Span(start=ks[0], end=ks[-1], iterations=iterations[s_orig]))
    return FrontEndResult(
        costs=tuple(costs),
        spans=tuple(spans),
        class_keys=tuple(keys),
        n_ma_inferred=tuple(inferred),
        warnings=tuple(warnings),
        loop_headers=headers,
        sectors=tuple(sectors),
        cache_level=tuple(levels),
    )


def _l1_hit(
    ins: Instruction,
    block_id: int,
    seen: dict[tuple[str, ...], tuple[int, int]],
    segment: int,
) -> bool:
    addr = next((o for o in ins.operands if o.kind == "address"), None)
    if addr is None or ins.opcode != "ld":
        return False
    regs = tuple(addr.registers)
    prev = seen.get(regs)
    seen[regs] = (block_id, addr.offset)
    return prev is not None and prev[0] == block_id and abs(prev[1] - addr.offset) < segment


def _level1(
    fn: Function,
    trip_counts: Mapping[str, int],
    warnings: list[str],
    fixed: Mapping[int, bool] | None = None,
    launch: LaunchContext | None = None,
) -> tuple[list[tuple[int, int]], dict[int, int], frozenset[str]]:
    """Level-1 spans (inclusive instruction indices of ``fn``), each span's iterations keyed
    by the span's first index, and the loop headers; ``fixed`` branch directions as in
    :func:`~perfmodel.ptx.build_cfg` (then unknown ``trip_counts`` keys are not refused)."""
    instrs = fn.instructions
    n = len(instrs)
    blocks = build_cfg(fn, fixed)
    loops = find_loops(fn, blocks, *_known_values(launch))
    block_of = [0] * n
    for bb in blocks:
        for i in range(bb.start, bb.end):
            block_of[i] = bb.index
    known = {lp.header_label for lp in loops}
    for label, count in trip_counts.items():
        if label not in known and fixed is None:
            raise ModelInputError(
                f"loop_trip_counts.{label}",
                f"no loop of kernel {fn.name!r} has header {label!r}; loop headers: "
                + (", ".join(sorted(known)) or "none"),
            )
        if count < 0:
            raise ModelInputError(f"loop_trip_counts.{label}", "a trip count must be >= 0")

    trips: dict[str, int] = {}
    for lp in loops:
        if lp.header_label in trip_counts:
            trips[lp.header_label] = trip_counts[lp.header_label]
        elif lp.inferred_trip_count is not None:
            trips[lp.header_label] = lp.inferred_trip_count
        else:
            trips[lp.header_label] = 1
            needs = _loop_parameters(fn, blocks, lp, launch)
            warnings.append(
                f"loop {lp.header_label}: trip count unknown; assuming 1 iteration "
                + (
                    f"(its bound depends on kernel parameter {', '.join(needs)}: give "
                    + " and ".join(f"kernel_args.{p}" for p in needs)
                    + ", or give it in loop_trip_counts)"
                    if needs
                    else "(give it in loop_trip_counts)"
                )
            )

    # Per instruction: the loops containing it, and whether it follows an early exit.
    loops_of_block: list[list[Loop]] = [[] for _ in blocks]
    header_of_block: dict[int, list[Loop]] = {}
    for lp in loops:
        for member in lp.blocks:
            loops_of_block[member].append(lp)
        header_of_block.setdefault(lp.header_block, []).append(lp)
    # One key per basic block: keys change only at block boundaries (loop entry/exit, the
    # block after an exit branch or a guard), so consecutive blocks with equal keys form a span.
    Key = tuple[int, tuple[tuple[str, bool], ...]]
    key_of: list[Key] = []
    after_exit: dict[str, bool] = {}
    guard_region = 0
    guard_open = True  # no memory access, barrier or loop seen yet
    for bb in blocks:
        inside = loops_of_block[bb.index]
        for lp in header_of_block.get(bb.index, ()):
            after_exit[lp.header_label] = False
        if guard_open:
            guard_open = not inside and not any(
                ins.state_space not in (None, "param") or ins.opcode in ("bar", "barrier")
                for ins in instrs[bb.start : bb.end]
            )
        key_of.append(
            (
                guard_region,
                tuple((lp.header_label, after_exit.get(lp.header_label, False)) for lp in inside),
            )
        )
        last = instrs[bb.end - 1]
        target = last.branch_target
        if fixed and bb.end - 1 in fixed:
            target = None  # always goes one way for these warps: the CFG has one edge
        if last.guard is not None and target is not None:
            t_idx = fn.label_index.get(target, n)
            for lp in inside:
                leaves = t_idx >= n or block_of[t_idx] not in lp.blocks
                if leaves and bb.index != lp.latch_block:
                    after_exit[lp.header_label] = True
            if guard_open and _returns_only(instrs, t_idx):
                guard_region += 1
                guard_open = False

    spans: list[tuple[int, int]] = []
    iterations: dict[int, int] = {}
    first = 0
    for k in range(1, len(blocks) + 1):
        if k == len(blocks) or key_of[k] != key_of[first]:
            start, end = blocks[first].start, blocks[k - 1].end - 1
            spans.append((start, end))
            its = 1
            for label, exited in key_of[first][1]:
                t = trips[label]
                its *= max(0, t - 1) if exited else t
            iterations[start] = its
            first = k
    return spans, iterations, frozenset(known)


def _returns_only(instrs: Sequence[Instruction], idx: int) -> bool:
    """True when the instructions from ``idx`` on are only ``ret``/``exit``."""
    if idx >= len(instrs):
        return True
    return instrs[idx].opcode in ("ret", "exit")


def _known_values(
    launch: LaunchContext | None,
) -> tuple[Callable[[str], int | None] | None, Callable[[Instruction, int], int | None] | None]:
    """Block-uniform values the launch fixes, of a register and of an instruction's result
    (None, None: nothing known)."""
    if launch is None:
        return None, None
    values = launch.values

    def uniform(f: LinearForm) -> int | None:
        return f.const if f.known and not f.coefs else None

    def known(reg: str) -> int | None:
        return uniform(values.register(reg))

    def known_def(ins: Instruction, index: int) -> int | None:
        return uniform(values.definition(ins, index))

    return known, known_def


def _loop_parameters(
    fn: Function, blocks: Sequence[BasicBlock], loop: Loop, launch: LaunchContext | None
) -> list[str]:
    """Kernel parameters the exit comparisons of ``loop`` depend on and were not given."""
    if launch is None:
        return []
    instrs = fn.instructions
    needs: set[str] = set()
    for b in loop.blocks:
        last = instrs[blocks[b].end - 1]
        if last.guard is None or not last.is_branch:
            continue
        for i in range(blocks[b].end - 2, blocks[b].start - 1, -1):
            if last.guard in instrs[i].defs:
                for o in instrs[i].operands[1:]:
                    needs |= launch.values.operand(o).params
                break
    return sorted(needs)


def _launch_access(
    ins: Instruction, launch: LaunchContext, segment_bytes: int, warp_size: int
) -> WarpAccess | None:
    form = launch.values.address(ins)
    if form is None or not launch.sector_bytes:
        return None
    return warp_access(
        form, _access_bytes(ins), launch.block, warp_size, segment_bytes, launch.sector_bytes
    )


def _reuse_level(
    ins: Instruction, launch: LaunchContext | None, l1_hit_latency_cycles: float | None
) -> str:
    """Where a global load re-read by other threads is served from (docs/model-notes.md,
    "Memory of today's GPUs"): "L1" when every thread of the block reads the same address
    (a filter tap, a per-channel constant), "L2" when the address does not depend on some
    block index of a multi-block grid axis (the blocks along it re-read the same bytes) and
    the data those blocks share fits in L2; "" otherwise (a DRAM access)."""
    if launch is None:
        return ""
    form = launch.values.address(ins)
    if form is None:
        return ""
    tid = {"tid.x", "tid.y", "tid.z"}
    deps = form.symbols
    if not deps & tid and l1_hit_latency_cycles is not None:
        return "L1"
    shared_axes = [
        a for a, n in zip("xyz", launch.grid, strict=True) if n > 1 and f"ctaid.{a}" not in deps
    ]
    if not shared_axes or launch.l2_cache_bytes is None:
        return ""
    # bytes the re-reading blocks share: one block's footprint of this load, over the grid
    # axes the address does depend on
    per_block = _access_bytes(ins) * launch.block[0] * launch.block[1] * launch.block[2]
    spread = 1
    for a, n in zip("xyz", launch.grid, strict=True):
        if f"ctaid.{a}" in deps:
            spread *= n
    return "L2" if per_block * spread <= launch.l2_cache_bytes else ""
