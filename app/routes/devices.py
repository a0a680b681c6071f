"""The device profiles (shipped and calibrated) and their measured runs.

GET /devices, GET /devices/{id} (every figure with its source, and what each model still
needs); POST /devices/{id}/measurements and POST /devices/{id}/recalibrate close the
calibration loop (app/calibration.py).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Body, Request, Response

from app.calibration import (
    add_measurements,
    calibration_response,
    measurement_record,
    recalibrate,
)
from app.negotiation import JSON_ONLY_RESPONSES, picture_requested, require_json
from app.routes.calibrate import CALIBRATE_RESPONSES
from app.routes.json_body import OffLoopJSONRoute
from app.schemas.calibrate import (
    CalibrateResponse,
    MeasurementRecord,
    MeasurementsAdded,
    MeasurementsRequest,
    RecalibrateRequest,
)
from app.schemas.devices import (
    DeviceDetail,
    DeviceList,
    StoredProfilesState,
    detail_profile,
    summarize_profile,
)
from app.service import ServiceDep

router = APIRouter(prefix="/devices", tags=["devices"], route_class=OffLoopJSONRoute)


@router.get("", response_model=DeviceList, responses=JSON_ONLY_RESPONSES)
async def list_devices(service: ServiceDep, http_request: Request) -> DeviceList:
    """List the shipped and calibrated profiles, the models each serves, each model's status,
    and a calibrated profile's aliases and provenance; while the shared store is unavailable,
    the shipped profiles and `stored_profiles` saying why no calibrated one is listed."""
    require_json(http_request.headers.get("accept"))
    listing = await asyncio.to_thread(service.profile_store.listing)
    unavailable = listing.stored_unavailable
    return DeviceList(
        devices=[summarize_profile(p, list(names)) for p, names in listing.profiles],
        stored_profiles=StoredProfilesState(
            status="ok" if unavailable is None else "unavailable", reason=unavailable
        ),
    )


@router.get("/{device_id}", response_model=DeviceDetail, responses=JSON_ONLY_RESPONSES)
async def device_detail(device_id: str, service: ServiceDep, http_request: Request) -> DeviceDetail:
    """One device profile (shipped id, calibrated id or name): every figure with its cited
    source, and per model the figures that need calibration with the call that fills them."""
    require_json(http_request.headers.get("accept"))
    return detail_profile(await service.resolve_profile(device_id))


@router.get(
    "/{device_id}/measurements", response_model=MeasurementRecord, responses=JSON_ONLY_RESPONSES
)
async def list_measurements(
    device_id: str, service: ServiceDep, http_request: Request
) -> MeasurementRecord:
    """The measured runs recorded for a device, oldest first."""
    require_json(http_request.headers.get("accept"))
    return await measurement_record(service, device_id)


@router.post("/{device_id}/measurements", response_model=MeasurementsAdded)
async def post_measurements(
    device_id: str, request: MeasurementsRequest, service: ServiceDep
) -> MeasurementsAdded:
    """Append measured runs to a device's record (validated against the device first)."""
    return await add_measurements(service, device_id, request)


@router.post(
    "/{device_id}/recalibrate", response_model=CalibrateResponse, responses=CALIBRATE_RESPONSES
)
async def post_recalibrate(
    device_id: str,
    service: ServiceDep,
    http_request: Request,
    request: RecalibrateRequest | None = Body(None),
) -> Response:
    """Refit from every run recorded for the device; answers with a new profile id (or, with
    `Accept: image/svg+xml`, the fit drawn)."""
    picture = picture_requested(http_request.headers.get("accept"))
    answer = await recalibrate(service, device_id, request or RecalibrateRequest())
    return await calibration_response(service, answer, picture)
