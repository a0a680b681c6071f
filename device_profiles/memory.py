"""A profile's figures for the L2-aware GeMM-WS prediction (perfmodel/gemm_ws_memory_model.py):
its ``memory`` section, its MATH figures for one element type, its SMs and limits."""

from __future__ import annotations

import math

from device_profiles.pipeline import sm_limits
from device_profiles.priors import gemm_ws_dtype_ratios
from device_profiles.schema import DeviceProfile
from perfmodel.calibration.configless import Device
from perfmodel.gemm_ws import SmLimits
from perfmodel.gemm_ws_memory_model import MemoryModelFigures, Recurrences, Space
from perfmodel.gemm_ws_traffic import MemoryFigures

#: a pipeline stage's load startup over the pointer-chase DRAM latency: the RTX A6000's
#: measured DMA startup, 0.770 us (warp-specialization-gemm-model.txt §4.2.3), over its
#: sibling A40's pointer-chase DRAM latency, 314.2 ns (gpu-benches gpu-latency/a40.txt):
#: a stage's copy is issued, translated and completed, not one dependent load
LOAD_STARTUP_OVER_POINTER_CHASE = 0.770 / 0.3142
#: element types a GEMM runs on tensor cores
TENSOR_CORE_DTYPES = frozenset({"tf32", "fp16", "bf16", "fp8"})
#: from compute capability 9.0 tensor-core GEMMs issue warpgroup MMAs, whose M is 64 (PTX ISA,
#: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": wgmma.mma_async shapes m64nNkK):
#: a CTA's tile_m is a multiple of 64
WARPGROUP_MMA_M = 64
WARPGROUP_MMA_FROM = (9, 0)
#: shared memory serves 32 banks x 4 bytes per clock per SM (CUDA C++ Programming Guide,
#: "Shared Memory", compute capability 5.x and later; gpu-benches measures close to 128 B/cycle)
SHARED_MEMORY_BYTES_PER_CLOCK = 128


def memory_model_device(
    profile: DeviceProfile,
    dtype: str,
    pipeline: Recurrences = "async-copy",
    sm_count: int | None = None,
    limits: SmLimits | None = None,
    compute_throughput_macs_per_us: float | None = None,
) -> Device:
    """The profile as a :class:`Device` of the configuration-less fit. ``sm_count`` and
    ``limits`` replace the profile's (a sibling GPU's data on this profile's figures), as
    ``compute_throughput_macs_per_us`` its fp16 MATH figure (a profile whose figure is one
    kernel's measured rate, the RTX A6000's, rather than the hardware's).
    T_INIT's base is the measured kernel launch; the split-K reduction's fixed cost is a second
    launch; latencies are the pointer chase's times LOAD_STARTUP_OVER_POINTER_CHASE.
    ValueError when the profile lacks the gemm_ws or memory section or the dtype."""
    gemm, memory = profile.gemm_ws, profile.memory
    if gemm is None or memory is None:
        raise ValueError(f"profile {profile.id!r} has no gemm_ws or memory section")
    ratios = gemm_ws_dtype_ratios(profile)
    if dtype not in ratios:
        raise ValueError(f"profile {profile.id!r} has no {dtype} rate")
    sms = sm_count or int(profile.hardware.sm_count.value)
    launch = memory.kernel_launch_us.value
    clock = profile.hardware.clock_mhz
    clock_mhz = clock.value if clock is not None else math.inf
    # figures clocked with the SMs, measured at clock_mhz, at the clock the GEMM runs at
    slower = tensor_clock_ratio(profile, dtype)
    figures = MemoryModelFigures(
        t_init_us=launch,
        t_epilogue_us=gemm.t_epilogue_us.value,
        compute_startup_latency_us=gemm.compute_startup_latency_us.value,
        compute_throughput_macs_per_us=(
            compute_throughput_macs_per_us or gemm.compute_throughput_macs_per_us.value
        )
        * ratios[dtype][1],
        memory=MemoryFigures(
            sm_count=sms,
            dram_bandwidth_gb_per_s=memory.dram_bandwidth_gb_per_s.value,
            l2_bandwidth_gb_per_s=memory.l2_bandwidth_gb_per_s.value,
            l2_size_bytes=memory.l2_size_bytes.value,
            dram_latency_us=memory.dram_latency_ns.value / 1000 * LOAD_STARTUP_OVER_POINTER_CHASE,
            l2_latency_us=memory.l2_latency_ns.value / 1000 * LOAD_STARTUP_OVER_POINTER_CHASE,
            sm_clock_ratio=slower,
        ),
        reduction_overhead_us=launch,
        shared_memory_bytes_per_us=SHARED_MEMORY_BYTES_PER_CLOCK * clock_mhz * slower,
    )
    block = profile.hardware.shared_memory_per_block_bytes
    space = Space.product()
    if dtype in TENSOR_CORE_DTYPES and _capability(profile) >= WARPGROUP_MMA_FROM:
        space = space.where(space.tile_m % WARPGROUP_MMA_M == 0)
    return Device(
        base=figures,
        sm_count=sms,
        limits=limits or sm_limits(profile),
        shared_memory_per_block_bytes=int(block.value) if block is not None else None,
        pipeline=pipeline,
        space=space,
    )


def tensor_clock_ratio(profile: DeviceProfile, dtype: str) -> float:
    """The SM clock a tensor-core GEMM runs at over the profile's clock_mhz (at most 1; 1 for
    other element types or where the profile gives no tensor clock). The data sheets quote
    tensor-core rates at a boost clock below the SM's maximum (H100 SXM: 989.4 TFLOPS dense
    fp16 = 132 SMs x 4,096 FLOP per clock at 1,830 MHz, against 1,980 MHz), while the L2 and
    shared-memory figures were measured at the maximum. L2 bandwidth per SM per clock is about
    the same on GPUs of different clocks (gpu-benches gpu-l2-cache at the maximum boost
    clocks, which the files do not record: A100-80 5.4 TB/s, 108 SMs, 1,410 MHz; H100 PCIe
    7.0 TB/s, 114 SMs, 1,755 MHz; H200 9.9 TB/s, 132 SMs, 1,980 MHz: 35-38 bytes per clock
    per SM), so those figures scale with the clock, the L2 latency (cycles) inversely; DRAM's
    bandwidth and latency do not (the memory's own clock)."""
    hardware = profile.hardware
    if (
        dtype not in TENSOR_CORE_DTYPES
        or hardware.tensor_clock_mhz is None
        or hardware.clock_mhz is None
    ):
        return 1.0
    return min(1.0, hardware.tensor_clock_mhz.value / hardware.clock_mhz.value)


def _capability(profile: DeviceProfile) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in (profile.compute_capability or "0").split("."))
    except ValueError:
        return (0,)
