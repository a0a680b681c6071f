"""GET /devices and GET /devices/{id}: the packaged device profiles with their sources."""

from __future__ import annotations

from fastapi import APIRouter

from app.schemas.devices import DeviceList, summarize_profile
from device_profiles import DeviceProfile, default_profiles, get_profile

router = APIRouter(prefix="/devices", tags=["devices"])


@router.get("", response_model=DeviceList)
def list_devices() -> DeviceList:
    """List the device profiles and the models each can serve."""
    return DeviceList(devices=[summarize_profile(p) for p in default_profiles().values()])


@router.get("/{device_id}", response_model=DeviceProfile)
def device_detail(device_id: str) -> DeviceProfile:
    """One device profile: every figure with its value and cited source."""
    return get_profile(device_id)
