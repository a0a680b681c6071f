"""Response models of the device-profile routes."""

from __future__ import annotations

from pydantic import BaseModel, Field

from device_profiles import DeviceProfile


class DeviceSummary(BaseModel):
    id: str
    name: str
    architecture: str | None
    sm_count: int = Field(description="streaming multiprocessors")
    models: list[str] = Field(description="performance models this profile has figures for")


class DeviceList(BaseModel):
    devices: list[DeviceSummary]


def summarize_profile(profile: DeviceProfile) -> DeviceSummary:
    return DeviceSummary(
        id=profile.id,
        name=profile.name,
        architecture=profile.architecture,
        sm_count=int(profile.hardware.sm_count.value),
        models=profile.models_served(),
    )
