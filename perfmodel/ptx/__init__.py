"""PTX front end: parser (``ir``), control flow and loops (``cfg``), address analysis (``affine``).

Consumed by the Many-BSP model (``perfmodel.manybsp``); knows nothing of HTTP.
"""

from perfmodel.ptx.affine import AddressForm, address_form, tid_x_stride_bytes
from perfmodel.ptx.cfg import BasicBlock, Loop, build_cfg, find_loops
from perfmodel.ptx.ir import Function, Instruction, Module, Operand, parse_module
from perfmodel.ptx.roles import WarpRole, warp_roles

__all__ = [
    "AddressForm",
    "BasicBlock",
    "Function",
    "Instruction",
    "Loop",
    "Module",
    "Operand",
    "WarpRole",
    "address_form",
    "build_cfg",
    "find_loops",
    "parse_module",
    "tid_x_stride_bytes",
    "warp_roles",
]
