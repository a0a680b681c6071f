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
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from perfmodel.ptx.cfg import _COMPARE, build_cfg
from perfmodel.ptx.ir import Function, Instruction
from perfmodel.ptx.linear import ITER, LinearForm, LinearValues
from perfmodel.ptx.roles import _reachable

__all__ = ["BlockClass", "block_classes"]

_TID = ("tid.x", "tid.y", "tid.z")
_CTAID = ("ctaid.x", "ctaid.y", "ctaid.z")
#: most grid values per axis evaluated one by one (beyond: the branch is left open)
_MAX_AXIS = 1 << 20


@dataclass(frozen=True)
class BlockClass:
    blocks: int  #: blocks of the grid in the class
    fixed_branches: Mapping[int, bool]  #: guarded ``bra`` index -> direction (True: taken)
    instructions: frozenset[int]  #: indices of the instructions the class can execute


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
    # each leaf depends on one grid axis at most (else it stays open: None everywhere)
    axis_of: list[str | None] = []
    for diff, _ in leaves.leaves:
        axes = [a for a in _CTAID if diff.coefs.get(a, 0)]
        axis_of.append(axes[0] if len(axes) == 1 else (None if not axes else "many"))
    constant = [
        _outcomes(diff, cmp, block, None, "")[0] if axis_of[k] is None else None
        for k, (diff, cmp) in enumerate(leaves.leaves)
    ]
    axis_groups: list[list[tuple[dict[int, bool | None], int]]] = []
    for axis in _CTAID:
        extent = grid[_CTAID.index(axis)]
        mine = [k for k, a in enumerate(axis_of) if a == axis]
        if not mine or extent > _MAX_AXIS:
            axis_groups.append([({}, extent)])
            continue
        columns = [
            _outcomes(leaves.leaves[k][0], leaves.leaves[k][1], block, range(extent), axis)
            for k in mine
        ]
        counts = Counter(zip(*columns, strict=True))
        axis_groups.append([(dict(zip(mine, key, strict=True)), c) for key, c in counts.items()])
    blocks = build_cfg(fn)
    classes: dict[tuple[frozenset[int], frozenset[tuple[int, bool]]], int] = {}
    reach_of: dict[frozenset[tuple[int, bool]], frozenset[int]] = {}
    for combo in itertools.product(*axis_groups):
        leaf = list(constant)
        count = 1
        for outcomes, c in combo:
            for k, o in outcomes.items():
                leaf[k] = o
            count *= c
        fixed: dict[int, bool] = {}
        for i, pred, negated in branches:
            v = _evaluate(pred, leaf)
            if v is not None:
                fixed[i] = v != negated
        key_fixed = frozenset(fixed.items())
        reach = reach_of.get(key_fixed)
        if reach is None:
            reach = reach_of[key_fixed] = _reachable(fn, blocks, fixed)
        key = (reach, frozenset((i, t) for i, t in fixed.items() if i in reach))
        classes[key] = classes.get(key, 0) + count
    if len(classes) == 1:
        ((reach, _fixed_set),) = classes
        if reach == everything[0].instructions:
            return everything
    return tuple(
        BlockClass(count, dict(sorted(fixed_set)), reach)
        for (reach, fixed_set), count in sorted(classes.items(), key=lambda kv: -kv[1])
    )
