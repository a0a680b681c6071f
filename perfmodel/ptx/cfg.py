"""Basic blocks, control-flow graph, natural loops and constant trip counts of a PTX function.

Loops are the natural loops of back edges ``n -> h`` where ``h`` dominates ``n``; loops sharing a
header are merged. A loop's header label is what the Many-BSP level-1 supersteps and the request's
``loop_trip_counts`` are keyed by.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perfmodel.errors import ModelInputError
from perfmodel.ptx.ir import Function, Instruction, _int_literal

__all__ = ["BasicBlock", "Loop", "build_cfg", "dominators", "find_loops"]

#: opcodes after which control does not fall through when unguarded
_TERMINATORS = frozenset({"bra", "brx", "ret", "exit", "trap"})

#: largest trip count we infer; beyond it the constant is almost surely not a loop bound
_MAX_TRIP_COUNT = 1 << 31


@dataclass(frozen=True)
class BasicBlock:
    """Instructions ``start`` (inclusive) to ``end`` (exclusive) of the function."""

    index: int
    start: int
    end: int
    label: str | None  #: first label of the leading instruction, if any
    successors: tuple[int, ...]
    predecessors: tuple[int, ...]


@dataclass(frozen=True)
class Loop:
    """A natural loop; ``blocks`` includes the header and nested loops' blocks."""

    header_label: str  #: label of the header block (``$block<i>`` if it has none)
    header_block: int
    latch_block: int  #: source of the back edge (the last one when several)
    blocks: frozenset[int]
    first_line: int  #: lowest source line of the loop's instructions
    last_line: int  #: highest source line of the loop's instructions
    depth: int  #: 1 for an outermost loop
    parent: str | None  #: header label of the innermost enclosing loop
    inferred_trip_count: int | None  #: header executions per entry, from constant bounds


def build_cfg(fn: Function, fixed: Mapping[int, bool] | None = None) -> tuple[BasicBlock, ...]:
    """Split ``fn`` into basic blocks and link them; block 0 is the entry.

    ``fixed`` maps the index of a guarded ``bra`` to the direction it always takes (True:
    taken) for the warps being analysed (perfmodel/ptx/roles.py); the other edge is left out,
    so code those warps never run becomes unreachable.
    """
    instrs = fn.instructions
    n = len(instrs)
    if n == 0:
        return ()
    leaders = {0}
    for i, ins in enumerate(instrs):
        if ins.labels:
            leaders.add(i)
        if ins.opcode in _TERMINATORS and i + 1 < n:
            leaders.add(i + 1)
    starts = sorted(leaders)
    ends = [*starts[1:], n]
    block_of_start = {s: b for b, s in enumerate(starts)}
    label_index = fn.label_index
    succs: list[list[int]] = []
    for b, e in enumerate(ends):
        last = instrs[e - 1]
        out: list[int] = []
        falls = last.opcode not in _TERMINATORS or last.guard is not None
        taken = fixed.get(e - 1) if fixed else None
        if taken is True:
            falls = False
        if last.opcode == "bra" and taken is not False:
            tgt = last.branch_target
            if tgt is not None and label_index.get(tgt, n) < n:
                out.append(block_of_start[label_index[tgt]])
        elif last.opcode == "brx":
            table = last.operands[1].text if len(last.operands) > 1 else ""
            for t in fn.branch_tables.get(table, ()):
                if label_index.get(t, n) < n:
                    out.append(block_of_start[label_index[t]])
        if falls and e < n:
            out.append(b + 1)
        succs.append(list(dict.fromkeys(out)))
    preds: list[list[int]] = [[] for _ in starts]
    for b, ss in enumerate(succs):
        for s2 in ss:
            preds[s2].append(b)
    blocks = []
    for b, (s, e) in enumerate(zip(starts, ends, strict=True)):
        labels = instrs[s].labels
        blocks.append(
            BasicBlock(
                index=b,
                start=s,
                end=e,
                label=labels[0] if labels else None,
                successors=tuple(succs[b]),
                predecessors=tuple(preds[b]),
            )
        )
    return tuple(blocks)


def _reverse_postorder(blocks: Sequence[BasicBlock]) -> list[int]:
    seen = [False] * len(blocks)
    order: list[int] = []
    stack: list[tuple[int, int]] = [(0, 0)]
    seen[0] = True
    while stack:
        b, k = stack[-1]
        succ = blocks[b].successors
        if k < len(succ):
            stack[-1] = (b, k + 1)
            s = succ[k]
            if not seen[s]:
                seen[s] = True
                stack.append((s, 0))
        else:
            stack.pop()
            order.append(b)
    order.reverse()
    return order


def dominators(blocks: Sequence[BasicBlock]) -> list[int | None]:
    """Immediate dominator of each block (None for the entry and unreachable blocks).

    Iterative algorithm of Cooper, Harvey and Kennedy ("A Simple, Fast Dominance Algorithm").
    """
    if not blocks:
        return []
    rpo = _reverse_postorder(blocks)
    rank = {b: i for i, b in enumerate(rpo)}
    idom: list[int | None] = [None] * len(blocks)
    idom[0] = 0
    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            new: int | None = None
            for p in blocks[b].predecessors:
                if idom[p] is None:
                    continue
                if new is None:
                    new = p
                    continue
                x, y = p, new
                while x != y:
                    while rank[x] > rank[y]:
                        x = idom[x]  # type: ignore[assignment]
                    while rank[y] > rank[x]:
                        y = idom[y]  # type: ignore[assignment]
                new = x
            if new is not None and idom[b] != new:
                idom[b] = new
                changed = True
    idom[0] = None
    return idom


def _dominator_intervals(idom: Sequence[int | None]) -> list[tuple[int, int]]:
    """(entry, exit) numbers of each block in a depth-first walk of the dominator tree rooted
    at block 0; (-1, -1) for blocks outside it (unreachable).

    ``a`` dominates ``b`` exactly when ``b``'s interval lies inside ``a``'s: one comparison per
    question, where walking up ``b``'s dominators costs the tree's depth (a straight chain of
    80,000 blocks, a 2 MB module of labels and branches, made that quadratic: minutes).
    """
    children: list[list[int]] = [[] for _ in idom]
    for b, d in enumerate(idom):
        if d is not None:
            children[d].append(b)
    interval = [(-1, -1)] * len(idom)
    clock = 0
    entered = [0] * len(idom)
    stack: list[tuple[int, int]] = [(0, 0)]
    while stack:
        b, k = stack[-1]
        if k == 0:
            entered[b] = clock
            clock += 1
        if k < len(children[b]):
            stack[-1] = (b, k + 1)
            stack.append((children[b][k], 0))
        else:
            stack.pop()
            interval[b] = (entered[b], clock)
            clock += 1
    return interval


def _dominates(interval: Sequence[tuple[int, int]], a: int, b: int) -> bool:
    """True if block ``a`` dominates block ``b`` (intervals of :func:`_dominator_intervals`)."""
    a_in, a_out = interval[a]
    b_in, b_out = interval[b]
    return a_in <= b_in and b_out <= a_out and b_in >= 0


#: the loop bodies of a function may hold at most this many times its blocks in all (each
#: block counted once per loop around it: the mean nesting depth). The analysis of a loop
#: costs time and memory per block of its body, so 33,000 loops nested in one another (2 MB
#: of PTX) cost quadratically: 312 MB at 80 KB already. nvcc's kernels nest a few deep.
MAX_MEAN_LOOP_DEPTH = 32
#: and no block may sit inside more loops than this: the dominator computation takes a pass
#: per level of nesting (Cooper, Harvey and Kennedy), 20 s for 5,000 nested loops
MAX_LOOP_DEPTH = 256


def _check_loop_nesting(fn: Function, blocks: Sequence[BasicBlock]) -> None:
    """Refuse (:class:`ModelInputError`) loops nested deeper than :data:`MAX_LOOP_DEPTH`, or
    than :data:`MAX_MEAN_LOOP_DEPTH` on average, before any dominator is computed.

    Each retreating edge ``b -> h`` of a depth-first walk (``h`` still on the walk's stack: a
    loop's back edge) spans the blocks numbered from ``h`` to ``b`` in the walk's preorder; a
    block's nesting is counted as the spans over it, in one pass over a difference array.
    """
    n = len(blocks)
    pre = [-1] * n
    on_stack = [False] * n
    spans = [0] * (n + 1)
    clock = 0
    stack: list[tuple[int, int]] = [(0, 0)]
    pre[0], on_stack[0] = 0, True
    while stack:
        b, k = stack[-1]
        succ = blocks[b].successors
        if k < len(succ):
            stack[-1] = (b, k + 1)
            s = succ[k]
            if pre[s] < 0:
                clock += 1
                pre[s], on_stack[s] = clock, True
                stack.append((s, 0))
            elif on_stack[s]:  # a retreating edge: the loop headed by s
                spans[pre[s]] += 1
                spans[pre[b] + 1] -= 1
        else:
            stack.pop()
            on_stack[b] = False
    depth = total = deepest = 0
    for change in spans:
        depth += change
        total += depth
        deepest = max(deepest, depth)
    if deepest > MAX_LOOP_DEPTH or total > MAX_MEAN_LOOP_DEPTH * n:
        raise ModelInputError(
            "ptx",
            f"loops of {fn.name} nest {deepest} deep at most and {total / n:.1f} deep on "
            f"average over its {n} basic blocks: more than {MAX_LOOP_DEPTH} and "
            f"{MAX_MEAN_LOOP_DEPTH} are not modelled (the analysis costs each loop's whole body)",
        )


def find_loops(
    fn: Function,
    blocks: Sequence[BasicBlock],
    known: Callable[[str], int | None] | None = None,
    known_def: Callable[[Instruction, int], int | None] | None = None,
) -> tuple[Loop, ...]:
    """Natural loops of ``fn``, outer loops before the loops they contain.

    ``known``: the block-uniform value of a register when the caller knows it (launch shape,
    kernel arguments), for trip counts whose bound or start is not a literal; ``known_def``:
    the value an instruction computes, for a counter started by arithmetic (``n - n % 4``).
    A :class:`ModelInputError` when loops nest deeper than :data:`MAX_MEAN_LOOP_DEPTH` on
    average."""
    if not blocks:
        return ()
    _check_loop_nesting(fn, blocks)
    budget = MAX_MEAN_LOOP_DEPTH * len(blocks)
    idom = dominators(blocks)
    interval = _dominator_intervals(idom)
    reachable = {0} | {b for b, d in enumerate(idom) if d is not None}
    bodies: dict[int, set[int]] = {}
    latches: dict[int, int] = {}
    for b in sorted(reachable):
        for h in blocks[b].successors:
            if h in reachable and _dominates(interval, h, b):  # back edge b -> h
                body = bodies.setdefault(h, {h})
                latches[h] = max(latches.get(h, b), b)
                stack = [b]
                while stack:
                    x = stack.pop()
                    if x in body:
                        continue
                    body.add(x)
                    budget -= 1
                    if budget < 0:
                        raise ModelInputError(
                            "ptx",
                            f"loops of {fn.name} nest more than {MAX_MEAN_LOOP_DEPTH} deep on "
                            f"average over its {len(blocks)} basic blocks: not modelled "
                            "(the analysis costs each loop's whole body)",
                        )
                    stack.extend(p for p in blocks[x].predecessors if p in reachable)
    headers = sorted(bodies, key=lambda h: (-len(bodies[h]), h))
    parent_of: dict[int, int | None] = {}
    # natural loops with different headers are nested or disjoint: visiting larger loops first,
    # the last loop to claim a header block before its own loop is the innermost enclosing one
    owner: dict[int, int] = {}
    for h in headers:
        parent_of[h] = owner.get(h)
        for b in bodies[h]:
            owner[b] = h
    depth: dict[int, int] = {}
    for h in headers:  # parents come first (larger bodies)
        p = parent_of[h]
        depth[h] = 1 if p is None else depth[p] + 1
    instrs = fn.instructions
    defs_of: dict[str, list[int]] = {}
    for i, ins in enumerate(instrs):
        for r in ins.defs:
            defs_of.setdefault(r, []).append(i)

    def name(h: int) -> str:
        return blocks[h].label or f"$block{h}"

    loops: list[Loop] = []
    for h in sorted(headers, key=lambda h: (depth[h], blocks[h].start)):
        body = bodies[h]
        lines = [instrs[i].line for b in body for i in (blocks[b].start, blocks[b].end - 1)]
        p = parent_of[h]
        loops.append(
            Loop(
                header_label=name(h),
                header_block=h,
                latch_block=latches[h],
                blocks=frozenset(body),
                first_line=min(lines),
                last_line=max(lines),
                depth=depth[h],
                parent=None if p is None else name(p),
                inferred_trip_count=_infer_trip_count(
                    fn, blocks, h, latches[h], body, defs_of, known, known_def
                ),
            )
        )
    return tuple(loops)


# --------------------------------------------------------------------------------------------
# trip counts from constant bounds

_COMPARE: dict[str, Callable[[int, int], bool]] = {
    "lt": lambda a, b: a < b,
    "lo": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "ls": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "hi": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "hs": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}
_SWAPPED = {
    "lt": "gt",
    "lo": "hi",
    "le": "ge",
    "ls": "hs",
    "gt": "lt",
    "hi": "lo",
    "ge": "le",
    "hs": "ls",
    "eq": "eq",
    "ne": "ne",
}


def _first_false(x1: int, step: int, cmp: str, bound: int, want: bool) -> int | None:
    """Smallest k >= 1 where ``(x_k cmp bound) != want`` for x_k = x1 + (k-1)*step, or None
    if there is none up to _MAX_TRIP_COUNT.

    Along an arithmetic sequence an ordering comparison changes truth at most once, so binary
    search finds the change; equality holds at one point at most, found by division.
    """
    rel = _COMPARE[cmp]

    def cont(x: int) -> bool:
        return rel(x, bound) == want

    if not cont(x1):
        return 1
    if step == 0:
        return None
    if cmp in ("eq", "ne"):
        if (cmp == "ne") == want:  # continue while x != bound: stop where x hits the bound
            q, r = divmod(bound - x1, step)
            return q + 1 if r == 0 and 0 <= q < _MAX_TRIP_COUNT else None
        return 2  # continue while x == bound: the next value already differs
    hi = _MAX_TRIP_COUNT
    if cont(x1 + (hi - 1) * step):
        return None  # never leaves (or only after an implausible count)
    lo = 1
    while hi - lo > 1:  # invariant: cont true at lo, false at hi
        mid = (lo + hi) // 2
        if cont(x1 + (mid - 1) * step):
            lo = mid
        else:
            hi = mid
    return hi


def _is_plain_mov(ins: Instruction) -> bool:
    return ins.opcode == "mov" and ins.guard is None and len(ins.operands) == 2


def _infer_trip_count(
    fn: Function,
    blocks: Sequence[BasicBlock],
    header: int,
    latch: int,
    body: set[int],
    defs_of: Mapping[str, list[int]],
    known: Callable[[str], int | None] | None = None,
    known_def: Callable[[Instruction, int], int | None] | None = None,
) -> int | None:
    """Trip count when the loop is counted by a constant-initialised, constant-stepped register
    compared against a constant; None for anything else.

    Bottom-tested (``@%p bra header`` at the latch, what nvcc emits): the count is the number of
    times the header runs. Top-tested (the header branches out, the latch jumps back
    unconditionally): the number of times the latch's back edge is taken.
    """
    instrs = fn.instructions
    exits = [(b, s) for b in body for s in blocks[b].successors if s not in body]
    if len(exits) != 1:
        return None
    exit_block = exits[0][0]
    br = instrs[blocks[exit_block].end - 1]
    if br.opcode != "bra" or br.guard is None:
        return None
    target_in_loop = fn.label_index.get(br.branch_target or "", -1)
    taken_stays = any(blocks[b].start == target_in_loop for b in body)
    if exit_block == latch and taken_stays:
        bottom = True
        # loop continues while (guard xor negated) is true
        continue_when_true = not br.guard_negated
    elif exit_block == header and not taken_stays:
        bottom = False
        continue_when_true = br.guard_negated
    else:
        return None
    # the setp defining the guard, in the same block before the branch
    setp: Instruction | None = None
    setp_index = -1
    for i in range(blocks[exit_block].end - 2, blocks[exit_block].start - 1, -1):
        if br.guard in instrs[i].defs:
            setp, setp_index = instrs[i], i
            break
    if setp is None or setp.opcode != "setp" or setp.guard is not None:
        return None
    if len(setp.operands) != 3 or setp.defs != (br.guard,) or not setp.modifiers:
        return None
    cmp = setp.modifiers[0]
    if cmp not in _COMPARE or any(t.startswith("f") for t in setp.modifiers[1:]):
        return None
    loop_idx = sorted(i for b in body for i in range(blocks[b].start, blocks[b].end))
    loop_set = set(loop_idx)

    def loop_defs(reg: str) -> list[int]:
        """The instructions of the loop defining ``reg``: only the defs within the loop's span
        are looked at (a register written by each of 25,000 loops made every loop scan all
        of its defs: quadratic)."""
        defs = defs_of.get(reg, [])
        lo = bisect.bisect_left(defs, loop_idx[0])
        hi = bisect.bisect_right(defs, loop_idx[-1])
        return [i for i in defs[lo:hi] if i in loop_set]

    def const_of(text: str) -> int | None:
        v = _int_literal(text)
        if v is not None:
            return v
        defs = defs_of.get(text, ())  # one def looked at, not a list of all of them
        if len(defs) == 1 and _is_plain_mov(instrs[defs[0]]):
            v = _int_literal(instrs[defs[0]].operands[1].text)
            if v is not None:
                return v
        return known(text) if known is not None and text.startswith("%") else None

    a, b = setp.operands[1].text, setp.operands[2].text
    bound = const_of(b)
    var = a
    if bound is None:
        bound = const_of(a)
        var = b
        cmp = _SWAPPED[cmp]
    if bound is None or not var.startswith("%"):
        return None

    # the compared value is either the counter itself or counter + constant
    def stepped_def(reg: str, source: str | None) -> tuple[int, str, int] | None:
        """(index, source register, constant) of the loop's one unguarded def of ``reg``
        when it is ``add/sub reg, src, k``; ``src`` must be ``source`` unless None."""
        defs = loop_defs(reg)
        if len(defs) != 1 or instrs[defs[0]].guard is not None:
            return None
        ins = instrs[defs[0]]
        if ins.opcode not in ("add", "sub") or len(ins.operands) != 3:
            return None
        x, y = ins.operands[1].text, ins.operands[2].text
        k = _int_literal(y)
        src = x
        if k is None and ins.opcode == "add":
            k, src = _int_literal(x), y
        if k is None or (source is not None and src != source):
            return None
        return defs[0], src, (-k if ins.opcode == "sub" else k)

    found = stepped_def(var, None)
    if found is None:
        return None
    var_def_index, counter, k1 = found
    extra = 0
    if counter == var:
        step = k1
        step_index = var_def_index
    else:  # var = counter + k1, and counter steps elsewhere in the loop
        counter_step = stepped_def(counter, counter)
        if counter_step is None:
            return None
        step_index, _, step = counter_step
        extra = k1
        # if the counter is stepped before var is computed, var sees the stepped value
        if step_index < var_def_index:
            extra += step
        step_index = var_def_index
    every = defs_of.get(counter, [])
    if len(every) - len(loop_defs(counter)) != 1:
        return None  # not one def outside the loop (counted without scanning them all)
    outside_at = [i for i in every if i not in loop_set]
    outside = [instrs[i] for i in outside_at]
    if _is_plain_mov(outside[0]):
        init = const_of(outside[0].operands[1].text)
    elif known_def is not None and outside[0].guard is None:
        init = known_def(outside[0], outside_at[0])
    else:
        return None
    if init is None:
        return None
    if counter == var:
        # the comparison sees the stepped value when the step comes before it in the loop
        x1 = init + step if step_index < setp_index else init
    else:
        x1 = init + extra
    if any(t.startswith("u") for t in setp.modifiers[1:]) and min(x1, bound) < 0:
        return None  # unsigned wrap-around: not a simple counted loop

    k = _first_false(x1, step, cmp, bound, continue_when_true)
    if k is None:
        return None
    return k if bottom else k - 1
