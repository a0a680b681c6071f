"""GET /devices and GET /devices/{id}: the packaged device profiles with their sources."""

from __future__ import annotations

from fastapi import APIRouter

from app.schemas.devices import DeviceDetail, DeviceList, detail_profile, summarize_profile
from device_profiles import default_profiles, get_profile

router = APIRouter(prefix="/devices", tags=["devices"])


@router.get("", response_model=DeviceList)
def list_devices() -> DeviceList:
    """List the device profiles, the models each can serve, and each model's status."""
    return DeviceList(devices=[summarize_profile(p) for p in default_profiles().values()])


@router.get("/{device_id}", response_model=DeviceDetail)
def device_detail(device_id: str) -> DeviceDetail:
    """One device profile: every figure with its cited source, and per model the figures
    that need calibration with the call that fills them."""
    return detail_profile(get_profile(device_id))
