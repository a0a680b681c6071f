"""The device profiles (shipped and calibrated) and their measured runs.

GET /devices, GET /devices/{id} (every figure with its source, and what each model still
needs); POST /devices/{id}/measurements and POST /devices/{id}/recalibrate close the
calibration loop (app/calibration.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Body, Path, Request, Response
from fastapi.types import DecoratedCallable

from app.calibration import (
    add_measurements,
    calibration_response,
    delete_profile,
    delete_runs,
    device_record,
    measurement_record,
    recalibrate,
)
from app.negotiation import JSON_ONLY_RESPONSES, picture_requested, require_json
from app.profile_store import RUN_DIGEST_HEX
from app.routes.access import ReaderDep, WriteCall, WriterDep, reading_router
from app.routes.calibrate import CALIBRATE_RESPONSES
from app.schemas.calibrate import (
    CalibrateResponse,
    MeasurementRecord,
    MeasurementsAdded,
    MeasurementsRequest,
    ProfileDeleted,
    RecalibrateRequest,
    RunsDeleted,
)
from app.schemas.devices import (
    DeviceDetail,
    DeviceList,
    StoredProfilesState,
    detail_profile,
    summarize_profile,
)
from app.service import ServiceDep

router = reading_router("devices", prefix="/devices")

#: the answers of the writing routes besides their own
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "no token, or an unknown one, while the server requires tokens"},
    403: {"description": "the token's tenant does not own the device (or may only read)"},
    409: {
        "description": "a cap (runs per device, profiles or bytes per tenant) would be "
        "passed: nothing stored; the problem names the cap and the true total"
    },
}


@router.get("", response_model=DeviceList, responses=JSON_ONLY_RESPONSES)
async def list_devices(
    service: ServiceDep, principal: ReaderDep, http_request: Request
) -> DeviceList:
    """List the shipped profiles and the calibrated ones the caller may read (every tenant's
    unless the server requires tokens for reads: then the caller's own), the models each
    serves, each model's status, a calibrated profile's provenance and the caller's names
    for it (`aliases`); while the shared store is unavailable,
    the shipped profiles and `stored_profiles` saying why no calibrated one is listed."""
    require_json(http_request.headers.get("accept"))
    listing = await asyncio.to_thread(service.profile_store.listing, principal)
    unavailable = listing.stored_unavailable
    return DeviceList(
        devices=[summarize_profile(p, list(names)) for p, names in listing.profiles],
        stored_profiles=StoredProfilesState(
            status="ok" if unavailable is None else "unavailable", reason=unavailable
        ),
    )


@router.get("/{device_id}", response_model=DeviceDetail, responses=JSON_ONLY_RESPONSES)
async def device_detail(
    device_id: str, service: ServiceDep, principal: ReaderDep, http_request: Request
) -> DeviceDetail:
    """One device profile (shipped id, calibrated id or name): every figure with its cited
    source, per model the figures that need calibration with the call that fills them, and
    its history (owner, runs recorded, the fit's errors)."""
    require_json(http_request.headers.get("accept"))
    profile = await service.resolve_profile(device_id, principal)
    history = await asyncio.to_thread(device_record, service, principal, profile)
    return detail_profile(profile, history)


@router.get(
    "/{device_id}/measurements", response_model=MeasurementRecord, responses=JSON_ONLY_RESPONSES
)
async def list_measurements(
    device_id: str, service: ServiceDep, principal: ReaderDep, http_request: Request
) -> MeasurementRecord:
    """The measured runs recorded for a device, oldest first (for a shipped id: the caller's
    own draft record of it)."""
    require_json(http_request.headers.get("accept"))
    return await measurement_record(service, principal, device_id)


@router.post(
    "/{device_id}/measurements", response_model=MeasurementsAdded, responses=WRITE_RESPONSES
)
async def post_measurements(
    device_id: str, request: MeasurementsRequest, service: ServiceDep, principal: WriterDep
) -> MeasurementsAdded:
    """Add measured runs to a device's record (validated against the device first; a run
    already recorded is stored once). A shipped id's runs go to the caller's own draft record,
    which recalibrating turns into a calibrated device of the caller's."""
    return await add_measurements(service, principal, device_id, request)


def _deletes_runs(path: str) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """A route removing runs from a device's record, answering what is left of it."""
    return router.delete(path, response_model=RunsDeleted, responses=WRITE_RESPONSES)


@_deletes_runs("/{device_id}/measurements/batches/{batch}")
async def delete_batch(
    device_id: str,
    call: WriteCall,
    batch: str = Path(max_length=64, pattern=r"^[0-9a-z-]+$", description="`batch` of a post"),
) -> RunsDeleted:
    """Remove one posted batch's runs from the device's record."""
    return await delete_runs(call.service, call.principal, device_id, batch=batch)


@_deletes_runs("/{device_id}/measurements/runs/{digest}")
async def delete_run(
    device_id: str,
    call: WriteCall,
    digest: str = Path(
        pattern=rf"^[0-9a-f]{{{RUN_DIGEST_HEX}}}$",
        description="a run's content digest (its key in the record ends with it)",
    ),
) -> RunsDeleted:
    """Remove the run of one content digest from the device's record."""
    return await delete_runs(call.service, call.principal, device_id, digest=digest)


@router.delete("/{device_id}", response_model=ProfileDeleted, responses=WRITE_RESPONSES)
async def delete_device(
    device_id: str, service: ServiceDep, principal: WriterDep
) -> ProfileDeleted:
    """Remove a calibrated profile of the caller's tenant, its record and its names (shipped
    profiles are read-only: 403)."""
    profile = await service.resolve_profile(device_id, principal)
    names = await delete_profile(service, principal, profile.id)
    return ProfileDeleted(device=profile.id, names=names)


@router.post(
    "/{device_id}/recalibrate",
    response_model=CalibrateResponse,
    responses={**CALIBRATE_RESPONSES, **WRITE_RESPONSES},
)
async def post_recalibrate(
    device_id: str,
    service: ServiceDep,
    http_request: Request,
    principal: WriterDep,
    request: RecalibrateRequest | None = Body(None),
) -> Response:
    """Refit from every run recorded for the device; answers with a new profile id (or, with
    `Accept: image/svg+xml`, the fit drawn)."""
    picture = picture_requested(http_request.headers.get("accept"))
    answer = await recalibrate(service, principal, device_id, request or RecalibrateRequest())
    return await calibration_response(service, answer, picture)
