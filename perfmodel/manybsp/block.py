"""The BLOCK data structure and the level-1/level-2 supersteps (many-bsp-supplementary.txt §1,
Step 3-4, eq. 6-9; Tables N-2 and N-3 of the worked examples).

Rules, as read off the worked tables (docs/model-notes.md, "Many-BSP"):

* ``w`` (eq. 6) warps share one warp scheduler; each row is the cost of those ``w`` warps.
* issue: ``w x issue_cycle x ceil(warp_size / n_fu)`` cycles (2 for an SP instruction with
  w = 2, 4 for LDST with 16 units). With two dispatch units per scheduler (n_du / n_ws >= 2)
  an instruction on another unit issues in the shadow of a multi-cycle issue (blank issue
  cells after LDST/SFU/DPU rows of Table 2-2).
* FU occupancy: ``w x warp_size/T_i`` cycles, or ``latency + (w-1) x warp_size/T_i`` when the
  latency is exposed ("16+1", "41+2", "16+7" cells): the instruction opens a level-2
  superstep after a d = 1 stall or a barrier, after an eq. (8) stall on devices whose tables
  show it (``ManyBspDevice.latency_exposed_after_eq8_stall``), or after a branch whose
  superstep is shorter than its latency; or it is the first shared-memory/L1 access of its
  superstep. Shared accesses occupy
  LDST ``n_ma`` times (bank-conflict replays).
* global memory: ``comm = w x n_ma x mem_lat``; no FU occupancy (Table 2-2, rows 42/51/196).
* sync (eq. 7-8): a consumer right after its producer (d = 1) waits the producer's
  occupancy; a later consumer waits what eq. (8) says is left after the instructions between;
  a guarded branch or a barrier syncs 1. A positive sync closes the level-2 superstep.
* comp of a level-2 superstep: eq. (9); level-1 comp/comm/ovh are the sums over the level-2
  supersteps and rows they contain (Table 2-3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perfmodel.manybsp.types import (
    UNIT_COLUMNS,
    BlockAnalysis,
    BlockRow,
    FunctionalUnit,
    InstructionCost,
    InstructionKind,
    Level1Span,
    ManyBspDevice,
    Superstep,
)

_SYNC_ONLY = 1.0  # sync of a guarded branch or a barrier (Tables 2-2, 3-2, 4-2)
_COLUMN = {unit: k for k, unit in enumerate(UNIT_COLUMNS)}


def warps_per_scheduler(n_t: int, device: ManyBspDevice) -> int:
    """eq. (6): w = ceil(n_t / (warp_size x n_ws))."""
    return max(1, math.ceil(n_t / (device.warp_size * device.n_ws)))


def _unit_col(cost: InstructionCost) -> int:
    """Column FU1..FU4 (0..3) the row occupies; -1 for comm and barriers."""
    if cost.kind in (InstructionKind.GLOBAL_MEMORY, InstructionKind.BARRIER):
        return -1
    return _COLUMN.get(cost.fu, -1)


def _x(cost: InstructionCost, device: ManyBspDevice) -> float:
    """warp_size / T_i: cycles one warp occupies the unit (the '32/T_i' column)."""
    return device.warp_size / cost.throughput_per_ws


def _base_issue(cost: InstructionCost, w: int, device: ManyBspDevice) -> float:
    if cost.kind in (InstructionKind.BARRIER, InstructionKind.UNCOSTED):
        # an uncosted instruction still takes its issue slot (docs/model-notes.md, "Hopper")
        return w * device.issue_cycle
    return w * device.issue_cycle * math.ceil(device.warp_size / cost.units_per_ws)


def _replays(cost: InstructionCost) -> int:
    return cost.n_ma if cost.kind is InstructionKind.SHARED_MEMORY else 1


def _occupancy(cost: InstructionCost, w: int, device: ManyBspDevice, exposed: bool) -> float:
    x = _x(cost, device) * _replays(cost)
    if exposed:
        return cost.latency_cycles + (w - 1) * x
    return w * x


def validate_table(costs: Sequence[InstructionCost], spans: Sequence[Level1Span]) -> None:
    """Refuse tables the BLOCK construction cannot evaluate (message says how to fix it)."""
    for c in costs:
        if c.throughput_per_ws <= 0 or c.units_per_ws <= 0:
            raise ValueError(f"line {c.line}: throughput and unit count must be positive")
        if c.latency_cycles < 0 or c.n_ma < 1:
            raise ValueError(f"line {c.line}: latency must be >= 0 and n_ma >= 1")
    expected = 0
    for s in spans:
        if s.start != expected or s.end < s.start or s.iterations < 0:
            raise ValueError("level-1 spans must tile the instruction table in order")
        expected = s.end + 1
    if expected != len(costs):
        raise ValueError("level-1 spans must cover every instruction of the table")


def analyse_block(
    costs: Sequence[InstructionCost],
    spans: Sequence[Level1Span],
    n_t: int,
    device: ManyBspDevice,
) -> BlockAnalysis:
    """Build the BLOCK table and its supersteps for one thread block of ``n_t`` threads."""
    validate_table(costs, spans)
    w = warps_per_scheduler(n_t, device)
    n = len(costs)
    dual_issue = device.n_du >= 2 * device.n_ws
    base_issue = [_base_issue(c, w, device) for c in costs]
    span_of = [0] * n
    for k, s in enumerate(spans):
        for i in range(s.start, s.end + 1):
            span_of[i] = k

    issue = list(base_issue)
    for i in range(1, n):
        prev, cur = costs[i - 1], costs[i]
        # Dual issue: the second dispatch unit issues an instruction on another unit while
        # a multi-cycle issue (LDST/SFU/DPU, 32/n_fu > 1) is still dispatching.
        if (
            dual_issue
            and span_of[i] == span_of[i - 1]
            and base_issue[i - 1] > w * device.issue_cycle
            and prev.kind not in (InstructionKind.BARRIER, InstructionKind.BRANCH)
            and cur.kind not in (InstructionKind.BARRIER, InstructionKind.BRANCH)
            and prev.fu != cur.fu
            and issue[i - 1] > 0
        ):
            issue[i] = 0.0

    # Definite superstep ends: d = 1 producers, guarded branches, barriers, span ends.
    definite = [False] * n
    for i, c in enumerate(costs):
        if c.kind in (InstructionKind.BRANCH, InstructionKind.BARRIER):
            definite[i] = True
        elif c.consumer == i + 1 and c.kind is not InstructionKind.UNCOSTED:
            definite[i] = True
        if i == spans[span_of[i]].end:
            definite[i] = True
    # next_definite[i]: first k >= i with a definite end (n when none), so "no definite end
    # between i and j" is one comparison.
    next_definite = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        next_definite[i] = i if definite[i] else next_definite[i + 1]

    rows: list[BlockRow] = []
    # each row occupies at most one unit: its column (-1: none) and cycles
    fu_col = [_unit_col(c) for c in costs]
    fu_val = [0.0] * n
    sync = [0.0] * n
    level2: list[Superstep] = []
    start = 0
    # running sums of the open level-2 superstep, for eq. (9)
    open_issue = 0.0
    open_fu = [0.0, 0.0, 0.0, 0.0]
    open_comm = open_ovh = 0.0
    # Why the previous level-2 superstep closed decides whether this one opens with the
    # instruction's latency exposed (see module docstring).
    exposure_limit: float | None = None  # None: exposed; else exposed iff latency > limit
    for i, c in enumerate(costs):
        if i == start:
            exposed = exposure_limit is None or c.latency_cycles > exposure_limit
            ldst_seen = False
        else:
            exposed = False
        if c.kind is InstructionKind.SHARED_MEMORY and not ldst_seen:
            # The first on-chip access of a superstep finds the LDST pipeline cold: its
            # latency shows even when it does not open the superstep (Table 3-2 row 23
            # "32+6"; Tables 4-2/7-2 rows 47, 50, ... "16+28").
            exposed = True
        if c.fu is FunctionalUnit.LDST:
            ldst_seen = True
        col = fu_col[i]
        comm = 0.0
        if c.kind is InstructionKind.GLOBAL_MEMORY:
            comm = w * c.n_ma * c.latency_cycles
        elif col >= 0:
            fu_val[i] = _occupancy(c, w, device, exposed)
        ovh = c.barrier_overhead_cycles if c.kind is InstructionKind.BARRIER else 0.0

        eq8_stall = False
        if c.kind in (InstructionKind.BRANCH, InstructionKind.BARRIER):
            sync[i] = _SYNC_ONLY
        elif c.kind is InstructionKind.UNCOSTED:
            pass  # its latency is unknown: no wait is invented for its consumer
        elif c.consumer is not None and c.consumer == i + 1:
            # d = 1: the next instruction waits the whole occupancy (a global load: 1).
            sync[i] = fu_val[i] if col >= 0 else _SYNC_ONLY
        elif (
            col >= 0
            and c.consumer is not None
            and c.consumer > i + 1
            and span_of[c.consumer] == span_of[i]
            and next_definite[i] >= c.consumer
        ):
            sync[i] = _eq8_wait(costs, issue, fu_col, fu_val, w, device, start, i, c.consumer)
            eq8_stall = sync[i] > 0
        cycles = [0.0, 0.0, 0.0, 0.0]
        if col >= 0:
            cycles[col] = fu_val[i]
        rows.append(
            BlockRow(
                index=i,
                issue_cycles=issue[i],
                fu_cycles=(cycles[0], cycles[1], cycles[2], cycles[3]),
                comm_cycles=comm,
                ovh_cycles=ovh,
                sync_cycles=sync[i],
                latency_exposed=exposed and col >= 0,
            )
        )
        if i > start:
            open_issue += issue[i]
        if col >= 0:
            open_fu[col] += fu_val[i]
        open_comm += comm
        open_ovh += ovh
        if sync[i] > 0 or i == spans[span_of[i]].end:
            # eq. (9): comp = issue of the first row + max(issue of the rest, busiest unit)
            level2.append(
                Superstep(
                    start=start,
                    end=i,
                    comp_cycles=issue[start] + max(open_issue, max(open_fu)),
                    comm_cycles=open_comm,
                    ovh_cycles=open_ovh,
                )
            )
            open_issue = open_comm = open_ovh = 0.0
            open_fu = [0.0, 0.0, 0.0, 0.0]
            if c.kind in (InstructionKind.BRANCH, InstructionKind.UNIFORM_BRANCH):
                # The instruction after a branch is fetched while the branch's superstep
                # runs: a latency no longer than that superstep's comp is covered (Table 2-2
                # rows 37, 105, 124: "2"; Table 7-2 row 145, mov %ctaid 27 <= 28: "8");
                # longer ones show (div.rn "139+2"/"137+4" in Tables 2-2/5-2 row 59; Table
                # 4-2 row 145, 32 > 31: "32+7").
                exposure_limit = level2[-1].comp_cycles
            elif (
                eq8_stall
                and not device.latency_exposed_after_eq8_stall
                and i != spans[span_of[i]].end
            ):
                # eq. (8) counts the issue of rows i+1..j-1 inside the producer's run, so
                # the next row starts warm where the device's tables say so (Table 5-2 rows
                # 39, 60 "8"; Table 2-2 row 60 "419+2" says otherwise on the GTX 760).
                exposure_limit = math.inf
            else:
                # A d = 1 stall, a barrier or a level-1 boundary: the next instruction starts
                # cold (Table 2-2 rows 9, 13, 18, ...).
                exposure_limit = None
            start = i + 1

    level1 = []
    k = 0
    for s in spans:
        inside = []
        while k < len(level2) and level2[k].end <= s.end:
            inside.append(level2[k])
            k += 1
        level1.append(
            Superstep(
                start=s.start,
                end=s.end,
                comp_cycles=sum(t.comp_cycles for t in inside),
                comm_cycles=sum(t.comm_cycles for t in inside),
                ovh_cycles=sum(t.ovh_cycles for t in inside),
                iterations=s.iterations,
            )
        )
    return BlockAnalysis(rows=tuple(rows), level1=tuple(level1), level2=tuple(level2), w=w)


def _eq8_wait(
    costs: Sequence[InstructionCost],
    issue: Sequence[float],
    fu_col: Sequence[int],
    fu_val: Sequence[float],
    w: int,
    device: ManyBspDevice,
    l: int,  # noqa: E741 - the paper's name for the superstep's first instruction
    i: int,
    j: int,
) -> float:
    """eq. (8): what consumer j still waits for producer i on its unit, 0 when eq. (7) holds.

    Instructions between i and j are not yet in the table; they take their unexposed
    occupancy (no definite superstep end lies between them, so none is exposed).
    """
    x = fu_col[i]

    def occ(k: int, y: int) -> float:
        if fu_col[k] != y:
            return 0.0
        return fu_val[k] if k <= i else _occupancy(costs[k], w, device, False)

    lhs = sum(occ(k, x) for k in range(l, i + 1))
    issued = sum(issue[k] for k in range(l + 1, j))
    others = max((sum(occ(k, y) for k in range(l, j - 1)) for y in range(4) if y != x), default=0.0)
    return max(0.0, lhs - (issued + others))
