"""A straight-line interpreter of the integer part of nvcc's PTX, for one thread: the
brute-force reference the launch-evaluated analyses are checked against.

It follows control flow (``bra``, guarded ``bra``) through the registers nvcc's integer code
uses; memory reads give 0, stores and float arithmetic are skipped (their results are never
compared). It counts how often each labelled instruction and each instruction runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfmodel.ptx import Function
from perfmodel.ptx.ir import _int_literal

_CMP = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lo": lambda a, b: a < b,
    "ls": lambda a, b: a <= b,
    "hi": lambda a, b: a > b,
    "hs": lambda a, b: a >= b,
}


def _binary(op: str, a: int, b: int) -> int:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op in ("mul", "mad"):
        return a * b
    if op == "and":
        return a & b
    if op == "or":
        return a | b
    if op == "shl":
        return a << b
    return a >> b


@dataclass
class Run:
    label_visits: Counter[str]
    executed: int  #: instructions executed, ret/exit excluded
    #: executions of each instruction, by index
    at: Counter[int] = field(default_factory=Counter)


def _wrap(v: int, modifiers: tuple[str, ...]) -> int:
    for m in modifiers:
        if m[:1] in "usb" and m[1:].isdigit():
            bits = int(m[1:])
            v &= (1 << bits) - 1
            if m[0] == "s" and v >> (bits - 1):
                v -= 1 << bits
            return v
    return v


def run_thread(
    fn: Function,
    *,
    tid: tuple[int, int, int],
    ctaid: tuple[int, int, int],
    ntid: tuple[int, int, int],
    nctaid: tuple[int, int, int],
    args: Mapping[str, int],
    max_steps: int = 1_000_000,
) -> Run:
    regs: dict[str, int | float] = {}
    special = {}
    for name, vec in (("%tid", tid), ("%ctaid", ctaid), ("%ntid", ntid), ("%nctaid", nctaid)):
        for axis, v in zip("xyz", vec, strict=True):
            special[f"{name}.{axis}"] = v

    def val(text: str) -> int | float:
        if text in special:
            return special[text]
        lit = _int_literal(text)
        if lit is not None:
            return lit
        if text.startswith("0f") or text.startswith("0d"):
            return 0.0
        return regs.get(text, 0)

    visits: Counter[str] = Counter()
    at: Counter[int] = Counter()
    executed = 0
    pc = 0
    steps = 0
    instrs = fn.instructions
    while pc < len(instrs):
        steps += 1
        assert steps < max_steps, "runaway loop"
        ins = instrs[pc]
        for label in ins.labels:
            visits[label] += 1
        op = ins.opcode
        if op in ("ret", "exit"):
            break
        executed += 1
        at[pc] += 1
        if ins.guard is not None and bool(regs.get(ins.guard, 0)) == ins.guard_negated:
            pc += 1
            continue
        ops = [o.text for o in ins.operands]
        if op == "bra":
            pc = fn.label_index[ops[0]]
            continue
        integer = any(m[:1] in "usb" and m[1:].isdigit() for m in ins.modifiers) and not any(
            m[:1] == "f" and m[1:].isdigit() for m in ins.modifiers
        )
        dst = ops[0] if ops else ""
        if op == "ld" and ins.state_space == "param":
            name = ops[1].strip("[]")
            regs[dst] = args.get(name, 0)
        elif op in ("ld", "ldu"):
            regs[dst] = 0
        elif op == "setp":
            a, b = val(ops[1]), val(ops[2])
            regs[dst] = int(_CMP[ins.modifiers[0]](a, b))
        elif not integer:
            if ins.defs:
                regs[dst] = 0
        elif op in ("mov", "cvta", "cvt"):
            regs[dst] = val(ops[1])
        elif op in ("add", "sub", "mul", "and", "or", "shl", "shr", "mad"):
            a, b = int(val(ops[1])), int(val(ops[2]))
            r = _binary(op, a, b) + (int(val(ops[3])) if op == "mad" else 0)
            regs[dst] = r if "wide" in ins.modifiers else _wrap(r, ins.modifiers)
        elif ins.defs:
            raise NotImplementedError(ins.text)
        pc += 1
    return Run(visits, executed, at)
