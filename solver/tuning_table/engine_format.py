"""The files serving engines read their Triton GEMM configurations from.

vLLM (``fp8_utils.get_w8a8_block_fp8_configs``) and SGLang (``fp8_kernel``, same function
name) look up one JSON file per (N, K, device, dtype, quantization block), named

    vLLM:   N={N},K={K},device_name={name},dtype=fp8_w8a8,block_shape=[{bn},{bk}].json
    SGLang: N={N},K={K},device_name={name},dtype=fp8_w8a8,block_shape=[{bn}, {bk}].json

(SGLang keeps a space after the comma), ``name`` the CUDA device name with whitespace (and,
in newer vLLM, "/") replaced by "_". The file maps ``str(M)`` to an object of integers
BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages; the loader
turns keys into ints and the kernel takes the entry whose key is nearest to the batch's M.
"""

from __future__ import annotations

import re
from enum import StrEnum

#: the integer fields of one entry, in the engines' order
ENGINE_FIELDS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)


class EngineFormat(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    #: kperf's own: the same entries with their predictions, for any dtype
    JSON = "json"


#: the engines' quantized dtype tag per kperf dtype: only block-quantized fp8 has tables there
ENGINE_DTYPES = {"fp8": "fp8_w8a8"}

#: CUDA device names (``torch.cuda.get_device_name()``) of the shipped profiles' GPUs, by the
#: profile's name: NVIDIA's product names of the SXM parts the profiles describe
_CUDA_NAMES = {
    "NVIDIA H100 (SXM5)": "NVIDIA H100 80GB HBM3",
    "NVIDIA A100 (SXM4)": "NVIDIA A100-SXM4-80GB",
    "NVIDIA RTX A6000": "NVIDIA RTX A6000",
}


def engine_device_name(profile_name: str | None, given: str | None = None) -> str | None:
    """The device's name as the engines put it in a file name (``given``: the CUDA device name
    the caller states, else the one known for the profile, a calibrated profile's by the name
    of the profile it was calibrated from), or None when unknown."""
    base = (profile_name or "").partition(", calibrated")[0]
    name = given if given is not None else _CUDA_NAMES.get(base)
    return None if name is None else re.sub(r"[\s/]+", "_", name.strip())


def engine_file_name(
    fmt: EngineFormat,
    n: int,
    k: int,
    device_name: str,
    dtype: str,
    block_shape: tuple[int, int],
) -> str:
    """The file name the engine's loader builds for this table (``device_name`` as returned
    by :func:`engine_device_name`); kperf's json format names the same facts."""
    bn, bk = block_shape
    if fmt is EngineFormat.JSON:
        return f"N={n},K={k},device_name={device_name},dtype={dtype}.kperf.json"
    separator = "," if fmt is EngineFormat.VLLM else ", "
    return (
        f"N={n},K={k},device_name={device_name},dtype={ENGINE_DTYPES[dtype]},"
        f"block_shape=[{bn}{separator}{bk}].json"
    )


def num_stages_for(buffer_depth: int, compute_capability: str | None) -> int:
    """Triton's ``num_stages`` that allocates ``buffer_depth`` A/B buffers: its software
    pipeliner keeps ``num_stages - 1`` buffers on sm_8x (cp.async) and ``num_stages`` from
    sm_90 (TMA, wgmma) (the inverse of kperf_client.triton_configs.buffer_depth_of, read off
    the compiler there); before sm_80 loads are not multi-buffered, so any depth is one
    buffer and num_stages is the depth as given. Unknown capability: the depth."""
    head = (compute_capability or "").split(".")[0]
    major = int(head) if head.isdigit() else None
    if major is not None and major == 8:
        return buffer_depth + 1
    return buffer_depth
