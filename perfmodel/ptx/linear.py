"""Integer register values as linear forms over the thread and block indices, for one launch.

Where :mod:`perfmodel.ptx.affine` keeps every block-uniform value unknown, this evaluation
knows the launch: ``%ntid``/``%nctaid`` are the block and grid shape, and a scalar kernel
parameter read by ``ld.param`` has the value the request gives for it (``kernel_args``). A
register is then

    value = const + sum(coef[s] * s) + U

over the symbols ``tid.x/y/z`` and ``ctaid.x/y/z``, where ``U`` is an unknown part (a value
loaded from memory, a float converted to an integer, an operation the evaluation does not
follow) that depends on the symbols in ``opaque`` only, and on the kernel parameters in
``params`` the request did not give. With ``U`` absent the value is known exactly for every
thread of every block: loop bounds, guards and addresses are then evaluated, not guessed.

Flow insensitive like the affine analysis: nvcc's PTX is SSA apart from loop-carried
registers; a register with several definitions keeps its thread part only when every
definition agrees on it (``%r = %r + k`` updates of pointers and counters), its constant part
is then unknown.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from perfmodel.ptx.ir import Function, Instruction, Operand, _int_literal

__all__ = ["ITER", "LinearForm", "LinearValues", "SYMBOLS", "param_name"]

#: thread and block index symbols of a form
SYMBOLS = ("tid.x", "tid.y", "tid.z", "ctaid.x", "ctaid.y", "ctaid.z")

_COPY = frozenset({"mov", "cvta"})
_MAX_DEPTH = 150  # definition chains deeper than this are left unknown (Python's stack)
#: a register redefined more often than this is no counter or index: left unknown unevaluated
_MAX_DEFS = 32
_T = TypeVar("_T")
#: prefix of the symbol counting a loop-carried register's iterations ("iter:%r45")
ITER = "iter:"


@dataclass(frozen=True, slots=True)
class LinearForm:
    const: int
    coefs: Mapping[str, int] = field(default_factory=dict)
    unknown: bool = False
    opaque: frozenset[str] = frozenset()  #: symbols the unknown part depends on
    params: frozenset[str] = frozenset()  #: kernel parameters it needs and was not given
    #: loop-carried registers whose earlier value it contains (inside their own cycle)
    carried: frozenset[str] = frozenset()

    @property
    def known(self) -> bool:
        return not self.unknown

    @property
    def symbols(self) -> frozenset[str]:
        """Every symbol the value depends on, linearly or not."""
        return frozenset(s for s, v in self.coefs.items() if v) | self.opaque

    def at(self, point: Mapping[str, int]) -> int:
        """The known part at one thread of one block (symbols absent from ``point``: 0)."""
        return self.const + sum(v * point.get(s, 0) for s, v in self.coefs.items())


def _known(v: int) -> LinearForm:
    return LinearForm(v)


def _opaque(*forms: LinearForm) -> LinearForm:
    """An unknown value computed from ``forms``: it depends on whatever they depend on."""
    deps: frozenset[str] = frozenset()
    params: frozenset[str] = frozenset()
    carried: frozenset[str] = frozenset()
    for f in forms:
        deps |= f.symbols
        params |= f.params
        carried |= f.carried
    return LinearForm(0, {}, True, deps, params, carried)


def _strip(f: LinearForm, sym: str) -> LinearForm:
    """``f`` without the iteration symbol ``sym`` (its register's cycle is closed)."""
    coefs = {s: v for s, v in f.coefs.items() if s != sym}
    return dataclasses.replace(f, coefs=coefs)


def _add(a: LinearForm, b: LinearForm, sign: int = 1) -> LinearForm:
    coefs = dict(a.coefs)
    for s, v in b.coefs.items():
        coefs[s] = coefs.get(s, 0) + sign * v
    return LinearForm(
        a.const + sign * b.const,
        {s: v for s, v in coefs.items() if v},
        a.unknown or b.unknown,
        a.opaque | b.opaque,
        a.params | b.params,
        a.carried | b.carried,
    )


def _mul(a: LinearForm, b: LinearForm) -> LinearForm:
    for x, y in ((a, b), (b, a)):
        if x.known and not x.coefs:  # a constant times anything linear stays linear
            k = x.const
            return LinearForm(
                y.const * k,
                {s: v * k for s, v in y.coefs.items() if v * k},
                y.unknown and k != 0,
                y.opaque if k else frozenset(),
                y.params if k else frozenset(),
                y.carried if k else frozenset(),
            )
    return _opaque(a, b)


def param_name(ins: Instruction) -> str | None:
    """The kernel parameter a ``ld.param`` reads (``[name]`` or ``[name+k]``)."""
    if ins.opcode != "ld" or ins.state_space != "param":
        return None
    for o in ins.operands[1:]:
        if o.kind == "address":
            return o.text.strip("[]").split("+", 1)[0].strip()
    return None


def _int_bits(ins: Instruction) -> int | None:
    """Width of the destination integer type (first type modifier); None for floats."""
    for m in ins.modifiers:
        if m[:1] in "usb" and m[1:].isdigit():
            return int(m[1:])
        if m[:1] == "f" and m[1:].isdigit():
            return None
    return None


class LinearValues:
    """Linear forms of the registers of ``fn`` for one launch shape and argument set."""

    def __init__(
        self,
        fn: Function,
        block: tuple[int, int, int],
        grid: tuple[int, int, int],
        kernel_args: Mapping[str, float] | None = None,
    ) -> None:
        self.fn = fn
        self.block = block
        self.grid = grid
        self.args = dict(kernel_args or {})
        defs: dict[str, list[Instruction]] = {}
        at: dict[str, list[int]] = {}
        for i, ins in enumerate(fn.instructions):
            for r in ins.defs:
                defs.setdefault(r, []).append(ins)
                at.setdefault(r, []).append(i)
        self._defs = defs
        self._def_at = at
        self._memo: dict[str, LinearForm] = {}
        self._active: set[str] = set()

    # ---- leaves
    def _special(self, reg: str) -> LinearForm:
        base, _, comp = reg.partition(".")
        comp = comp or "x"
        if base in ("%tid", "%ctaid") and comp in "xyz":
            return LinearForm(0, {f"{base[1:]}.{comp}": 1})
        if base in ("%ntid", "%nctaid") and comp in "xyz":
            return _known((self.block if base == "%ntid" else self.grid)["xyz".index(comp)])
        if base == "%laneid":  # consecutive lanes are consecutive tid.x in full-width rows
            return LinearForm(0, {"tid.x": 1}, True, frozenset({"tid.x", "tid.y", "tid.z"}))
        return LinearForm(0, {}, True, frozenset(SYMBOLS))  # clocks, %warpid, %smid...

    def register(self, reg: str) -> LinearForm:
        if reg not in self._defs:
            return self._special(reg)
        if reg in self._memo:
            return self._memo[reg]
        if reg in self._active:
            # loop-carried: the value of an earlier iteration, as the symbol "iter:<reg>"; the
            # register's own join turns "start, then itself + k" into start + k x iteration
            return LinearForm(0, {ITER + reg: 1}, carried=frozenset({reg}))
        if len(self._active) > _MAX_DEPTH or len(self._defs[reg]) > _MAX_DEFS:
            return LinearForm(0, {}, True, frozenset(SYMBOLS))
        self._active.add(reg)
        try:
            forms = [self._eval(ins) for ins in self._defs.get(reg, ())]
        finally:
            self._active.discard(reg)
        out = self._join(reg, forms)
        if not out.carried:
            self._memo[reg] = out  # a value inside another register's cycle is not final
        return out

    @staticmethod
    def _join(reg: str, forms: list[LinearForm]) -> LinearForm:
        sym = ITER + reg
        updates = [f for f in forms if reg in f.carried]
        forms = [f for f in forms if reg not in f.carried]
        rest = [{s: v for s, v in f.coefs.items() if s != sym} for f in updates]
        if any(r or f.opaque or f.coefs.get(sym) != 1 for r, f in zip(rest, updates, strict=True)):
            return _strip(_opaque(*forms, *updates), sym)  # r = r x k or r + (thread part)
        carried = frozenset().union(*(f.carried for f in updates)) - {reg}
        upd_params = frozenset().union(*(f.params for f in updates))
        if not forms:
            return LinearForm(0, {}, True, frozenset(), upd_params, carried)
        start = forms[0]
        if any(dict(f.coefs) != dict(start.coefs) for f in forms[1:]):
            return _strip(_opaque(*forms), sym)
        deps = frozenset().union(*(f.opaque for f in forms))
        params = frozenset().union(*(f.params for f in forms)) | upd_params
        more = frozenset().union(*(f.carried for f in forms)) | carried
        steps = {f.const for f in updates if f.known}
        exact = (
            len(forms) == 1 and start.known and len(steps) == 1 and all(f.known for f in updates)
        )
        if updates and exact:
            # an induction variable: start + step x (iterations so far)
            coefs = {**start.coefs, sym: steps.pop()}
            return LinearForm(start.const, coefs, False, deps, params, more)
        if updates:
            # r = start, then r = r + (unknown uniform): the start's thread part only
            return LinearForm(start.const, dict(start.coefs), True, deps, params, more)
        if len(forms) == 1:
            return forms[0]
        # a join of definitions with one thread part (checked above): known where all agree
        same = all(f.known and f.const == start.const for f in forms)
        return LinearForm(start.const, dict(start.coefs), not same, deps, params, more)

    def operand(self, o: Operand) -> LinearForm:
        if o.kind == "immediate":
            v = _int_literal(o.text)
            return _known(v) if v is not None else LinearForm(0, {}, True)
        if o.kind in ("register", "special") and len(o.registers) == 1:
            f = self.register(o.registers[0])
            return _mul(_known(-1), f) if o.text.startswith("-") else f
        if o.kind == "symbol":  # the address of a variable: the same for every thread
            return LinearForm(0, {}, True)
        return LinearForm(0, {}, True, frozenset(SYMBOLS))

    def address(self, ins: Instruction) -> LinearForm | None:
        """The address a memory instruction accesses, or None when it takes none."""
        addrs = [o for o in ins.operands if o.kind == "address"]
        if not addrs:
            return None
        addr = addrs[-1] if ins.opcode == "cp" else addrs[0]
        form = _known(addr.offset)
        for r in addr.registers:
            form = _add(form, self.register(r))
        if not addr.registers:
            form = _add(form, LinearForm(0, {}, True))  # a variable's address
        return form

    def definition(self, ins: Instruction, index: int | None = None) -> LinearForm:
        """The value ``ins`` computes (its sources' forms, the launch's values). With its
        ``index``: a source register defined once before it and redefined only after it (a
        remainder loop's counter) takes that one definition's value."""
        if index is None:
            return self._eval(ins)
        return self._reaching(ins, index, lambda: self._eval(ins))

    def operands_at(self, ins: Instruction, index: int) -> list[LinearForm]:
        """The source operands' forms of instruction ``index`` (reaching definitions as in
        :meth:`definition`)."""
        return self._reaching(ins, index, lambda: [self.operand(o) for o in ins.operands[1:]])

    def _reaching(self, ins: Instruction, index: int, evaluate: Callable[[], _T]) -> _T:
        overrides: dict[str, LinearForm] = {}
        for o in ins.operands[1:]:
            for r in o.registers:
                at = self._def_at.get(r, [])
                # ``at`` is in program order: one definition before ``index`` is the first
                if len(at) > 1 and bisect_left(at, index) == 1:
                    overrides[r] = self._eval(self._defs[r][0])
                else:
                    self.register(r)  # memoized as usual, before any override is in place
        if not overrides:
            return evaluate()
        previous = {r: self._memo.get(r) for r in overrides}
        self._memo.update(overrides)
        try:
            return evaluate()
        finally:
            for r, v in previous.items():
                if v is None:
                    self._memo.pop(r, None)
                else:
                    self._memo[r] = v

    def _eval(self, ins: Instruction) -> LinearForm:
        op = ins.opcode
        if ins.guard is not None:
            srcs = [self.operand(o) for o in ins.operands[1:]]
            return _opaque(*srcs, self.register(ins.guard))
        if op in ("ld", "ldu"):
            name = param_name(ins)
            if name is not None:
                if name in self.args:
                    return _known(int(self.args[name]))
                return LinearForm(0, {}, True, frozenset(), frozenset({name}))
            addr = self.address(ins)
            return _opaque(addr) if addr is not None else _opaque()
        srcs = [self.operand(o) for o in ins.operands[1:]]
        if op in _COPY and len(srcs) == 1:
            return srcs[0]
        if op == "cvt" and len(srcs) == 1:
            types = [m for m in ins.modifiers if m[:1] in "usbf" and m[1:].isdigit()]
            if all(t[:1] != "f" for t in types):
                return srcs[0]  # integer widening/narrowing: the value, for in-range indices
            return _opaque(*srcs)
        if op == "add" and len(srcs) == 2:
            return _add(srcs[0], srcs[1])
        if op == "sub" and len(srcs) == 2:
            return _add(srcs[0], srcs[1], -1)
        if op == "neg" and len(srcs) == 1:
            return _mul(_known(-1), srcs[0])
        if op == "mul" and len(srcs) == 2 and "hi" not in ins.modifiers:
            return _mul(srcs[0], srcs[1])
        if op == "mad" and len(srcs) == 3 and "hi" not in ins.modifiers:
            return _add(_mul(srcs[0], srcs[1]), srcs[2])
        if op == "shl" and len(srcs) == 2 and srcs[1].known and not srcs[1].coefs:
            k = srcs[1].const
            if 0 <= k < 63:
                return _mul(srcs[0], _known(1 << k))
        if srcs and all(s.known and not s.coefs for s in srcs) and _int_bits(ins) is not None:
            v = _fold(op, [s.const for s in srcs])
            if v is not None:
                return _known(v)
        return _opaque(*srcs)


def _fold(op: str, v: list[int]) -> int | None:
    """Constant folding of the integer operations nvcc emits on known values."""
    if len(v) == 2:
        a, b = v
        table = {
            "and": a & b,
            "or": a | b,
            "xor": a ^ b,
            "min": min(a, b),
            "max": max(a, b),
            "shr": a >> b if 0 <= b < 64 else 0,
        }
        if op in table:
            return table[op]
        if op in ("div", "rem") and b:
            q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
            return q if op == "div" else a - b * q
    return None
