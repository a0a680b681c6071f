"""Affine analysis of addresses in terms of the thread index.

Many-BSP needs n_ma, the memory transactions a warp's access makes; it follows from the byte
distance between the addresses of consecutive threads (the ``%tid.x`` stride) against the
segment size. This module evaluates address registers symbolically as

    address = c + a_x * tid.x + a_y * tid.y + a_z * tid.z

where ``c`` may be an unknown value that is the same for every thread of the block (kernel
parameters, ``%ctaid``, ``%ntid``, values loaded from a uniform address), by walking the
definitions of registers through mov/cvt/cvta/add/sub/mul/mad/shl/neg. The analysis is flow
insensitive: nvcc's PTX is in SSA form except for loop-carried registers, which are accepted when
every redefinition only adds a uniform amount (``%r = %r + uniform``), as pointer bumps and loop
counters do. Anything else (a value loaded from a thread-dependent address, ``and``/``div`` of
thread-dependent values, clocks) is "not affine" and the stride is unknown (None).

``%laneid`` is taken as ``tid.x`` (modulo the warp, consecutive lanes are consecutive
``tid.x``), which holds for blocks whose x extent is a multiple of 32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfmodel.ptx.ir import (
    UNIFORM_SPECIAL_REGISTERS,
    Function,
    Instruction,
    Operand,
    _int_literal,
)

__all__ = [
    "AddressForm",
    "AffineAnalysis",
    "InstructionIndexError",
    "address_form",
    "tid_x_stride_bytes",
]

#: opcodes that copy their (single) source, as far as the address value is concerned
_COPY_OPCODES = frozenset({"mov", "cvt", "cvta"})


@dataclass(frozen=True, slots=True)
class AddressForm:
    """``const + sum(coef[s] * s)`` over the thread symbols ``tid.x/y/z``.

    ``const`` None: unknown but the same for all threads. A coefficient None: unknown but
    uniform (e.g. ``tid.y * %ntid.x``).
    """

    const: int | None
    coefs: Mapping[str, int | None]

    @property
    def is_uniform(self) -> bool:
        return not any(v != 0 for v in self.coefs.values())


class _NotAffine(Exception):
    pass


class _Recur:
    """Placeholder for "the loop-carried register itself plus something uniform"."""

    __slots__ = ("reg",)

    def __init__(self, reg: str) -> None:
        self.reg = reg


_Val = AddressForm | _Recur

_UNIFORM = AddressForm(None, {})


def _add(a: AddressForm, b: AddressForm, sign: int = 1) -> AddressForm:
    const = None if a.const is None or b.const is None else a.const + sign * b.const
    coefs: dict[str, int | None] = dict(a.coefs)
    for s, v in b.coefs.items():
        u = coefs.get(s, 0)
        coefs[s] = None if u is None or v is None else u + sign * v
    return AddressForm(const, {s: v for s, v in coefs.items() if v != 0})


def _scale(a: AddressForm, k: int | None) -> AddressForm:
    if k is None:  # multiplied by an unknown uniform value
        return AddressForm(None, {s: None for s, v in a.coefs.items() if v != 0})
    return AddressForm(
        None if a.const is None else a.const * k,
        {s: (None if v is None else v * k) for s, v in a.coefs.items() if v != 0 and k != 0},
    )


def _mul(a: AddressForm, b: AddressForm) -> AddressForm:
    if a.is_uniform and b.is_uniform:
        if a.const is not None and b.const is not None:
            return AddressForm(a.const * b.const, {})
        return _UNIFORM
    if a.is_uniform:
        return _scale(b, a.const)
    if b.is_uniform:
        return _scale(a, b.const)
    raise _NotAffine  # product of two thread-dependent values


class AffineAnalysis:
    """Per-function analysis; :meth:`register` memoizes the form of each register."""

    def __init__(self, fn: Function) -> None:
        self.fn = fn
        defs: dict[str, list[tuple[int, Instruction]]] = {}
        for i, ins in enumerate(fn.instructions):
            for r in ins.defs:
                defs.setdefault(r, []).append((i, ins))
        self.defs = defs
        self.memo: dict[str, AddressForm | None] = {}
        self.in_progress: list[str] = []
        self.warmed = False

    def _warm(self) -> None:
        """Evaluate registers in order of first definition, so that the recursion for a use
        finds its sources memoized: long straight-line chains stay shallow."""
        self.warmed = True
        for reg in self.defs:
            if reg not in self.memo:
                try:
                    self.register(reg)
                except (_NotAffine, RecursionError):
                    self.memo.setdefault(reg, None)

    # ---- public
    def address_form(self, index: int) -> AddressForm | None:
        """Form of the address of memory instruction ``index``; None when not affine."""
        ins = self.fn.instructions[index]
        addr = _address_operand(ins)
        if addr is None:
            return None
        if not self.warmed:
            self._warm()
        try:
            form = AddressForm(addr.offset, {})
            for r in addr.registers:
                v = self._operand_reg(r)
                if isinstance(v, _Recur):
                    raise _NotAffine
                form = _add(form, v)
            return form
        except (_NotAffine, RecursionError):
            # RecursionError: a definition chain deeper than Python's stack; report "unknown"
            return None

    def tid_x_stride_bytes(self, index: int) -> int | None:
        form = self.address_form(index)
        if form is None:
            return None
        return form.coefs.get("tid.x", 0)

    # ---- evaluation
    def _operand_reg(self, reg: str) -> _Val:
        base = reg.split(".", 1)[0]
        if base == "%tid":
            axis = reg.rsplit(".", 1)[-1] if "." in reg else "x"
            return AddressForm(0, {f"tid.{axis}": 1})
        if base == "%laneid":
            return AddressForm(0, {"tid.x": 1})
        if base in UNIFORM_SPECIAL_REGISTERS:
            return _UNIFORM
        if reg in self.defs:
            return self.register(reg)
        raise _NotAffine  # never defined here (clock, envreg, .func argument...)

    def register(self, reg: str) -> _Val:
        if reg in self.memo:
            v = self.memo[reg]
            if v is None:
                raise _NotAffine
            return v
        if reg in self.in_progress:
            return _Recur(reg)
        ds = self.defs.get(reg)
        if not ds:
            raise _NotAffine
        self.in_progress.append(reg)
        cyclic = False
        try:
            results: list[_Val] = []
            for i, ins in ds:
                try:
                    results.append(self._eval(i, ins))
                except _NotAffine:
                    self.memo[reg] = None
                    raise
            recur_self = [r for r in results if isinstance(r, _Recur) and r.reg == reg]
            recur_other = [r for r in results if isinstance(r, _Recur) and r.reg != reg]
            forms = [r for r in results if isinstance(r, AddressForm)]
            if recur_other:
                # part of a cycle through an outer register: let that register decide
                cyclic = True
                return recur_other[0]
            if not forms:
                self.memo[reg] = None
                raise _NotAffine
            if len(forms) == 1 and not recur_self:
                out = forms[0]
            else:
                # several definitions (a join or a loop-carried update): same thread part
                # needed; the constant part becomes an unknown uniform value
                first = dict(forms[0].coefs)
                if any(dict(f.coefs) != first for f in forms[1:]):
                    self.memo[reg] = None
                    raise _NotAffine
                same_const = all(f.const == forms[0].const for f in forms) and not recur_self
                out = AddressForm(forms[0].const if same_const else None, first)
            self.memo[reg] = out
            return out
        finally:
            self.in_progress.pop()
            if cyclic:
                self.memo.pop(reg, None)

    def _src(self, o: Operand) -> _Val:
        if o.kind == "immediate":
            v = _int_literal(o.text)
            return AddressForm(v, {}) if v is not None else _UNIFORM  # float literal
        if o.kind in ("register", "special") and len(o.registers) == 1:
            v2 = self._operand_reg(o.registers[0])
            if o.text.startswith("-") and isinstance(v2, AddressForm):
                return _scale(v2, -1)
            return v2
        if o.kind == "symbol":  # address of a variable: the same for all threads
            return AddressForm(None, {})
        raise _NotAffine

    def _eval(self, index: int, ins: Instruction) -> _Val:
        op = ins.opcode
        srcs = ins.operands[1:]
        if op in ("ld", "ldu"):
            space = ins.state_space
            if space in ("param", "const"):
                return _UNIFORM
            addr = _address_operand(ins)
            if addr is not None and len(ins.defs) == 1:
                # every thread reading one address reads one value
                form = self.address_form(index)
                if form is not None and form.is_uniform:
                    return _UNIFORM
            raise _NotAffine
        vals: list[_Val] = [self._src(o) for o in srcs]
        if op in _COPY_OPCODES and len(vals) == 1:
            return vals[0]
        recurs = [v for v in vals if isinstance(v, _Recur)]
        forms = [v for v in vals if isinstance(v, AddressForm)]
        if recurs:
            # only "r = r + uniform" (or r - uniform) keeps the loop-carried register affine
            if op in ("add", "sub") and len(recurs) == 1 and len(forms) == 1:
                if forms[0].is_uniform and (op == "add" or vals[0] is recurs[0]):
                    return recurs[0]
            raise _NotAffine
        if op == "add" and len(forms) == 2:
            return _add(forms[0], forms[1])
        if op == "sub" and len(forms) == 2:
            return _add(forms[0], forms[1], -1)
        if op == "neg" and len(forms) == 1:
            return _scale(forms[0], -1)
        if op == "mul" and len(forms) == 2 and "hi" not in ins.modifiers:
            return _mul(forms[0], forms[1])
        if op == "mad" and len(forms) == 3 and "hi" not in ins.modifiers:
            return _add(_mul(forms[0], forms[1]), forms[2])
        if op == "shl" and len(forms) == 2 and forms[1].is_uniform:
            k = forms[1].const
            return _scale(forms[0], None if k is None else 1 << k if 0 <= k < 64 else None)
        if forms and all(f.is_uniform for f in forms) and len(forms) == len(vals):
            return _UNIFORM  # any operation on block-uniform values is block-uniform
        raise _NotAffine


def _address_operand(ins: Instruction) -> Operand | None:
    """The address a memory instruction accesses (the source of a ``cp`` copy)."""
    addrs = [o for o in ins.operands if o.kind == "address"]
    if not addrs or ins.state_space is None:
        return None
    return addrs[-1] if ins.opcode == "cp" else addrs[0]


_CACHE: list[tuple[Function, AffineAnalysis]] = []


def _analysis(fn: Function) -> AffineAnalysis:
    for f, a in _CACHE:
        if f is fn:
            return a
    a = AffineAnalysis(fn)
    _CACHE.insert(0, (fn, a))
    del _CACHE[8:]
    return a


def address_form(fn: Function, index: int) -> AddressForm | None:
    """Affine form of the address of memory instruction ``index`` of ``fn`` (None: unknown)."""
    _check_index(fn, index)
    return _analysis(fn).address_form(index)


def tid_x_stride_bytes(fn: Function, index: int) -> int | None:
    """Byte stride of the address of memory instruction ``index`` between consecutive %tid.x.

    0: every thread of a warp with the same tid.y/z uses the same address; None: cannot tell
    (not a memory instruction, or the address is not affine in the thread index).
    """
    _check_index(fn, index)
    return _analysis(fn).tid_x_stride_bytes(index)


class InstructionIndexError(ValueError):
    """An instruction index outside the function."""


def _check_index(fn: Function, index: int) -> None:
    if not 0 <= index < len(fn.instructions):
        raise InstructionIndexError(
            f"instruction index {index} out of range: {fn.name} has "
            f"{len(fn.instructions)} instructions (0-based)"
        )
