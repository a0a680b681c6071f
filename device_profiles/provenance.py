"""Where a profile's figures for a model come from, as every answer reports it (issue 16):
``calibrated`` (a calibration of that model made it, with its run count), ``estimated`` (a
figure the model uses is an uncalibrated estimate), or ``published`` (every figure cited)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from device_profiles.schema import DeviceProfile

ProvenanceKind = Literal["published", "estimated", "calibrated", "inline"]
_SECTION = {"gemm-ws": "gemm_ws", "many-bsp": "many_bsp"}


@dataclass(frozen=True, slots=True)
class Provenance:
    kind: ProvenanceKind
    measurement_count: int | None
    #: dotted names of the model's figures that are estimates (empty unless estimated)
    estimated_figures: tuple[str, ...]


def provenance(profile: DeviceProfile | None, model: str) -> Provenance:
    """The provenance of ``profile``'s ``model`` figures (None: inline figures)."""
    if profile is None:
        return Provenance("inline", None, ())
    prefix = _SECTION[model] + "."
    estimates = tuple(f for f in profile.estimated_figures() if f.startswith(prefix))
    calibration = profile.calibration
    if calibration is not None and calibration.model == model:
        return Provenance("calibrated", calibration.measurement_count, estimates)
    return Provenance("estimated" if estimates else "published", None, estimates)
