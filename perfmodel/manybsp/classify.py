"""Which row of Tables 1-5..1-7 (many-bsp-supplementary.txt) costs a PTX instruction.

Each instruction maps to an *instruction class* (a key of the device profile's
``many_bsp.instruction_classes``) and an :class:`InstructionKind`. The classes are the rows of
the latency tables: ``alu`` (add/and/mad.lo/mov/mul/sub/ld.param...), ``alu_half_rate``
(neg/setp/selp/shl/shr: half throughput on Maxwell/Pascal, Table 1-6), ``branch``,
``branch_uniform``, ``fma_f32``, ``special_register`` (mov of %tid/%ctaid), ``cvt_to_64bit``,
``cvt_from_64bit``, ``cvt`` (float <-> integer), ``cvt_int`` (integer -> integer),
``cvt_int_to_f32`` (8/16/32-bit integer -> f32; as ``cvt`` where a profile has no row of its
own), ``cvta``, ``dp_arith``, ``dp_fma``, ``sfu_div``, ``sfu_rcp``, ``sfu_sqrt``,
``ld_global``, ``st_global``, ``ld_shared``, ``st_shared``.

Documented fallback (reported as a warning, never an error): an opcode the tables have no row
for is costed as the nearest row of the same unit of Tables 1-2..1-4 (SFU functions as
``sfu_rcp``, other double-precision work as ``dp_fma``, tensor-core and other arithmetic as
``fma_f32``, integer/bit manipulation as ``alu_half_rate``, anything else as ``alu``); a class
the device profile lacks falls back to ``alu`` (or ``ld_global``/``ld_shared`` for memory).

Hopper's asynchronous and cluster instructions (``wgmma``, TMA ``cp.async.bulk``,
``mbarrier``, ``setmaxnreg``, ``fence.proxy.async``, ``elect.sync``, cluster registers) have
classes of their own (:mod:`perfmodel.manybsp.hopper`) and no fallback: without the device's
figures they are *uncosted*. ``ldmatrix``/``stmatrix`` cost one shared transaction per 8x8
matrix (PTX ISA), on the ld/st.shared rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.manybsp.hopper import hopper_class, matrix_transactions
from perfmodel.manybsp.types import InstructionKind
from perfmodel.ptx import Instruction

_ALU = frozenset(
    {"add", "sub", "and", "or", "xor", "not", "mul", "mad", "mov", "min", "max", "abs", "cnot"}
)
_ALU_HALF = frozenset({"neg", "setp", "selp", "shl", "shr", "set", "slct"})
_BIT_FALLBACK = frozenset(
    {
        "popc",
        "clz",
        "brev",
        "bfe",
        "bfi",
        "bfind",
        "prmt",
        "sad",
        "lop3",
        "shf",
        "fns",
        "dp4a",
        "dp2a",
        "mul24",
        "mad24",
        "copysign",
        "testp",
        "bmsk",
        "szext",
        "addc",
        "subc",
        "madc",
    }
)
#: source types of cvt's integer -> f32 row (wider sources convert from 64 bits, Table 1-2)
_INT_UP_TO_32 = frozenset({"u8", "u16", "u32", "s8", "s16", "s32"})
_SFU_FALLBACK = frozenset({"ex2", "lg2", "sin", "cos", "tanh", "rsqrt"})
_TENSOR = frozenset({"mma", "wmma"})
_NO_COST = frozenset({"ret", "exit", "trap", "pmevent", "nanosleep", "fence", "membar"})
_SPECIAL_IDS = ("%tid", "%ctaid")
_MEMORY_OPS = frozenset(
    {
        "ld",
        "st",
        "ldu",
        "atom",
        "red",
        "cp",
        "prefetch",
        "prefetchu",
        "tex",
        "tld4",
        "suld",
        "sust",
        "ldmatrix",
        "stmatrix",
        "cp.async",
        "multimem",
    }
)
_BARRIER_OPS = frozenset({"bar", "barrier"})


@dataclass(frozen=True)
class Classified:
    class_key: str
    kind: InstructionKind
    fallback_reason: str | None = None  # why the documented fallback applied, if it did
    #: without the device's figures for ``class_key``: uncosted (True) or the alu/ld fallback
    uncosted_without_figures: bool = False
    n_ma: int | None = None  # transactions per warp fixed by the opcode (ldmatrix/stmatrix)
    #: the classes that cost it, silently and in this order, when the device figures lack
    #: ``class_key`` (a finer row than the paper's tables: the figures of older profiles stay
    #: as they were)
    quiet_fallback: tuple[str, ...] = ()
    #: the same, with this warning (the documented fallback of the paper's tables)
    noted_fallback: tuple[str, str] | None = None


def _types(ins: Instruction) -> list[str]:
    return [m for m in ins.modifiers if m[:1] in "fubs" and m[1:].isdigit() or m == "pred"]


def classify(ins: Instruction) -> Classified | None:
    """The instruction's class and kind; ``None`` for instructions the model does not cost
    (``ret``/``exit``, fences: the paper's tables list no cost for them)."""
    op = ins.opcode
    hopper = hopper_class(ins)
    if hopper is not None:
        return Classified(hopper, InstructionKind.COMPUTE, uncosted_without_figures=True)
    types = _types(ins)
    if op in _NO_COST:
        return None
    if op in _BARRIER_OPS:
        if "sync" in ins.modifiers or "red" in ins.modifiers or not ins.modifiers:
            return Classified("bar_sync", InstructionKind.BARRIER)
        return Classified(
            "bar_sync", InstructionKind.BARRIER, f"{ins.full_opcode}: costed as bar.sync"
        )
    if op in ("bra", "brx"):
        if ins.guard is None or "uni" in ins.modifiers:
            return Classified("branch_uniform", InstructionKind.UNIFORM_BRANCH)
        return Classified("branch", InstructionKind.BRANCH)
    if op == "call":
        return Classified(
            "branch_uniform",
            InstructionKind.UNIFORM_BRANCH,
            "call: the callee's body is not analysed; costed as one uniform branch",
        )
    space = ins.state_space
    if op in _MEMORY_OPS and space is not None:
        return _memory(ins, space)
    if op == "cvta":
        return Classified("cvta", InstructionKind.COMPUTE)
    if op == "cvt":
        # Table 1-2: conversions from and to 64-bit types run at the DPU rate; the dest type
        # is the first type modifier, the source the second.
        old = "alu"
        if len(types) >= 2 and types[0].endswith("64"):
            old = "cvt_to_64bit"
        elif len(types) >= 2 and types[1].endswith("64"):
            old = "cvt_from_64bit"
        if len(types) >= 2 and all(t[:1] in "usb" for t in types[:2]):
            # integer to integer: a move or sign extension, not the conversion datapath
            # (docs/model-notes.md, "Instruction classes of sm_80/sm_86/sm_90")
            return Classified("cvt_int", InstructionKind.COMPUTE, quiet_fallback=(old,))
        if old != "alu":
            return Classified(old, InstructionKind.COMPUTE)
        # 32-bit conversions between float and integer types run on the conversion
        # datapath at a quarter of the SP rate on Ampere and Hopper (Programming Guide,
        # throughput table); profiles without a ``cvt`` row cost them as ``alu`` as before.
        # Integer -> f32 has a row of its own where the device's lowering was measured
        # (docs/model-notes.md, "Integer-to-f32 conversions on sm_90"), else it is a cvt.
        if len(types) >= 2 and types[0] == "f32" and types[1] in _INT_UP_TO_32:
            return Classified(
                "cvt_int_to_f32", InstructionKind.COMPUTE, quiet_fallback=("cvt", "alu")
            )
        return Classified("cvt", InstructionKind.COMPUTE, quiet_fallback=("alu",))
    if op == "mov" and any(r.startswith(_SPECIAL_IDS) for o in ins.operands for r in o.registers):
        return Classified("special_register", InstructionKind.COMPUTE)
    is_f64 = "f64" in types
    if is_f64:
        if op in ("fma", "mad"):
            return Classified("dp_fma", InstructionKind.COMPUTE)
        if op in ("add", "sub", "mul", "mov", "neg", "abs", "min", "max", "setp", "selp"):
            return Classified("dp_arith", InstructionKind.COMPUTE)
        return Classified(
            "dp_fma", InstructionKind.COMPUTE, f"{ins.full_opcode}: no figure; costed as fma.f64"
        )
    if op in ("fma", "mad") and ("f32" in types or "f16" in types or "f16x2" in ins.modifiers):
        return Classified("fma_f32", InstructionKind.COMPUTE)
    if op == "div" and "f32" in types:
        return Classified("sfu_div", InstructionKind.COMPUTE)
    if op == "rcp":
        return Classified("sfu_rcp", InstructionKind.COMPUTE)
    if op == "sqrt":
        return Classified("sfu_sqrt", InstructionKind.COMPUTE)
    if op in _SFU_FALLBACK:
        return Classified(
            "sfu_rcp", InstructionKind.COMPUTE, f"{ins.full_opcode}: no figure; costed as rcp.f32"
        )
    if op in _ALU_HALF:
        return Classified("alu_half_rate", InstructionKind.COMPUTE)
    if op in _ALU:
        if op == "mul" and "hi" in ins.modifiers:
            return Classified("alu_half_rate", InstructionKind.COMPUTE)
        return Classified("alu", InstructionKind.COMPUTE)
    if op in ("ld",) and space == "param":
        return Classified("alu", InstructionKind.COMPUTE)
    if op in _TENSOR:
        return Classified(
            "fma_f32", InstructionKind.COMPUTE, f"{ins.full_opcode}: no figure; costed as fma.f32"
        )
    if op in _BIT_FALLBACK or op in ("div", "rem"):
        return Classified(
            "alu_half_rate",
            InstructionKind.COMPUTE,
            f"{ins.full_opcode}: no figure; costed as an integer shift (half-rate SP row)",
        )
    return Classified(
        "alu", InstructionKind.COMPUTE, f"{ins.full_opcode}: no figure; costed as add"
    )


def _memory(ins: Instruction, space: str) -> Classified:
    op = ins.opcode
    store = op in ("st", "sust", "stmatrix") or (op == "red")
    if space == "param":
        return Classified("alu", InstructionKind.COMPUTE)  # Table 1-5: ld.param on SPs
    if op in ("ldmatrix", "stmatrix"):
        return Classified(
            "st_shared" if store else "ld_shared",
            InstructionKind.SHARED_MEMORY,
            n_ma=matrix_transactions(ins),
        )
    if space == "shared":
        reason = None if op in ("ld", "st") else f"{ins.full_opcode}: costed as ld/st.shared"
        return Classified(
            "st_shared" if store else "ld_shared", InstructionKind.SHARED_MEMORY, reason
        )
    if space == "const":
        # n_ma: one constant-cache pass per distinct address of the warp (front end)
        return Classified(
            "ld_const",
            InstructionKind.SHARED_MEMORY,
            noted_fallback=(
                "ld_shared",
                f"{ins.full_opcode}: constant cache access costed as ld.shared",
            ),
        )
    # global, local, generic, texture, async copies: off-chip communication (comm).
    reason = None
    if op not in ("ld", "st", "ldu") or space not in ("global", "local"):
        reason = f"{ins.full_opcode}: costed as {'st' if store else 'ld'}.global"
    if space in ("local",) and op in ("ld", "st"):
        reason = None
    if op in ("ld", "ldu") and space == "global" and ("nc" in ins.modifiers or op == "ldu"):
        # the read-only (texture) path: its own latency where the profile gives one
        return Classified(
            "ld_global_nc", InstructionKind.GLOBAL_MEMORY, quiet_fallback=("ld_global",)
        )
    return Classified("st_global" if store else "ld_global", InstructionKind.GLOBAL_MEMORY, reason)
