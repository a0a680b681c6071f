"""Versioned schema of a device profile file.

Every number in a profile is a :class:`Figure`: the value plus where it comes from (paper,
section/table, or public document). One pydantic model validates every file at load time;
files with an unknown ``schema_version`` are refused rather than half-read.

A profile may serve several models. Each model reads its own optional section:
``gemm_ws`` (Liu & Grover, warp-specialization GEMM model) and the Many-BSP sections. Which
models a profile can serve follows from which sections are present.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = (1,)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Figure(_Strict):
    """One cited number."""

    value: float
    source: str = Field(min_length=3, description="citation: paper + section/table, or document")
    note: str | None = None


class PositiveFigure(Figure):
    value: float = Field(gt=0)


class NonNegativeFigure(Figure):
    value: float = Field(ge=0)


class HardwareLimits(_Strict):
    """Per-SM / per-CTA hardware limits from public documentation."""

    sm_count: PositiveFigure
    shared_memory_per_block_bytes: PositiveFigure | None = None
    shared_memory_per_sm_bytes: PositiveFigure | None = None
    max_threads_per_block: PositiveFigure | None = None
    max_threads_per_sm: PositiveFigure | None = None
    registers_per_sm: PositiveFigure | None = None
    max_registers_per_thread: PositiveFigure | None = None
    clock_mhz: PositiveFigure | None = None


class GemmWsSection(_Strict):
    """Figures of the GeMM-WS model (warp-specialization-gemm-model.txt §2, §4.2).

    Units: times in microseconds; load throughput in matrix elements per microsecond;
    compute throughput in multiply-accumulates (MACs) per microsecond.
    """

    t_init_us: NonNegativeFigure
    t_epilogue_us: NonNegativeFigure
    load_startup_latency_us: NonNegativeFigure
    compute_startup_latency_us: NonNegativeFigure
    load_throughput_elements_per_us: PositiveFigure
    compute_throughput_macs_per_us: PositiveFigure


class DeviceProfile(_Strict):
    schema_version: Literal[1]
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    name: str
    architecture: str | None = None
    compute_capability: str | None = None
    description: str | None = None
    hardware: HardwareLimits
    gemm_ws: GemmWsSection | None = None

    def models_served(self) -> list[str]:
        """Names of the performance models whose figures this profile carries."""
        served = []
        if self.gemm_ws is not None:
            served.append("gemm-ws")
        return served
