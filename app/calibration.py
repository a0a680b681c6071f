"""The calibration workflow behind POST /calibrate and the /devices/{id} feedback routes.

A calibration resolves its base profile, fills the figures the base lacks with starting values
flagged ``estimate`` (``convert.fit_ready``), checks what it can without a worker (fit names
and counts, PTX size, the alias), checks the runs against the device and fits in a worker
(``app/convert/calibration_core.py``: the service's process never imports the numerical
core), then stores a new content-addressed profile with the runs it was fitted to as its
record (``app/profile_store.py``). Shipped profile files are never written.

Recalibration refits from the device's whole record. A device calibrated for the model starts
again from the profile it was calibrated from (so the same runs reach the same id whichever
way they were posted); any other device starts from itself.

Ownership: a calibrated profile and its record belong to the tenant that created it, whose
name is part of its id (``convert.calibrated_id``); only that tenant or an admin may post runs
to it, recalibrate it (which moves the owner's name) or delete it. Names are looked up in the
caller's tenant's namespace, and set in the owner's (``app/profile_store.py``). Shipped
profiles are nobody's and read-only: runs posted "for" a shipped id go to
the caller's own draft record of it (``<tenant>@<id>``, ``profile_store.record_of``), and
recalibrating the shipped id from that draft makes a calibrated device of the caller's. Caps
(runs per device, profiles and bytes per tenant) are enforced by the store's own transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fastapi import Response
from pydantic import BaseModel

from app.auth import Forbidden, Principal, check_owner
from app.convert import calibrate as convert
from app.jobs import calibrate_via_pool, calibration_svg_via_pool, check_runs_via_pool
from app.negotiation import svg_response
from app.profile_store import PROFILES, DeviceGone, record_of, run_digest
from app.schemas.calibrate import (
    DEFAULT_FOLDS,
    FIGURES,
    UNITS,
    CalibrateRequest,
    CalibrateResponse,
    GemmWsMeasurementIn,
    ManyBspMeasurementIn,
    MeasurementRecord,
    MeasurementsAdded,
    MeasurementsRequest,
    RecalibrateRequest,
    RunsDeleted,
)
from app.schemas.devices import DeviceHistory, device_history
from app.service import (
    MODEL_VERSION,
    RequestFieldError,
    RequestStateConflict,
    Service,
    json_bytes_response,
)
from app.store import StoreUnavailable
from device_profiles import DeviceProfile
from device_profiles.pipeline import default_pipeline_model
from device_profiles.schema import PipelineModelName
from perfmodel.errors import CalibrationInputError

_MEASUREMENT_TYPES: dict[str, type[BaseModel]] = {
    "gemm-ws": GemmWsMeasurementIn,
    "many-bsp": ManyBspMeasurementIn,
}


def _check_count(service: Service, count: int, field: str) -> None:
    limit = service.settings.max_calibration_measurements
    if count > limit:
        raise RequestFieldError(
            field, f"{count} measured runs exceed this server's limit of {limit} per calibration"
        )


def _folds(requested: int | None, count: int) -> int:
    """The request's folds, or the default capped at the number of runs (none below 2)."""
    if requested is not None:
        return requested
    folds = min(DEFAULT_FOLDS, count)
    return folds if folds >= 2 else 0


async def calibrate(
    service: Service,
    *,
    model: str,
    base: DeviceProfile,
    base_id: str,
    root: str,
    measurements: Sequence[BaseModel],
    fit: list[str] | None,
    folds: int | None,
    name: str | None,
    time_limit_s: float,
    base_field: str,
    tenant: str,
    moving_alias_from: str | None = None,
    pipeline_model: PipelineModelName | None = None,
    warm_from: DeviceProfile | None = None,
) -> CalibrateResponse:
    """Fit, store and name a calibrated profile of ``base`` (see the module docstring);
    ``base_field`` is the request field that chose the base (named in its errors);
    ``pipeline_model``: GeMM-WS's, resolved (None for Many-BSP)."""
    profiles = service.profile_store
    _check_count(service, len(measurements), "measurements")
    names = list(fit) if fit is not None else list(FIGURES[model])
    ready, starts = convert.fit_ready(base, model, names, profiles.shipped, base_field)
    convert.check_ptx_sizes(model, measurements, service.settings.max_ptx_bytes)
    documents, order = convert.canonical(measurements)
    digest = convert.measurements_digest(documents)
    device_id = convert.calibrated_id(
        root, base, convert.fit_key(model, pipeline_model), names, digest, MODEL_VERSION, tenant
    )
    if name is not None:
        # refuse a taken name before fitting; set_alias checks again when it writes
        await asyncio.to_thread(profiles.check_alias, tenant, name, device_id, moving_alias_from)
    try:
        fitted = await calibrate_via_pool(
            service,
            model=model,
            base=ready,
            documents=documents,
            fit=fit,
            folds=_folds(folds, len(documents)),
            time_limit_s=time_limit_s,
            pipeline_model=pipeline_model,
            warm_from=warm_from,
        )
    except CalibrationInputError as exc:
        # the core names runs by their canonical position: name them as the caller sent them
        # (the same error, so its problem type, e.g. configless-runs-refused, stays)
        exc.field = convert.request_field(exc.field, order)
        raise exc from None
    fitted = convert.in_request(fitted, order, starts, ready, model)
    profile = convert.calibrated_profile(
        device_id=device_id,
        base=ready,
        base_id=base_id,
        base_digest=base.content_sha256(),
        root=root,
        model=model,
        fit=fitted,
        count=len(documents),
        digest=digest,
        created_at=datetime.now(UTC),
        pipeline_model=pipeline_model,
    )
    created = await asyncio.to_thread(profiles.save, profile, model, documents, tenant)
    if name is not None:
        await asyncio.to_thread(
            profiles.set_alias, tenant, name, device_id, moving_from=moving_alias_from
        )
    return CalibrateResponse(
        **fitted.model_dump(),
        device=device_id,
        name=name,
        created=created,
        model=model,  # type: ignore[arg-type] # one of the CalibrationModel literals
        pipeline_model=pipeline_model,
        base_device=base_id,
        unit=UNITS[model],
        measurement_count=len(documents),
        measurements_digest=digest,
    )


async def calibrate_request(
    service: Service, principal: Principal, request: CalibrateRequest
) -> CalibrateResponse:
    """POST /calibrate."""
    if (request.base_device is None) == (request.base_device_params is None):
        raise RequestFieldError(
            "base_device",
            "give either base_device (a profile id, GET /devices) or base_device_params",
        )
    if request.base_device is not None:
        base = await service.resolve_profile(request.base_device, principal, field="base_device")
        base_id = base.id
        root = base.calibration.root_device if base.calibration is not None else base.id
    else:
        assert request.base_device_params is not None
        base = convert.inline_profile(request.model, request.base_device_params)
        base_id = root = convert.INLINE
    set_fields = request.model_fields_set
    return await calibrate(
        service,
        model=request.model,
        base=base,
        base_id=base_id,
        root=root,
        measurements=request.measurements,
        fit=request.fit,
        folds=request.cross_validation_folds if "cross_validation_folds" in set_fields else None,
        name=request.name,
        time_limit_s=service.resolve_time_limit(
            request.time_limit_s if "time_limit_s" in set_fields else None
        ),
        base_field="base_device" if request.base_device is not None else "base_device_params",
        tenant=principal.tenant,
        pipeline_model=_pipeline_model(request.model, request.pipeline_model, base),
    )


async def _writable_record(
    service: Service, principal: Principal, profile: DeviceProfile
) -> tuple[str, str]:
    """(record id, tenant billed for it) of ``profile`` as ``principal`` may write it:
    Forbidden for another tenant's calibrated device (admins excepted)."""
    profiles = service.profile_store
    if profile.id in profiles.shipped:
        return record_of(profile.id, principal.tenant, profiles.shipped), principal.tenant
    owner = await asyncio.to_thread(profiles.owner, profile.id)
    if owner is None and await asyncio.to_thread(profiles.store.get, PROFILES, profile.id) is None:
        # deleted since it was looked up (its owner went with it): gone, not nobody's
        raise DeviceGone(profile.id)
    check_owner(principal, owner, profile.id)
    return profile.id, owner or principal.tenant


async def add_measurements(
    service: Service, principal: Principal, device_ref: str, request: MeasurementsRequest
) -> MeasurementsAdded:
    """POST /devices/{id}/measurements: validate against the device, then append (the store
    caps the record in the same step that writes it)."""
    profile = await service.resolve_profile(device_ref, principal)
    record_id, tenant = await _writable_record(service, principal, profile)
    profiles = service.profile_store
    ready, _ = convert.fit_ready(
        profile, request.model, FIGURES[request.model], profiles.shipped, "device"
    )
    convert.check_ptx_sizes(request.model, request.measurements, service.settings.max_ptx_bytes)
    _check_count(service, len(request.measurements), "measurements")
    documents = [m.model_dump(mode="json") for m in request.measurements]
    try:
        await check_runs_via_pool(service, request.model, ready, documents)
    except CalibrationInputError as exc:
        exc.field = convert.request_field(exc.field)
        raise exc from None
    appended = await asyncio.to_thread(profiles.append, record_id, tenant, request.model, documents)
    await service.touch(record_id)
    return MeasurementsAdded(
        device=profile.id,
        model=request.model,
        added=appended.added,
        duplicates=len(documents) - appended.added,
        total=appended.total,
        batch=appended.batch,
        digests=[run_digest(request.model, d) for d in documents],
        recalibrate_url=f"/devices/{profile.id}/recalibrate",
    )


async def measurement_record(
    service: Service, principal: Principal, device_ref: str
) -> MeasurementRecord:
    """GET /devices/{id}/measurements (for a shipped id: the caller's own draft record)."""
    profile = await service.resolve_profile(device_ref, principal)
    record_id = record_of(profile.id, principal.tenant, service.profile_store.shipped)
    record = await asyncio.to_thread(service.profile_store.record, record_id)
    gemm_ws, many_bsp = record.get("gemm-ws", []), record.get("many-bsp", [])
    return MeasurementRecord(
        device=profile.id,
        gemm_ws=gemm_ws,
        many_bsp=many_bsp,
        gemm_ws_digests=[run_digest("gemm-ws", run) for run in gemm_ws],
        many_bsp_digests=[run_digest("many-bsp", run) for run in many_bsp],
    )


def device_record(service: Service, principal: Principal, profile: DeviceProfile) -> DeviceHistory:
    """GET /devices/{id}'s history (blocking: run it off the loop); a shipped profile still
    answers while the store is unavailable, without its counts."""
    profiles = service.profile_store
    try:
        owner = profiles.owner(profile.id)
        runs = profiles.run_count(record_of(profile.id, principal.tenant, profiles.shipped))
    except StoreUnavailable:
        owner, runs = None, None
    return device_history(profile, owner, runs)


async def delete_runs(
    service: Service,
    principal: Principal,
    device_ref: str,
    *,
    batch: str | None = None,
    digest: str | None = None,
) -> RunsDeleted:
    """DELETE /devices/{id}/measurements/batches/{batch} and .../runs/{digest}."""
    profile = await service.resolve_profile(device_ref, principal)
    record_id, tenant = await _writable_record(service, principal, profile)
    deleted, total = await asyncio.to_thread(
        service.profile_store.delete_runs, record_id, tenant, batch=batch, digest=digest
    )
    return RunsDeleted(device=profile.id, deleted=deleted, total=total)


async def delete_profile(service: Service, principal: Principal, device_ref: str) -> list[str]:
    """DELETE /devices/{id}: a calibrated profile, its record and its names. Cached answers
    need no purge: their keys hold the profile's content digest (``service.versions_for``),
    which no lookup reaches once the id is gone, and identical content made again would
    answer the same."""
    profile = await service.resolve_profile(device_ref, principal)
    profiles = service.profile_store
    if profile.id in profiles.shipped:
        raise Forbidden("device", f"{profile.id} is a shipped profile: read-only, never deleted")
    record_id, tenant = await _writable_record(service, principal, profile)
    return await asyncio.to_thread(profiles.delete_profile, record_id, tenant)


def _pipeline_model(
    model: str, requested: PipelineModelName | None, profile: DeviceProfile
) -> PipelineModelName | None:
    """The GeMM-WS pipeline model a fit runs under: the request's, else ``profile``'s default
    (its calibration's, else by its figures and compute capability); None for Many-BSP."""
    if model != "gemm-ws":
        if requested is not None:
            raise RequestFieldError(
                "pipeline_model", f"pipeline_model applies to gemm-ws fits only, not {model}"
            )
        return None
    return requested if requested is not None else default_pipeline_model(profile)


def _recalibration_model(
    profile: DeviceProfile, record: dict[str, list[Any]], requested: str | None
) -> str:
    if requested is not None:
        return requested
    if profile.calibration is not None and record.get(profile.calibration.model):
        return profile.calibration.model
    recorded = sorted(m for m, runs in record.items() if runs)
    if len(recorded) == 1:
        return recorded[0]
    if not recorded:
        raise RequestStateConflict(
            "model",
            f"{profile.id} has no measured runs: POST /devices/{profile.id}/measurements first",
        )
    reason = f"{profile.id} has runs of {' and '.join(recorded)}: say which model to refit"
    raise RequestFieldError("model", reason)


async def recalibrate(
    service: Service, principal: Principal, device_ref: str, request: RecalibrateRequest
) -> CalibrateResponse:
    """POST /devices/{id}/recalibrate: refit from every recorded run, a new profile id (of the
    device's owner; for a shipped id, of the caller, from the caller's draft record)."""
    profile = await service.resolve_profile(device_ref, principal)
    profiles = service.profile_store
    record_id, tenant = await _writable_record(service, principal, profile)
    record = await asyncio.to_thread(profiles.record, record_id)
    model = _recalibration_model(profile, record, request.model)
    runs = record.get(model, [])
    if not runs:
        raise RequestFieldError(
            "model",
            f"{profile.id} has no {model} runs: POST /devices/{profile.id}/measurements first",
        )
    measurement_type = _MEASUREMENT_TYPES[model]
    # the newest runs within the limit: a record left above a since-lowered cap still refits
    runs = runs[-service.settings.max_calibration_measurements :]
    measurements = [measurement_type.model_validate(run) for run in runs]
    calibration = profile.calibration
    base, base_id, root = profile, profile.id, profile.id
    fit = request.fit
    pipeline_model = _pipeline_model(model, request.pipeline_model, profile)
    warm_from = None
    if calibration is not None:
        root = calibration.root_device
        if calibration.model == model:
            if fit is None and set(calibration.fitted) <= set(FIGURES[model]):
                # (a configuration-less fit's own figures are not a fit list: its runs refit
                # by the kind of fit they need)
                fit = list(calibration.fitted)
            if calibration.base_device != convert.INLINE:
                base = await service.resolve_profile(calibration.base_device, principal)
                base_id = base.id
            if calibration.pipeline_model == pipeline_model:
                # the fit starts where the last one ended: same runs and more, same model
                # (the multistart's cost grows with the record; 5,000 runs: 3.3 s CPU cold)
                warm_from = profile
    # recalibrating a device through its alias moves the alias to the new profile
    alias = device_ref if device_ref != profile.id else None
    set_fields = request.model_fields_set
    return await calibrate(
        service,
        model=model,
        base=base,
        base_id=base_id,
        root=root,
        measurements=measurements,
        fit=fit,
        folds=request.cross_validation_folds if "cross_validation_folds" in set_fields else None,
        name=request.name if request.name is not None else alias,
        time_limit_s=service.resolve_time_limit(
            request.time_limit_s if "time_limit_s" in set_fields else None
        ),
        base_field="device",
        tenant=tenant,
        moving_alias_from=profile.id,
        pipeline_model=pipeline_model,
        warm_from=warm_from,
    )


async def calibration_response(
    service: Service, answer: CalibrateResponse, picture: bool
) -> Response:
    """The answer of /calibrate and /recalibrate: JSON, or (``picture``: Accept asked for SVG)
    the fit drawn, measured against predicted per run with the residuals. Either way the new
    profile is stored, and ``Location`` names it."""
    headers = {"Vary": "Accept", "Location": f"/devices/{answer.device}"}
    if not picture:
        body = await asyncio.to_thread(answer.model_dump_json)
        return json_bytes_response(body.encode(), headers)
    title = f"{answer.device}: {answer.model} fit to {answer.measurement_count} runs"
    residuals = sorted(answer.residuals, key=lambda r: r.index)  # request order
    svg = await calibration_svg_via_pool(
        service,
        [r.measured for r in residuals],
        [r.predicted for r in residuals],
        [f"run {r.index}" for r in residuals],
        unit="µs" if answer.unit == "us" else "cycles",
        title=title,
    )
    response = svg_response(svg, hit=False)
    response.headers["Location"] = headers["Location"]
    return response
