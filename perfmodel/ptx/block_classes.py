"""Block classes: which blocks of a grid run which part of the kernel.

Eq. (22)-(25) of many-bsp-supplementary.txt treat the grid as n_b identical blocks. A kernel
whose grid is larger than its data (a tiled kernel launched with one block per element, a
bounds check ``if (x < n)``) has blocks that leave at once, or skip a tile, because a guard
compares a block-dependent index with a bound. With the launch known
(:class:`~perfmodel.ptx.linear.LinearValues`) such a guard is evaluated for every block: its
compared value is ``c + sum(coef x tid) + k x ctaid.A`` for one grid axis A, so over a block's
threads it ranges between two corners, and the branch goes one way for all of them, the other
way for all, or both ways (then both sides stay in the class, as for any data-dependent
branch). Blocks with the same branch directions form a class; :func:`block_classes` returns
each class's block count, its fixed branches and the instructions it reaches.

A guard on a loop's index (a tile loop: ``if (x + ti * stride < n)``) goes one way in some
iterations and the other way in the rest. For a guard of one comparison on a loop of known
trip count, the iterations in which some thread of each warp runs the guarded code are
counted (the compared value is linear in the iteration, so each iteration's range over a
warp's threads is two corners): the class keeps the warps that run it and their
warp-iterations; the caller evaluates those warps only and scales the guarded code's
iterations by their share. A guard of one comparison outside any counted loop (a tile loop
nvcc unrolled) is counted the same way, as one iteration.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from perfmodel.ptx.cfg import _COMPARE, BasicBlock, Loop, build_cfg, find_loops
from perfmodel.ptx.ir import Function, Instruction
from perfmodel.ptx.linear import ITER, LinearForm, LinearValues
from perfmodel.ptx.roles import _reachable

__all__ = ["BlockClass", "block_classes"]

_TID = ("tid.x", "tid.y", "tid.z")
_CTAID = ("ctaid.x", "ctaid.y", "ctaid.z")
#: most grid values per axis evaluated one by one (beyond: the branch is left open)
_MAX_AXIS = 1 << 20
#: longest loop whose iterations a guard is evaluated in one by one (beyond: left open)
_MAX_TRIP = 256


@dataclass(frozen=True)
class BlockClass:
    blocks: int  #: blocks of the grid in the class
    fixed_branches: Mapping[int, bool]  #: guarded ``bra`` index -> direction (True: taken)
    instructions: frozenset[int]  #: indices of the instructions the class can execute
    #: guarded ``bra`` index -> (warp-iterations that run the code it skips, the class's
    #: warps (``active_warps``) x the trip count of the loop whose index the guard compares,
    #: 1 outside a loop), for guards that hold in part of them
    iterations_run: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    #: warps of a block the class is evaluated on: the most that run code behind such a
    #: guard (the rest leave at once), every warp when other code runs on all of them; None
    #: when no guard holds in part of the warps
    active_warps: int | None = None


#: a predicate over the launch: ("leaf", index into the leaves), ("not", p),
#: ("and"/"or", p, q), or None when the evaluation cannot follow it
_Pred = tuple[object, ...] | None


def _def_of(
    fn: Function, defs: Mapping[str, list[int]], at: int, reg: str
) -> tuple[int, Instruction] | None:
    """The unguarded definition of ``reg`` nearest before ``at`` and its index (nvcc's
    predicates are defined once, just before their branch); ``defs``: each register's
    defining instructions in program order."""
    ds = defs.get(reg, ())
    k = bisect_left(ds, at)
    if not k:
        return None
    ins = fn.instructions[ds[k - 1]]
    return (ds[k - 1], ins) if ins.guard is None else None


class _Leaves:
    """The integer comparisons the branches' predicates are made of, as linear forms."""

    def __init__(self, fn: Function, values: LinearValues) -> None:
        self.fn = fn
        self.values = values
        self.leaves: list[tuple[LinearForm, str]] = []  # (a - b, comparison)
        self.defs: dict[str, list[int]] = {}
        for i, ins in enumerate(fn.instructions):
            for r in ins.defs:
                self.defs.setdefault(r, []).append(i)

    def predicate(self, at: int, reg: str, depth: int = 0) -> _Pred:
        found = _def_of(self.fn, self.defs, at, reg)
        if found is None or depth > 16:
            return None
        index, ins = found
        srcs = [o.text.lstrip("!") for o in ins.operands[1:]]
        negated = [o.text.startswith("!") for o in ins.operands[1:]]
        if ins.opcode == "setp" and len(ins.operands) == 3 and ins.modifiers:
            cmp = ins.modifiers[0]
            if cmp not in _COMPARE or any(m[:1] == "f" and m[1:].isdigit() for m in ins.modifiers):
                return None
            a, b = self.values.operands_at(ins, index)
            diff = LinearForm(
                a.const - b.const,
                {s: a.coefs.get(s, 0) - b.coefs.get(s, 0) for s in {*a.coefs, *b.coefs}},
                a.unknown or b.unknown,
            )
            if diff.unknown:
                return None
            self.leaves.append((diff, cmp))
            return ("leaf", len(self.leaves) - 1)
        if "pred" not in ins.modifiers:
            return None
        parts: list[_Pred] = []
        for src, neg in zip(srcs, negated, strict=True):
            q = self.predicate(index, src, depth + 1) if src.startswith("%") else None
            parts.append(("not", q) if neg and q is not None else q)
        if ins.opcode == "not" and len(parts) == 1 and parts[0] is not None:
            return ("not", parts[0])
        if ins.opcode in ("and", "or") and len(parts) == 2 and None not in parts:
            return (ins.opcode, parts[0], parts[1])
        if ins.opcode == "mov" and len(parts) == 1:
            return parts[0]
        return None


def _evaluate(pred: _Pred, leaf: list[bool | None]) -> bool | None:
    """Three-valued: True/False for every thread of the block, None for some."""
    if pred is None:
        return None
    kind = pred[0]
    if kind == "leaf":
        index = pred[1]
        assert isinstance(index, int)
        return leaf[index]
    if kind == "not":
        v = _evaluate(pred[1], leaf)  # type: ignore[arg-type]
        return None if v is None else not v
    a = _evaluate(pred[1], leaf)  # type: ignore[arg-type]
    b = _evaluate(pred[2], leaf)  # type: ignore[arg-type]
    if kind == "and":
        if a is False or b is False:
            return False
        return True if a and b else None
    if a is True or b is True:
        return True
    return False if a is False and b is False else None


def _outcomes(
    diff: LinearForm, cmp: str, block: tuple[int, int, int], axis_values: range | None, axis: str
) -> list[bool | None]:
    """``diff cmp 0`` for all threads of a block (True/False) or some (None), per value of
    the block index on ``axis`` (one entry when the guard does not depend on it)."""
    lo = hi = diff.const
    for s, ext in zip(_TID, block, strict=True):
        v = diff.coefs.get(s, 0) * (ext - 1)
        lo += min(0, v)
        hi += max(0, v)
    k = diff.coefs.get(axis, 0) if axis_values is not None else 0
    rel = _COMPARE[cmp]
    # a guard on an induction variable (a tile loop's index) is evaluated at the first
    # iteration; its outcome holds for every iteration only where the compared value moves
    # away from the bound as the loop runs
    steps = {v > 0 for s, v in diff.coefs.items() if s.startswith(ITER) and v}
    rising = steps.pop() if len(steps) == 1 else None
    out: list[bool | None] = []
    for v in axis_values if axis_values is not None else range(1):
        a, b = lo + k * v, hi + k * v
        if cmp in ("eq", "ne"):
            if a == b:
                out.append(rel(a, 0))
            elif a <= 0 <= b:
                out.append(None)
            else:
                out.append(cmp == "ne")
            continue
        ra, rb = rel(a, 0), rel(b, 0)
        out.append(ra if ra == rb else None)
    if any(s.startswith(ITER) for s in diff.coefs) and (rising is None or cmp in ("eq", "ne")):
        return [None] * len(out)  # iterations move the value both ways, or across the bound
    if rising is not None:
        upward = cmp in ("gt", "ge", "hi", "hs")
        downward = cmp in ("lt", "le", "lo", "ls")
        keeps = {True: (upward and rising) or (downward and not rising)}
        keeps[False] = (upward and not rising) or (downward and rising)
        out = [o if o is not None and keeps[o] else None for o in out]
    return out


def _warp_corners(diff: LinearForm, block: tuple[int, int, int]) -> list[tuple[int, int]]:
    """Per warp of a block (linear thread id // 32), the least and greatest value of
    ``diff``'s thread part plus constant over its threads."""
    import numpy as np  # loaded in the worker that analyses, not by importers of render

    n_t = block[0] * block[1] * block[2]
    linear = np.arange(n_t, dtype=np.int64)
    tid = (linear % block[0], linear // block[0] % block[1], linear // (block[0] * block[1]))
    part = np.full(n_t, diff.const, dtype=np.int64)
    for s, t in zip(_TID, tid, strict=True):
        part += diff.coefs.get(s, 0) * t
    return [
        (int(part[lo : lo + 32].min()), int(part[lo : lo + 32].max())) for lo in range(0, n_t, 32)
    ]


def _iterations_run(
    diff: LinearForm,
    cmp: str,
    block: tuple[int, int, int],
    axis_values: range | None,
    axis: str,
    counter: str | None,
    trip: int,
    runs_when: bool,
) -> list[tuple[int, int]]:
    """Per value of the block index on ``axis`` (one entry when the guard does not depend on
    it): (warp-iterations, warps) that run the code the guard skips. A warp runs it in
    iteration ``t`` in ``[0, trip)`` of the loop whose index is ``counter`` when some thread
    of the warp has ``(diff cmp 0) == runs_when``. The compared value is linear in ``t``, so
    over a warp's threads it ranges between two corners shifted by ``step x t``; the
    comparison is monotone, so some thread satisfies it when a corner does."""
    import numpy as np  # loaded in the worker that analyses, not by importers of render

    k = diff.coefs.get(axis, 0) if axis_values is not None else 0
    step = diff.coefs[counter] if counter is not None else 0
    rel = _COMPARE[cmp]
    v = np.arange(axis_values.start, axis_values.stop) if axis_values is not None else np.zeros(1)
    base = k * v.astype(np.int64)
    count = np.zeros(v.size, dtype=np.int64)
    warps = np.zeros(v.size, dtype=np.int64)
    for lo, hi in _warp_corners(diff, block):
        mine = np.zeros(v.size, dtype=np.int64)
        for t in range(trip):
            low, high = base + (lo + step * t), base + (hi + step * t)
            mine += (rel(low, 0) == runs_when) | (rel(high, 0) == runs_when)  # type: ignore[arg-type]
        count += mine
        warps += mine > 0
    return list(zip(count.tolist(), warps.tolist(), strict=True))


class _LoopIndex:
    """The loops of ``fn``, each instruction's basic block and each register's defining
    instructions, built once per function (the first counted guard asks) and shared by every
    guard: :func:`_trip_of` per guard would rescan the function and its loops each time."""

    def __init__(self, fn: Function, blocks: Sequence[BasicBlock]) -> None:
        self._fn = fn
        self._blocks = blocks
        self._built = False
        self.loops: tuple[Loop, ...] = ()
        self.block_of: dict[int, int] = {}
        self.defs_of: dict[str, list[int]] = {}

    def build(self) -> _LoopIndex:
        if not self._built:
            self._built = True
            self.loops = find_loops(self._fn, self._blocks)
            self.block_of = {i: bb.index for bb in self._blocks for i in range(bb.start, bb.end)}
            for i, ins in enumerate(self._fn.instructions):
                for reg in ins.defs:
                    self.defs_of.setdefault(reg, []).append(i)
        return self


def _forward_target(fn: Function, branch: int) -> int | None:
    """The index of the instruction ``branch`` jumps forward to; None for a backward branch or
    a target outside the function."""
    target = fn.instructions[branch].branch_target
    t_idx = fn.label_index.get(target) if target is not None else None
    return t_idx if t_idx is not None and t_idx > branch else None


def _skipped(fn: Function, branch: int) -> tuple[int, int]:
    """The instructions a forward guard skips: (branch, target) exclusive (empty when the
    branch does not jump forward)."""
    t_idx = _forward_target(fn, branch)
    return branch, t_idx if t_idx is not None else branch


def _guard_runs_beside(
    fn: Function,
    fixed: Mapping[int, bool],
    counted: Mapping[int, int],
    reach: frozenset[int],
    partial: frozenset[tuple[int, int, int]],
) -> bool:
    """Whether a counted guard runs its code on every warp of the class (not taken, or both
    ways within every warp) beside the partly run guards rather than around them: an
    unrolled tile's full rows next to its partly filled last row."""
    in_part = {i for i, _, _ in partial}
    regions = [_skipped(fn, i) for i in in_part]
    for i in counted:
        if i in reach and i not in in_part and fixed.get(i) is not True:
            lo, hi = _skipped(fn, i)
            if not any(lo < j < hi for j, _ in regions):
                return True
    return False


def _unguarded_loop(
    fn: Function,
    blocks: Sequence[BasicBlock],
    index: _LoopIndex,
    reach: frozenset[int],
    partial: frozenset[tuple[int, int, int]],
) -> bool:
    """Whether the class reaches an innermost loop that no partly run guard skips or holds:
    its iterations run on every warp of the block, not only on the guards' warps."""
    index.build()
    skipped = [_skipped(fn, i) for i, _, _ in partial]
    for loop in index.loops:
        if any(other.parent == loop.header_label for other in index.loops):
            continue  # not innermost
        at = [k for bb in loop.blocks for k in range(blocks[bb].start, blocks[bb].end)]
        if not any(k in reach for k in at):
            continue
        if any(lo < k < hi for k in at for lo, hi in skipped):
            continue  # inside a guarded part
        if any(min(at) <= i <= max(at) for i, _ in skipped):
            continue  # holds a guard: a tile loop around its guarded step
        return True
    return False


def _trip_of(fn: Function, index: _LoopIndex, counter: str, branch: int) -> int | None:
    """Trip count of the innermost loop that steps the register of ``counter``
    (``iter:<reg>``), when ``branch`` is a forward branch inside that loop's body to a target
    inside it (a guard that skips part of an iteration, not a loop exit or back edge) and the
    loop analysis infers the count."""
    index.build()
    at = index.defs_of.get(counter[len(ITER) :], [])
    block_of = index.block_of
    loops = [lp for lp in index.loops if any(block_of.get(i) in lp.blocks for i in at)]
    t_idx = _forward_target(fn, branch)
    if not loops or t_idx is None:
        return None
    loop = max(loops, key=lambda lp: lp.depth)
    if block_of.get(branch) not in loop.blocks or block_of.get(t_idx) not in loop.blocks:
        return None
    return loop.inferred_trip_count


def block_classes(
    fn: Function, block: tuple[int, int, int], grid: tuple[int, int, int], values: LinearValues
) -> tuple[BlockClass, ...]:
    """The classes of the grid's blocks; one class (every block, nothing fixed) when no
    guard tells blocks apart."""
    n_b = grid[0] * grid[1] * grid[2]
    everything = (BlockClass(n_b, {}, frozenset(range(len(fn.instructions)))),)
    leaves = _Leaves(fn, values)
    branches: list[tuple[int, _Pred, bool]] = []
    for i, ins in enumerate(fn.instructions):
        if ins.opcode == "bra" and ins.guard is not None:
            pred = leaves.predicate(i, ins.guard)
            if pred is not None:
                branches.append((i, pred, ins.guard_negated))
    if not branches:
        return everything
    blocks = build_cfg(fn)
    # each leaf depends on one grid axis at most (else it stays open: None everywhere)
    axis_of: list[str | None] = []
    for diff, _ in leaves.leaves:
        axes = [a for a in _CTAID if diff.coefs.get(a, 0)]
        axis_of.append(axes[0] if len(axes) == 1 else (None if not axes else "many"))
    # guards of one comparison on a loop's index: (branch, leaf, counter, trip, runs_when)
    counted: list[tuple[int, int, str | None, int, bool]] = []
    loop_index = _LoopIndex(fn, blocks)
    for i, pred, negated in branches:
        if pred is None or pred[0] != "leaf" or not isinstance(pred[1], int):
            continue
        diff, cmp = leaves.leaves[pred[1]]
        counters = [s for s in diff.coefs if s.startswith(ITER) and diff.coefs[s]]
        if len(counters) > 1 or cmp in ("eq", "ne") or axis_of[pred[1]] == "many":
            continue
        if not counters:
            # a guard outside any counted loop (an unrolled tile step): counted per warp
            # as one iteration when it skips code forward and depends on the thread
            if _forward_target(fn, i) is not None and any(diff.coefs.get(t, 0) for t in _TID):
                counted.append((i, pred[1], None, 1, negated))
            continue
        trip = _trip_of(fn, loop_index, counters[0], i)
        if trip is not None and 0 < trip <= _MAX_TRIP:
            # the branch is taken where the predicate differs from its negation flag
            counted.append((i, pred[1], counters[0], trip, negated))
    constant = [
        _outcomes(diff, cmp, block, None, "")[0] if axis_of[k] is None else None
        for k, (diff, cmp) in enumerate(leaves.leaves)
    ]
    constant_runs = {
        i: _iterations_run(*leaves.leaves[k], block, None, "", counter, trip, runs)[0]
        for i, k, counter, trip, runs in counted
        if axis_of[k] is None
    }
    axis_groups: list[list[tuple[dict[int, bool | None], dict[int, tuple[int, int]], int]]] = []
    for axis in _CTAID:
        extent = grid[_CTAID.index(axis)]
        mine = [k for k, a in enumerate(axis_of) if a == axis]
        mine_runs = [c for c in counted if axis_of[c[1]] == axis]
        if not mine or extent > _MAX_AXIS:
            axis_groups.append([({}, {}, extent)])
            continue
        columns = [
            _outcomes(leaves.leaves[k][0], leaves.leaves[k][1], block, range(extent), axis)
            for k in mine
        ]
        run_columns = [
            _iterations_run(*leaves.leaves[k], block, range(extent), axis, counter, trip, runs)
            for _, k, counter, trip, runs in mine_runs
        ]
        counts = Counter(zip(*columns, *run_columns, strict=True))
        axis_groups.append(
            [
                (
                    dict(zip(mine, key[: len(mine)], strict=True)),
                    dict(zip([c[0] for c in mine_runs], key[len(mine) :], strict=True)),
                    c,
                )
                for key, c in counts.items()
            ]
        )
    warps = -(-(block[0] * block[1] * block[2]) // 32)
    trips = {i: trip for i, _, _, trip, _ in counted}
    classes: dict[
        tuple[frozenset[int], frozenset[tuple[int, bool]], frozenset[tuple[int, int, int]]], int
    ] = {}
    reach_of: dict[frozenset[tuple[int, bool]], frozenset[int]] = {}
    for combo in itertools.product(*axis_groups):
        leaf = list(constant)
        runs = dict(constant_runs)
        count = 1
        for outcomes, axis_runs, c in combo:
            for k, o in outcomes.items():
                leaf[k] = o
            runs.update(axis_runs)
            count *= c
        fixed: dict[int, bool] = {}
        for i, pred, negated in branches:
            n, _active = runs.get(i, (None, 0))
            if n == 0:
                fixed[i] = True  # no iteration runs the guarded code: always taken
            elif n is not None and n < warps * trips[i]:
                continue  # both ways: the warp-iterations that run it are counted below
            else:
                v = _evaluate(pred, leaf)
                if v is not None:
                    fixed[i] = v != negated
        key_fixed = frozenset(fixed.items())
        reach = reach_of.get(key_fixed)
        if reach is None:
            reach = reach_of[key_fixed] = _reachable(fn, blocks, fixed)
        partial = frozenset(
            (i, n, active)
            for i, (n, active) in runs.items()
            if i in reach and 0 < n < warps * trips[i]
        )
        key = (reach, frozenset((i, t) for i, t in fixed.items() if i in reach), partial)
        classes[key] = classes.get(key, 0) + count
    if len(classes) == 1:
        ((reach, _fixed_set, partial_set),) = classes
        if reach == everything[0].instructions and not partial_set:
            return everything
    out = []
    for (reach, fixed_set, partial_set), count in sorted(classes.items(), key=lambda kv: -kv[1]):
        # the class is the warps that run some guarded code (every warp when a loop outside
        # the partly run guards is reached); each guarded part's iterations are its own
        # warp-iterations over those warps
        active = max((a for _, _, a in partial_set), default=None)
        if active is not None and (
            _unguarded_loop(fn, blocks, loop_index, reach, partial_set)
            or _guard_runs_beside(fn, dict(fixed_set), trips, reach, partial_set)
        ):
            active = warps
        out.append(
            BlockClass(
                count,
                dict(sorted(fixed_set)),
                reach,
                {i: (n, (active or 0) * trips[i]) for i, n, _ in sorted(partial_set)},
                active,
            )
        )
    return tuple(out)
