"""Values of thread-index expressions, evaluated for every thread of a block.

Warp-specialized kernels pick each warp's path from its index: CUTLASS computes the warp group
as ``__shfl_sync(0xffffffff, threadIdx.x / 128, 0)`` and branches on it. To know which warps
take which path, :class:`ThreadValues` evaluates a register for each of the block's threads
(``%tid``, ``%laneid`` and ``%ntid`` are known once the block shape is) through the integer
instructions nvcc emits for such expressions: mov, add/sub/mul/mad, div/rem, and/or/xor/not,
shl/shr, min/max, neg/abs, selp, setp, cvt, predicate logic and ``shfl.sync.idx`` from a
constant lane. A register with a value unknown to the analysis anywhere in its definition
(a parameter, ``%ctaid``, a load, a loop-carried or guarded definition) has no value (None).

Flow insensitive, like :mod:`perfmodel.ptx.affine`: a register is evaluated only when it has
exactly one unguarded definition (nvcc's PTX is SSA apart from loop-carried registers).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence

from perfmodel.ptx.cfg import _COMPARE, _TERMINATORS
from perfmodel.ptx.ir import Function, Instruction, Operand, _int_literal

__all__ = ["ThreadValues"]

WARP_SIZE = 32  #: threads per warp (PTX ISA "%laneid", "Warp" in the programming model)

#: thread values one analysis computes at most (instructions evaluated x threads); beyond it
#: registers have no value, so a huge kernel with thousands of thread-index branches costs at
#: well under a second here and its remaining branches stay open (the SPMD treatment)
WORK_LIMIT = 500_000

_Values = tuple[int, ...]

_BINARY: dict[str, Callable[[int, int], int | None]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "min": min,
    "max": max,
    "shl": lambda a, b: a << b if 0 <= b < 64 else 0,
    "shr": lambda a, b: a >> b if 0 <= b < 64 else (-1 if a < 0 else 0),
    # PTX div/rem truncate toward zero (C semantics); division by zero has no defined value
    "div": lambda a, b: (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1) if b else None,
    "rem": lambda a, b: a - b * int(a / b) if b else None,
}


def _int_type(modifiers: Sequence[str], first: bool = False) -> tuple[int, bool] | None:
    """(bits, signed) of the last (``first``: the first) type modifier; None for float types.

    ``cvt.u32.u64`` names the destination type first; other opcodes name one type.
    """
    for m in modifiers if first else reversed(modifiers):
        if m == "pred":
            return 1, False
        if m[:1] in "usb" and m[1:].isdigit():
            return int(m[1:]), m[0] == "s"
        if m[:1] == "f" and m[1:].isdigit():
            return None
    return None


def _wrap(v: int, bits: int, signed: bool) -> int:
    v &= (1 << bits) - 1
    if signed and v >> (bits - 1):
        v -= 1 << bits
    return v


class ThreadValues:
    """Per-thread values of the registers of ``fn`` for a block of shape ``block`` (x, y, z)."""

    def __init__(self, fn: Function, block: tuple[int, int, int]) -> None:
        self.fn = fn
        self.block = block
        self.n_threads = block[0] * block[1] * block[2]
        defs: dict[str, list[int]] = {}
        for i, ins in enumerate(fn.instructions):
            for r in ins.defs:
                defs.setdefault(r, []).append(i)
        self._defs = defs
        # first instruction of each one's basic block (leaders as in cfg.build_cfg)
        self._block_start = [0] * len(fn.instructions)
        start = 0
        for i, ins in enumerate(fn.instructions):
            if ins.labels or (i and fn.instructions[i - 1].opcode in _TERMINATORS):
                start = i
            self._block_start[i] = start
        self._memo: dict[tuple[int, str], _Values | None] = {}
        self._work = 0  # thread values computed so far, against WORK_LIMIT

    # ---- leaves
    def _special(self, name: str) -> _Values | None:
        bx, by, _ = self.block
        base, _, comp = name.partition(".")
        n = self.n_threads
        if base == "%tid":
            if comp == "x":
                return tuple(t % bx for t in range(n))
            if comp == "y":
                return tuple((t // bx) % by for t in range(n))
            if comp == "z":
                return tuple(t // (bx * by) for t in range(n))
        if base == "%ntid" and comp in ("x", "y", "z"):
            return (self.block["xyz".index(comp)],) * n
        if base == "%laneid":
            return tuple(t % WARP_SIZE for t in range(n))
        return None  # %ctaid, %warpid (may change during execution), clocks, ...

    def _reaching(self, reg: str, at: int) -> int | None:
        """Index of the definition of ``reg`` that instruction ``at`` reads, if it is certain:
        the last one before it in its basic block, else the register's only definition.

        Inline assembly makes nvcc's PTX leave SSA (CUTLASS's ``elect.sync`` block rewrites a
        register the warp-index shuffle read just before), hence the look within the block.
        """
        instrs = self.fn.instructions
        ds = self._defs.get(reg, ())
        # the last definition before ``at`` (defs are in program order), if in its block
        k = bisect_left(ds, at)
        if k and ds[k - 1] >= self._block_start[at]:
            j = ds[k - 1]
            return j if instrs[j].guard is None else None
        if len(ds) != 1 or instrs[ds[0]].guard is not None:
            return None
        if self._block_start[ds[0]] == self._block_start[at] and ds[0] >= at:
            return None  # defined later in the same block: a loop-carried value
        return ds[0]

    def value_at(self, reg: str, at: int) -> _Values | None:
        """The value of ``reg`` read by instruction ``at``, per thread (index = linear thread
        id), or None when the analysis cannot tell."""
        d = self._reaching(reg, at)
        return None if d is None else self._value(d, reg)

    def _sources(self, d: int) -> list[tuple[int, str] | None]:
        """Definitions read by instruction ``d``'s register operands (None: uncertain)."""
        out: list[tuple[int, str] | None] = []
        for o in self.fn.instructions[d].operands[1:]:
            if o.kind == "register" and len(o.registers) == 1:
                r = o.registers[0]
                src = self._reaching(r, d)
                out.append(None if src is None else (src, r))
        return out

    def _value(self, d: int, reg: str) -> _Values | None:
        key = (d, reg)
        if key in self._memo:
            return self._memo[key]
        # iterative depth-first walk over the definitions (no recursion limit on long
        # chains); ``open_`` holds the nodes whose sources are being evaluated (a source
        # among them is a cycle: a loop-carried value, not a plain expression)
        stack = [key]
        open_: set[tuple[int, str]] = set()
        while stack:
            node = stack[-1]
            if node in self._memo:
                stack.pop()
                continue
            sources = self._sources(node[0])
            todo = [s for s in sources if s is not None and s not in self._memo]
            if node not in open_ and todo and None not in sources:
                if any(s in open_ for s in todo):
                    self._memo[node] = None
                    stack.pop()
                    continue
                open_.add(node)
                stack.extend(todo)
                continue
            open_.discard(node)
            stack.pop()
            if None in sources or todo:
                self._memo[node] = None
            elif self._work > WORK_LIMIT:
                self._memo[node] = None
            else:
                self._work += self.n_threads
                self._memo[node] = self._evaluate(self.fn.instructions[node[0]], node[1], sources)
        return self._memo[key]

    def _operand(self, o: Operand, source: tuple[int, str] | None) -> _Values | None:
        if o.kind == "immediate":
            v = _int_literal(o.text)
            return None if v is None else (v,) * self.n_threads
        if o.kind == "special":
            return self._special(o.registers[0])
        if o.kind == "register" and source is not None:
            return self._memo.get(source)
        return None

    def _operands(
        self, ins: Instruction, sources: list[tuple[int, str] | None]
    ) -> list[_Values | None]:
        it = iter(sources)
        return [
            self._operand(o, next(it) if o.kind == "register" and len(o.registers) == 1 else None)
            for o in ins.operands[1:]
        ]

    def _evaluate(
        self, ins: Instruction, reg: str, sources: list[tuple[int, str] | None]
    ) -> _Values | None:
        op = ins.opcode
        vals = self._operands(ins, sources)
        if op == "shfl":
            return self._shuffle(ins, reg, vals)
        if len(ins.defs) != 1:
            return None
        if any(v is None for v in vals):
            return None
        args: list[_Values] = [v for v in vals if v is not None]
        if op == "setp":
            return self._setp(ins, args)
        ty = _int_type(ins.modifiers, first=op == "cvt")
        if ty is None:
            return None
        bits, signed = ty
        if op in ("mov", "cvt") and len(args) == 1:
            return tuple(_wrap(a, bits, signed) for a in args[0])
        if op in ("not", "cnot") and len(args) == 1:
            if bits == 1:
                return tuple(int(not a) for a in args[0])
            return tuple(_wrap(~a if op == "not" else int(a == 0), bits, signed) for a in args[0])
        if op in ("neg", "abs") and len(args) == 1:
            return tuple(_wrap(-a if op == "neg" else abs(a), bits, signed) for a in args[0])
        if op == "selp" and len(args) == 3:
            return tuple(
                _wrap(a if p else b, bits, signed)
                for a, b, p in zip(args[0], args[1], args[2], strict=True)
            )
        if op == "mad" and len(args) == 3 and "lo" in ins.modifiers:
            return tuple(
                _wrap(a * b + c, bits, signed)
                for a, b, c in zip(args[0], args[1], args[2], strict=True)
            )
        fn = _BINARY.get(op)
        if fn is None or len(args) != 2 or (op == "mul" and "hi" in ins.modifiers):
            return None
        if op in ("shl", "shr") and bits == 32:
            # PTX clamps shift amounts above the width to the width
            args = [args[0], tuple(min(b & 0xFFFFFFFF, 32) for b in args[1])]
        out: list[int] = []
        for a, b in zip(args[0], args[1], strict=True):
            # operands as the instruction's type reads them (registers hold bit patterns)
            a = _wrap(a, bits, signed) if bits > 1 else a
            if op not in ("shl", "shr") and bits > 1:
                b = _wrap(b, bits, signed)
            v = fn(a, b)
            if v is None:
                return None
            width = bits * 2 if "wide" in ins.modifiers else bits
            out.append(v if bits == 1 else _wrap(v, width, signed))
        return tuple(out)

    def _setp(self, ins: Instruction, args: list[_Values]) -> _Values | None:
        if len(args) != 2 or not ins.modifiers:
            return None  # setp.cmp.bop with a third predicate source: not needed here
        cmp = _COMPARE.get(ins.modifiers[0])
        ty = _int_type(ins.modifiers)
        if cmp is None or ty is None:
            return None
        bits, signed = ty
        if ins.modifiers[0] in ("lo", "ls", "hi", "hs"):
            signed = False
        return tuple(
            int(cmp(_wrap(a, bits, signed), _wrap(b, bits, signed)))
            for a, b in zip(args[0], args[1], strict=True)
        )

    def _shuffle(self, ins: Instruction, reg: str, vals: list[_Values | None]) -> _Values | None:
        """``shfl.sync.idx.b32 d|p, a, lane, 31, mask``: d = a of ``lane`` in the same warp."""
        if "idx" not in ins.modifiers or len(vals) < 3 or not ins.defs:
            return None
        if reg != ins.defs[0]:
            return None  # the in-range predicate
        src, lane, clamp = vals[0], vals[1], vals[2]
        if src is None or lane is None or clamp is None:
            return None
        n = self.n_threads
        out: list[int] = []
        for t in range(n):
            if clamp[t] & 0x1F != 0x1F:
                return None  # segmented shuffles: not the warp-wide broadcast
            s = (t // WARP_SIZE) * WARP_SIZE + (lane[t] & 0x1F)
            if s >= n:
                return None  # source lane beyond the block: undefined
            out.append(src[s])
        return tuple(out)
