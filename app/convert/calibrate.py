"""Conversions for calibration: request schemas -> the core's measurements and base figures,
the core's result -> response schema, and a fit -> a calibrated :class:`DeviceProfile`.

Measurements are put in a canonical order (sorted by their canonical JSON) before anything
else, so that the same runs in any order give the same digest, the same id and the same fit;
``order[j]`` is the request position of canonical run ``j``, used to report indices and error
fields in the caller's terms.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from app.convert.optimize import gemm_ws_machine
from app.convert.predict import check_ptx_size, launch_to_core
from app.schemas.calibrate import (
    CalibrationFit,
    FittedFigureOut,
    GemmWsMeasurementIn,
    ManyBspMeasurementIn,
    ResidualOut,
)
from app.schemas.optimize import GemmWsDeviceParams
from device_profiles import DeviceProfile, ModelNotServed
from device_profiles.schema import CalibrationErrorSummary, CalibrationProvenance
from perfmodel.calibration import (
    CalibrationResult,
    ErrorSummary,
    GemmWsMeasurement,
    ManyBspMeasurement,
    check_gemm_ws_shared_memory,
)
from perfmodel.errors import CalibrationInputError, ModelInputError
from perfmodel.gemm_ws import GemmWsMachine
from perfmodel.manybsp import DeviceFigures, device_from_profile

#: the profile section each model's figures live in
SECTIONS = {"gemm-ws": "gemm_ws", "many-bsp": "many_bsp"}
#: base id and root of a calibration that started from inline figures
INLINE = "inline"


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def canonical(measurements: Sequence[BaseModel]) -> tuple[list[dict[str, Any]], list[int]]:
    """The runs as JSON documents in canonical order, and each one's request position."""
    documents = [m.model_dump(mode="json") for m in measurements]
    keys = [canonical_json(d) for d in documents]
    order = sorted(range(len(documents)), key=keys.__getitem__)
    return [documents[i] for i in order], order


def measurements_digest(documents: Sequence[Mapping[str, Any]]) -> str:
    """sha256 (hex) of canonically ordered runs."""
    return hashlib.sha256(canonical_json(list(documents)).encode()).hexdigest()


def profile_sha256(profile: DeviceProfile) -> str:
    return hashlib.sha256(profile.model_dump_json().encode()).hexdigest()


def calibrated_id(
    root: str,
    base: DeviceProfile,
    model: str,
    fit: Sequence[str],
    digest: str,
    model_version: str,
) -> str:
    """``<root>-cal-<12 hex>``: a digest of the base's content, the model, the fitted figures,
    the runs and the service version (a release may fit differently)."""
    key = "\n".join([profile_sha256(base), model, ",".join(sorted(fit)), digest, model_version])
    return f"{root}-cal-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


# ------------------------------------------------------------------------ base figures


def inline_profile(model: str, params: GemmWsDeviceParams | DeviceProfile) -> DeviceProfile:
    """A base given inline as a profile with id ``inline`` (gemm-ws device_params become the
    hardware and gemm_ws sections)."""
    if isinstance(params, DeviceProfile):
        return params.model_copy(update={"id": INLINE, "calibration": None})
    source = "base_device_params of the POST /calibrate request"

    def figure(value: float) -> dict[str, Any]:
        return {"value": value, "source": source}

    values = params.model_dump()
    hardware = {"sm_count": figure(values.pop("sm_count"))}
    shared = values.pop("shared_memory_per_block_bytes")
    if shared is not None:
        hardware["shared_memory_per_block_bytes"] = figure(shared)
    return DeviceProfile.model_validate(
        {
            "schema_version": 1,
            "id": INLINE,
            "name": "inline device figures",
            "hardware": hardware,
            "gemm_ws": {name: figure(v) for name, v in values.items()},
        }
    )


def starting_value(name: str, shipped: Mapping[str, DeviceProfile]) -> tuple[float, str] | None:
    """Where a fit of a Many-BSP figure the base lacks starts: the median of the shipped
    profiles that carry it, and a note saying so (None when none does)."""
    carriers = {
        p.id: getattr(p.many_bsp, name).value
        for p in shipped.values()
        if p.many_bsp is not None and getattr(p.many_bsp, name) is not None
    }
    if not carriers:
        return None
    value = float(statistics.median(carriers.values()))
    return value, f"median of the shipped profiles {', '.join(sorted(carriers))}"


def fit_ready(
    base: DeviceProfile,
    model: str,
    fit: Sequence[str],
    shipped: Mapping[str, DeviceProfile],
    field: str = "base_device",
) -> tuple[DeviceProfile, dict[str, float]]:
    """``base`` with a value for every figure the fit needs, and the starting values given to
    fitted figures it lacked; ModelNotServed names what the base lacks and no fit can supply
    (and ``field``, the request field that chose the base)."""
    if model == "gemm-ws":
        try:
            gemm_ws_machine(base)
        except ModelNotServed as exc:
            raise ModelNotServed(base.id, model, exc.missing, field) from None
        return base, {}
    updates: dict[str, Any] = {}
    unfittable = []
    for dotted in base.missing_many_bsp_figures():
        name = dotted.removeprefix("many_bsp.")
        start = starting_value(name, shipped) if name in fit else None
        if start is None:
            unfittable.append(dotted)
        else:
            updates[name] = {"value": start[0], "source": f"starting value of the fit: {start[1]}"}
    if unfittable or base.many_bsp is None:
        raise ModelNotServed(base.id, model, unfittable or ["many_bsp"], field)
    if not updates:
        return base, {}
    section = type(base.many_bsp).model_validate({**base.many_bsp.model_dump(), **updates})
    starts = {name: update["value"] for name, update in updates.items()}
    return base.model_copy(update={"many_bsp": section}), starts


# ------------------------------------------------------------------------ measurements


def check_limits(
    model: str,
    base: DeviceProfile,
    measurements: Sequence[BaseModel],
    max_ptx_bytes: int,
) -> None:
    """What the base device can refuse without a fit: tilings whose buffer exceeds its shared
    memory per block (gemm-ws), PTX over the size limit (many-bsp). Fields are request-relative."""
    if model == "gemm-ws":
        runs = [gemm_ws_measurement(m.model_dump()) for m in measurements]
        try:
            check_gemm_ws_shared_memory(gemm_ws_machine(base), runs)
        except CalibrationInputError as exc:
            raise CalibrationInputError(request_field(exc.field), exc.reason) from None
        return
    for i, m in enumerate(measurements):
        assert isinstance(m, ManyBspMeasurementIn)
        try:
            check_ptx_size(m.ptx, max_ptx_bytes)
        except ValueError as exc:
            raise ModelInputError(f"measurements.{i}.ptx", str(exc)) from None


def gemm_ws_measurement(document: Mapping[str, Any]) -> GemmWsMeasurement:
    return GemmWsMeasurement(**GemmWsMeasurementIn.model_validate(document).model_dump())


def many_bsp_measurement(document: Mapping[str, Any], device: DeviceFigures) -> ManyBspMeasurement:
    run = ManyBspMeasurementIn.model_validate(document)
    return ManyBspMeasurement(launch_to_core(run, device), run.measured_cycles)


def gemm_ws_core(
    base: DeviceProfile, documents: Sequence[Mapping[str, Any]]
) -> tuple[GemmWsMachine, list[GemmWsMeasurement]]:
    """The core's GeMM-WS machine of ``base`` and the runs."""
    return gemm_ws_machine(base), [gemm_ws_measurement(d) for d in documents]


def many_bsp_core(
    base: DeviceProfile, documents: Sequence[Mapping[str, Any]]
) -> tuple[DeviceFigures, list[ManyBspMeasurement]]:
    """The core's Many-BSP figures of ``base`` (every figure present: :func:`fit_ready`) and
    the runs, each a request on those figures."""
    device = device_from_profile(base, field_prefix="base_device")
    return device, [many_bsp_measurement(d, device) for d in documents]


#: ``measurements[3]`` or ``measurements[3].request`` in the core's error fields
_CORE_MEASUREMENT = re.compile(r"^measurements\[(\d+)\](?:\.request)?")


def request_field(core_field: str, order: Sequence[int] | None = None) -> str:
    """A core error field in the request's terms: ``measurements[3].request.launch.block`` ->
    ``measurements.<position of canonical run 3>.launch.block``; ``folds`` ->
    ``cross_validation_folds``."""
    if core_field == "folds":
        return "cross_validation_folds"
    match = _CORE_MEASUREMENT.match(core_field)
    if match is None:
        return core_field
    index = int(match[1])
    position = order[index] if order is not None and index < len(order) else index
    return f"measurements.{position}{core_field[match.end() :]}"


# ------------------------------------------------------------------------ results


def to_fit(result: CalibrationResult) -> CalibrationFit:
    """The core's result as the response schema (canonical indices; see :func:`in_request`)."""
    return CalibrationFit(
        fitted=[
            FittedFigureOut(
                name=f.name,
                value=f.value,
                base_value=f.base_value,
                standard_error=f.standard_error,
                identifiable=f.identifiable,
            )
            for f in result.fitted
        ],
        training_error=_errors(result.training_error),
        cross_validation_error=(
            _errors(result.cross_validation_error) if result.cross_validation_error else None
        ),
        residuals=[
            ResidualOut(
                index=r.index, measured=r.measured, predicted=r.predicted, error_pct=r.error_pct
            )
            for r in result.residuals
        ],
        warnings=list(result.warnings),
        method=result.method,
    )


def _errors(summary: ErrorSummary) -> CalibrationErrorSummary:
    return CalibrationErrorSummary(
        mean_abs_pct=summary.mean_abs_pct, max_abs_pct=summary.max_abs_pct
    )


_INDEX = re.compile(r"measurements\[(\d+)\]")


def in_request(
    fit: CalibrationFit, order: Sequence[int], starts: Mapping[str, float]
) -> CalibrationFit:
    """Residuals and warnings indexed by request position; no base value for the figures the
    base lacked (the fit started from ``starts``)."""
    return fit.model_copy(
        update={
            "residuals": sorted(
                (r.model_copy(update={"index": order[r.index]}) for r in fit.residuals),
                key=lambda r: r.index,
            ),
            "warnings": [
                _INDEX.sub(lambda m: f"measurements.{order[int(m[1])]}", w) for w in fit.warnings
            ],
            "fitted": [
                f.model_copy(update={"base_value": None}) if f.name in starts else f
                for f in fit.fitted
            ],
        }
    )


def calibrated_profile(
    *,
    device_id: str,
    base: DeviceProfile,
    base_id: str,
    base_digest: str,
    root: str,
    model: str,
    fit: CalibrationFit,
    count: int,
    digest: str,
    created_at: datetime,
) -> DeviceProfile:
    """``base`` (as :func:`fit_ready` filled it) with the identified figures in place, each
    citing the fit, and the provenance; a figure the runs did not identify keeps its value and
    source, with a note saying so."""
    section_name = SECTIONS[model]
    section = getattr(base, section_name)
    assert section is not None  # fit_ready() refused bases without the section
    day = created_at.date().isoformat()
    runs = f"{count} {model} measurements (sha256 {digest[:12]})"
    updates: dict[str, Any] = {}
    for f in fit.fitted:
        if f.identifiable:
            notes = [f"base value {f.base_value:.6g}" if f.base_value is not None else ""]
            if f.standard_error is not None:
                notes.append(f"standard error {f.standard_error:.4g}")
            updates[f.name] = {
                "value": f.value,
                "source": f"fitted by POST /calibrate from {runs} on {day}, base {base_id}",
                "note": "; ".join(n for n in notes if n) or None,
            }
        else:
            kept = getattr(section, f.name).model_dump()
            updates[f.name] = {**kept, "note": f"kept: {runs} did not identify it"}
    provenance = CalibrationProvenance(
        base_device=base_id,
        base_digest=base_digest,
        root_device=root,
        model=model,  # type: ignore[arg-type] # one of the CalibrationModel literals
        fitted=[f.name for f in fit.fitted],
        measurement_count=count,
        measurements_digest=digest,
        created_at=created_at,
        training_error=fit.training_error,
        cross_validation_error=fit.cross_validation_error,
        method=fit.method,
    )
    return DeviceProfile.model_validate(
        {
            **base.model_dump(),
            "id": device_id,
            "name": f"{base.name}, calibrated ({model})",
            "description": f"{base.name} with {model} figures fitted to {count} measured runs "
            f"on {day}; base profile {base_id}",
            section_name: {**section.model_dump(), **updates},
            "calibration": provenance.model_dump(),
        }
    )
