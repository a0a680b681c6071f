"""Build the model's device figures from a validated device profile (device_profiles)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from device_profiles.loader import ModelNotServed
from device_profiles.schema import DeviceProfile
from perfmodel.errors import ModelInputError
from perfmodel.manybsp.frontend import ClassFigures
from perfmodel.manybsp.types import FunctionalUnit, ManyBspDevice


@dataclass(frozen=True)
class DeviceFigures:
    """Everything the predictor reads from a profile, as plain picklable data."""

    device_id: str
    device: ManyBspDevice
    classes: tuple[tuple[str, ClassFigures], ...]
    bar_sync_points: tuple[tuple[int, float], ...]  # (threads per block, overhead cycles)
    l1_hit_latency_cycles: float | None
    clock_mhz: float | None

    def class_map(self) -> dict[str, ClassFigures]:
        return dict(self.classes)

    def bar_sync_overhead_cycles(self, threads_per_block: int) -> float:
        """bar.sync overhead for a block size: linear in the block size between (and beyond)
        the measured points, as gpu-synchronization-study.txt Fig. 6 finds it linear in the
        warps per SM; never below zero."""
        pts = sorted(self.bar_sync_points)
        if len(pts) == 1:
            return pts[0][1]
        lo, hi = pts[0], pts[1]
        for a, b in zip(pts, pts[1:], strict=False):
            lo, hi = a, b
            if threads_per_block <= b[0]:
                break
        slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
        return max(0.0, lo[1] + slope * (threads_per_block - lo[0]))


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise ModelInputError(field, f"must be a finite number, got {value}")
    return value


def _count(value: float, field: str) -> int:
    """A figure that counts things (units, threads, bytes): a whole number >= 1."""
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ModelInputError(field, f"must be a whole number >= 1, got {value}")
    return int(value)


def device_from_profile(profile: DeviceProfile, field_prefix: str = "device") -> DeviceFigures:
    """The Many-BSP figures of ``profile``; :class:`ModelNotServed` lists what is missing.

    ``field_prefix`` names the request field the profile came from in error messages
    (``device`` for a packaged profile, ``device_params`` for an inline one).
    """
    missing = profile.missing_many_bsp_figures()
    mb = profile.many_bsp
    if missing or mb is None:
        raise ModelNotServed(profile.id, "many-bsp", missing)

    def val(name: str) -> float:
        fig = getattr(mb, name)
        assert fig is not None  # guaranteed by missing_many_bsp_figures()
        return _finite(float(fig.value), f"{field_prefix}.many_bsp.{name}")

    def count(name: str) -> int:
        return _count(val(name), f"{field_prefix}.many_bsp.{name}")

    points: dict[int, float] = {}
    for p in mb.bar_sync_overhead:
        _finite(p.overhead_cycles, f"{field_prefix}.many_bsp.bar_sync_overhead")
        if points.setdefault(p.threads_per_block, p.overhead_cycles) != p.overhead_cycles:
            raise ModelInputError(
                f"{field_prefix}.many_bsp.bar_sync_overhead",
                f"two different overheads for {p.threads_per_block} threads per block",
            )

    hw = profile.hardware
    device = ManyBspDevice(
        warp_size=count("warp_size"),
        n_sm=_count(hw.sm_count.value, f"{field_prefix}.hardware.sm_count"),
        n_ws=count("n_ws"),
        n_du=count("n_du"),
        issue_cycle=val("issue_cycle"),
        mem_lat_cycles=val("mem_lat_cycles"),
        warp_launch_overhead_cycles=val("warp_launch_overhead_cycles"),
        block_launch_overhead_cycles=val("block_launch_overhead_cycles"),
        max_threads_per_sm=count("max_threads_per_sm"),
        registers_per_sm=count("registers_per_sm"),
        shared_memory_per_sm_bytes=count("shared_memory_per_sm_bytes"),
        mu=val("mu"),
        max_threads_per_block=(
            int(hw.max_threads_per_block.value) if hw.max_threads_per_block else None
        ),
        shared_memory_per_block_bytes=(
            int(hw.shared_memory_per_block_bytes.value)
            if hw.shared_memory_per_block_bytes
            else None
        ),
        max_registers_per_thread=(
            int(hw.max_registers_per_thread.value) if hw.max_registers_per_thread else None
        ),
        segment_bytes=count("segment_bytes") if mb.segment_bytes else 128,
        sector_bytes=count("sector_bytes") if mb.sector_bytes else None,
        max_blocks_per_sm=int(hw.max_blocks_per_sm.value) if hw.max_blocks_per_sm else None,
        l2_hit_latency_cycles=val("l2_hit_latency_cycles") if mb.l2_hit_latency_cycles else None,
        l2_cache_bytes=count("l2_cache_bytes") if mb.l2_cache_bytes else None,
        throughput_efficiency=(val("throughput_efficiency") if mb.throughput_efficiency else 1.0),
        latency_exposed_after_eq8_stall=(
            mb.latency_exposed_after_eq8_stall.value
            if mb.latency_exposed_after_eq8_stall is not None
            else True
        ),
    )
    classes = tuple(
        (
            key,
            ClassFigures(
                fu=FunctionalUnit(c.fu),
                units_per_ws=_count(
                    c.units_per_ws, f"{field_prefix}.many_bsp.instruction_classes.{key}"
                ),
                throughput_per_ws=_finite(
                    c.throughput_per_ws, f"{field_prefix}.many_bsp.instruction_classes.{key}"
                ),
                latency_cycles=_finite(
                    c.latency_cycles, f"{field_prefix}.many_bsp.instruction_classes.{key}"
                ),
            ),
        )
        for key, c in sorted(mb.instruction_classes.items())
    )
    return DeviceFigures(
        device_id=profile.id,
        device=device,
        classes=classes,
        bar_sync_points=tuple(sorted(points.items())),
        l1_hit_latency_cycles=(
            float(mb.l1_hit_latency_cycles.value) if mb.l1_hit_latency_cycles else None
        ),
        clock_mhz=float(hw.clock_mhz.value) if hw.clock_mhz else None,
    )
