"""Many-BSP analytical model of CUDA kernels (Riahi, Savadi, Naghibzadeh; supplementary
report ``many-bsp-supplementary.txt``): BLOCK data structure, level-1/level-2 supersteps and
eq. (1)-(25), evaluated on PTX."""

from perfmodel.manybsp.device import DeviceFigures, device_from_profile
from perfmodel.manybsp.predict import PredictRequest, PredictResult, RoleResult, predict_kernel
from perfmodel.manybsp.types import BlockRow, InstructionCost, KernelEstimate, Superstep

__all__ = [
    "DeviceFigures",
    "BlockRow",
    "InstructionCost",
    "KernelEstimate",
    "PredictRequest",
    "PredictResult",
    "RoleResult",
    "Superstep",
    "device_from_profile",
    "predict_kernel",
]
