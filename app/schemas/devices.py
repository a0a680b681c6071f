"""Response models of the device-profile routes."""

from __future__ import annotations

from pydantic import BaseModel, Field

from device_profiles import DeviceProfile
from device_profiles.schema import CalibrationProvenance


class DeviceSummary(BaseModel):
    id: str
    name: str
    architecture: str | None
    sm_count: int = Field(description="streaming multiprocessors")
    models: list[str] = Field(description="performance models this profile has figures for")
    aliases: list[str] = Field(default_factory=list, description="names that resolve to it")
    calibration: CalibrationProvenance | None = Field(
        default=None, description="provenance of a calibrated profile; null for shipped ones"
    )


class DeviceList(BaseModel):
    devices: list[DeviceSummary]


def summarize_profile(profile: DeviceProfile, aliases: list[str] | None = None) -> DeviceSummary:
    return DeviceSummary(
        id=profile.id,
        name=profile.name,
        architecture=profile.architecture,
        sm_count=int(profile.hardware.sm_count.value),
        models=profile.models_served(),
        aliases=aliases or [],
        calibration=profile.calibration,
    )
