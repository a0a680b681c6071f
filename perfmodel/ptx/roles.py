"""Warp roles: which warps of a block run which path of the kernel.

A warp-specialized kernel (CUTLASS's TMA warp-specialized GEMMs, FlashAttention-3) sends its
warp groups down different paths: a producer issues the TMA loads, consumers run the
``wgmma`` main loop and the epilogue. The branch that separates them compares a function of
the thread index that is the same for all lanes of a warp (the warp or warp-group index) with
a constant. For a known block shape such a branch goes one way for every thread of a warp, and
which way follows from the warp's index (:class:`~perfmodel.ptx.threads.ThreadValues`).

:func:`warp_roles` fixes every such warp-uniform branch per warp, finds the code each warp can
reach with them fixed, and groups warps that reach the same code under the same directions
into one :class:`WarpRole`. A branch that splits the lanes of a warp (``threadIdx.x == 0``,
``elect.sync``) is left open: both of its sides stay in the role, as for any data-dependent
branch. When no branch tells warps apart the kernel has one role: every warp, nothing fixed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfmodel.ptx.cfg import BasicBlock, build_cfg
from perfmodel.ptx.ir import Function
from perfmodel.ptx.threads import WARP_SIZE, ThreadValues

__all__ = ["WarpRole", "warp_roles"]


@dataclass(frozen=True)
class WarpRole:
    """Warps of a block that execute the same instructions."""

    warps: tuple[int, ...]  #: warp indices within the block (linear thread id // 32)
    threads: int  #: threads in those warps
    #: guarded ``bra`` index -> direction (True: taken) for these warps, where it is fixed
    fixed_branches: Mapping[int, bool]
    instructions: frozenset[int]  #: indices of the instructions these warps can execute


def _reachable(
    fn: Function, blocks: Sequence[BasicBlock], fixed: Mapping[int, bool]
) -> frozenset[int]:
    """Instructions reachable from the entry when the ``fixed`` branches go one way only
    (the same edges :func:`~perfmodel.ptx.cfg.build_cfg` drops, without rebuilding the CFG)."""
    if not blocks:
        return frozenset()
    start_block = {b.start: b.index for b in blocks}
    seen = {0}
    stack = [0]
    while stack:
        b = blocks[stack.pop()]
        succ = b.successors
        taken = fixed.get(b.end - 1)
        if taken is not None:
            target = fn.instructions[b.end - 1].branch_target
            t_idx = fn.label_index.get(target or "", -1)
            target_block = start_block.get(t_idx)
            succ = tuple(
                s for s in succ if (s == target_block) == taken and (taken or s == b.index + 1)
            )
        for s in succ:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return frozenset(i for b in seen for i in range(blocks[b].start, blocks[b].end))


def warp_roles(fn: Function, block: tuple[int, int, int]) -> tuple[WarpRole, ...]:
    """The roles of the warps of a ``block``-shaped (x, y, z) block, ordered by first warp."""
    n_threads = block[0] * block[1] * block[2]
    n_warps = math.ceil(n_threads / WARP_SIZE)
    values = ThreadValues(fn, block)
    # per guarded branch: its direction for each warp, None where the warp's lanes disagree
    directions: dict[int, list[bool | None]] = {}
    for i, ins in enumerate(fn.instructions):
        if ins.opcode != "bra" or ins.guard is None:
            continue
        v = values.value_at(ins.guard, i)
        if v is None:
            continue
        per_warp: list[bool | None] = []
        for w in range(n_warps):
            lanes = set(v[w * WARP_SIZE : (w + 1) * WARP_SIZE])
            per_warp.append((lanes.pop() != 0) != ins.guard_negated if len(lanes) == 1 else None)
        directions[i] = per_warp
    everything = WarpRole(
        warps=tuple(range(n_warps)),
        threads=n_threads,
        fixed_branches={},
        instructions=frozenset(range(len(fn.instructions))),
    )
    if not any(len(set(d)) > 1 and None not in d for d in directions.values()):
        return (everything,)  # no branch separates whole warps: one SPMD role

    blocks = build_cfg(fn)
    groups: dict[tuple[frozenset[int], frozenset[tuple[int, bool]]], list[int]] = {}
    by_map: dict[frozenset[tuple[int, bool]], frozenset[int]] = {}
    for w in range(n_warps):
        fixed = frozenset((i, t) for i, d in directions.items() if (t := d[w]) is not None)
        reach = by_map.get(fixed)
        if reach is None:
            reach = by_map[fixed] = _reachable(fn, blocks, dict(fixed))
        # directions of branches the warp never reaches do not tell roles apart
        key = (reach, frozenset((i, t) for i, t in fixed if i in reach))
        groups.setdefault(key, []).append(w)
    if len(groups) == 1:
        return (everything,)
    roles = []
    for (reach, fixed_set), warps in groups.items():
        threads = sum(min(WARP_SIZE, n_threads - w * WARP_SIZE) for w in warps)
        roles.append(
            WarpRole(
                warps=tuple(warps),
                threads=threads,
                fixed_branches=dict(sorted(fixed_set)),
                instructions=reach,
            )
        )
    return tuple(sorted(roles, key=lambda r: r.warps[0]))
