"""Which GeMM-WS pipeline model answers on a profile by default.

The paper's recurrences (eq. (1)-(3), one load in flight) are what its published A6000 figures
were measured under, so a profile whose GeMM-WS figures are published keeps them. Devices of
compute capability 8.0 and later copy asynchronously (``cp.async`` on Ampere, TMA on Hopper:
CUDA C++ Programming Guide, "Asynchronous Data Copies"), so their estimated figures default to
the async-copy variant. A calibrated profile answers under the model it was fitted with.
"""

from __future__ import annotations

from device_profiles.schema import DeviceProfile, PipelineModelName, PositiveFigure
from perfmodel.gemm_ws import SmLimits

#: first compute capability with asynchronous global-to-shared copies (cp.async, sm_80)
ASYNC_COPY_FROM_COMPUTE_CAPABILITY = (8, 0)


def _capability(profile: DeviceProfile) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in (profile.compute_capability or "").split("."))
    except ValueError:
        return None


def default_pipeline_model(profile: DeviceProfile | None) -> PipelineModelName:
    """The pipeline model of answers on ``profile`` (None: inline device_params) when the
    request names none: the calibrated profile's own ('paper' for a GeMM-WS fit stored
    without one), else 'async-copy' for estimated GeMM-WS figures of compute capability >= 8.0,
    else 'paper'."""
    if profile is None or profile.gemm_ws is None:
        return "paper"
    calibration = profile.calibration
    if calibration is not None and calibration.pipeline_model is not None:
        return calibration.pipeline_model
    if calibration is not None and calibration.model == "gemm-ws":
        # GeMM-WS fits stored without a pipeline model were fitted under the paper's (the only
        # one the fit knew): their figures, flagged estimates where the runs did not determine
        # them, belong to it
        return "paper"
    estimated = bool(profile.estimated_figures_of("gemm_ws"))
    capability = _capability(profile)
    if estimated and capability is not None and capability >= ASYNC_COPY_FROM_COMPUTE_CAPABILITY:
        return "async-copy"
    return "paper"


def sm_limits(profile: DeviceProfile, *, enforce_shared_memory: bool = True) -> SmLimits:
    """The per-SM residency limits of ``profile``'s hardware section for the async-copy model
    (docs/model-notes.md, async-copy 1 and 5): a profile without ``max_blocks_per_sm`` gets 1
    CTA per SM; ``enforce_shared_memory`` false drops the shared-memory limit."""
    hardware = profile.hardware

    def whole(figure: PositiveFigure | None) -> int | None:
        return int(figure.value) if figure is not None else None

    shared = whole(hardware.shared_memory_per_sm_bytes) if enforce_shared_memory else None
    return SmLimits(
        max_blocks_per_sm=whole(hardware.max_blocks_per_sm) or 1,
        shared_memory_per_sm_bytes=shared,
        registers_per_sm=whole(hardware.registers_per_sm),
        max_threads_per_sm=whole(hardware.max_threads_per_sm),
    )
