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


def _setp_of(fn: Function, at: int, guard: str) -> Instruction | None:
    for i in range(at - 1, -1, -1):
        ins = fn.instructions[i]
        if guard in ins.defs:
            return ins if ins.opcode == "setp" and ins.guard is None else None
    return None


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
    if not steps and rising is None and any(s.startswith(ITER) for s in diff.coefs):
        return [None] * len(out)  # iterations move the value both ways
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
    per_axis: dict[str, list[tuple[int, list[bool | None]]]] = {a: [] for a in _CTAID}
    constant: dict[int, bool] = {}
    for i, ins in enumerate(fn.instructions):
        if ins.opcode != "bra" or ins.guard is None:
            continue
        setp = _setp_of(fn, i, ins.guard)
        if setp is None or len(setp.operands) != 3 or not setp.modifiers:
            continue
        cmp = setp.modifiers[0]
        if cmp not in _COMPARE or any(m[:1] == "f" and m[1:].isdigit() for m in setp.modifiers):
            continue
        a, b = (values.operand(o) for o in setp.operands[1:])
        diff = LinearForm(
            a.const - b.const,
            {s: a.coefs.get(s, 0) - b.coefs.get(s, 0) for s in {*a.coefs, *b.coefs}},
            a.unknown or b.unknown,
        )
        if diff.unknown:
            continue
        axes = [s for s in _CTAID if diff.coefs.get(s, 0)]
        if len(axes) > 1:
            continue
        if not axes:
            (o,) = _outcomes(diff, cmp, block, None, "")
            if o is not None:
                constant[i] = o != ins.guard_negated
            continue
        axis = axes[0]
        extent = grid[_CTAID.index(axis)]
        if extent > _MAX_AXIS:
            continue
        outs = _outcomes(diff, cmp, block, range(extent), axis)
        per_axis[axis].append(
            (i, [None if o is None else o != ins.guard_negated for o in outs])
        )
    if not any(per_axis.values()) and not constant:
        return everything
    # per axis: the directions of its branches, by block index value, counted
    axis_groups: list[list[tuple[dict[int, bool], int]]] = []
    for axis in _CTAID:
        branches = per_axis[axis]
        extent = grid[_CTAID.index(axis)]
        if not branches:
            axis_groups.append([({}, extent)])
            continue
        counts = Counter(tuple(d[v] for _, d in branches) for v in range(extent))
        axis_groups.append(
            [
                ({i: t for (i, _), t in zip(branches, key, strict=True) if t is not None}, c)
                for key, c in counts.items()
            ]
        )
    blocks = build_cfg(fn)
    classes: dict[tuple[frozenset[int], frozenset[tuple[int, bool]]], int] = {}
    reach_of: dict[frozenset[tuple[int, bool]], frozenset[int]] = {}
    for combo in itertools.product(*axis_groups):
        fixed = dict(constant)
        count = 1
        for directions, c in combo:
            fixed.update(directions)
            count *= c
        key_fixed = frozenset(fixed.items())
        reach = reach_of.get(key_fixed)
        if reach is None:
            reach = reach_of[key_fixed] = _reachable(fn, blocks, fixed)
        key = (reach, frozenset((i, t) for i, t in fixed.items() if i in reach))
        classes[key] = classes.get(key, 0) + count
    if len(classes) == 1:
        ((reach, fixed_set),) = classes
        if reach == everything[0].instructions:
            return everything
    return tuple(
        BlockClass(count, dict(sorted(fixed_set)), reach)
        for (reach, fixed_set), count in sorted(classes.items(), key=lambda kv: -kv[1])
    )
