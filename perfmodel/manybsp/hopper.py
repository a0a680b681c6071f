"""Instruction classes of the Hopper (sm_90/sm_90a) asynchronous and cluster instructions.

Many-BSP's tables (many-bsp-supplementary.txt Tables 1-5..1-7) predate these instructions, and
no public source gives per-instruction latency/throughput figures for most of them on any
device (docs/model-notes.md, "Hopper instructions"). Each family below is its own instruction
class: a device profile that carries cited figures under the key has them costed like any
other row; on a profile without them the instruction is *uncosted* (class ``"uncosted"``, one
issue slot, a warning naming the opcode), never folded into an unrelated row or dropped.

``ldmatrix``/``stmatrix`` are not here: they are shared-memory accesses with a cost the PTX
ISA pins down (:func:`matrix_transactions`), costed on the ld/st.shared rows.
"""

from __future__ import annotations

from perfmodel.ptx import Instruction

__all__ = ["hopper_class", "matrix_transactions", "wgmma_n"]

#: (opcode, first modifier or None for any) -> instruction class; first match wins
_FAMILIES: tuple[tuple[str, str | None, str], ...] = (
    ("wgmma", "mma_async", "wgmma_mma_async"),  # warp-group MMA (PTX ISA 9.7.15)
    ("wgmma", None, "wgmma_sync"),  # wgmma.fence / commit_group / wait_group
    ("cp", "async", "tma_copy"),  # only cp.async.bulk*, see hopper_class
    ("cp", "reduce", "tma_copy"),  # cp.reduce.async.bulk
    ("prefetch", "tensormap", "tma_copy"),
    ("mbarrier", None, "mbarrier"),  # init, arrive, expect_tx, try_wait, ...
    ("setmaxnreg", None, "setmaxnreg"),
    ("fence", "proxy", "fence_proxy_async"),  # fence.proxy.async / .tensormap
    ("fence", "mbarrier_init", "fence_proxy_async"),
    ("elect", None, "elect_sync"),
    ("mapa", None, "cluster_shared_address"),
    ("barrier", "cluster", "barrier_cluster"),
    ("st_async", None, "st_async"),
    ("red_async", None, "st_async"),
    ("tensormap", None, "tma_copy"),
    ("griddepcontrol", None, "griddepcontrol"),
)

#: cluster special registers (PTX ISA 10.1: %clusterid ... %is_explicit_cluster)
_CLUSTER_REGISTERS = (
    "%cluster_ctarank",
    "%cluster_nctarank",
    "%cluster_ctaid",
    "%cluster_nctaid",
    "%clusterid",
    "%nclusterid",
    "%is_explicit_cluster",
)


def hopper_class(ins: Instruction) -> str | None:
    """The Hopper instruction class of ``ins``, or None for instructions of older families."""
    op = ins.opcode
    first = ins.modifiers[0] if ins.modifiers else None
    if op == "cp" and first == "async" and (len(ins.modifiers) < 2 or ins.modifiers[1] != "bulk"):
        return None  # sm_80 cp.async (LDGSTS): a global load, Table 1-5's ld.global row
    for family_op, family_mod, key in _FAMILIES:
        if op == family_op and (family_mod is None or first == family_mod):
            return key
    if op == "mov" and any(
        r.startswith(_CLUSTER_REGISTERS) for o in ins.operands[1:] for r in o.registers
    ):
        return "cluster_special_register"
    return None


def wgmma_n(ins: Instruction) -> int | None:
    """N of a ``wgmma.mma_async`` shape modifier ``m64nNkK``; None if absent."""
    for m in ins.modifiers:
        if m.startswith("m64n") and "k" in m:
            n = m[4 : m.index("k")]
            if n.isdigit():
                return int(n)
    return None


def matrix_transactions(ins: Instruction) -> int:
    """Shared-memory transactions per warp of ``ldmatrix``/``stmatrix``: one per 8x8 matrix.

    PTX ISA ("ldmatrix", "stmatrix"): ``.x1``/``.x2``/``.x4`` moves 1/2/4 matrices of 8 rows of
    16 bytes (``.b16``); one matrix is 128 bytes, what the 32 four-byte banks deliver in one
    conflict-free access.
    """
    for m in ins.modifiers:
        if m in ("x1", "x2", "x4"):
            return int(m[1:])
    return 1
