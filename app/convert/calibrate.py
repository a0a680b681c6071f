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

from app.convert.predict import PTXTooLarge, check_ptx_size
from app.schemas.calibrate import (
    CalibrationFit,
    ManyBspMeasurementIn,
)
from app.schemas.optimize import GemmWsDeviceParams
from device_profiles import DeviceProfile, ModelNotServed
from device_profiles.schema import (
    MODEL_SECTIONS,
    REQUIRED_GEMM_WS_FIGURES,
    CalibrationPosterior,
    CalibrationProvenance,
    PipelineModelName,
)
from perfmodel import pipelines
from perfmodel.errors import ModelInputError

#: the profile section each model's figures live in
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


def calibrated_id(
    root: str,
    base: DeviceProfile,
    model: str,
    fit: Sequence[str],
    digest: str,
    model_version: str,
    owner: str,
) -> str:
    """``<root>-cal-<12 hex>``: a digest of the base's content, the model, the fitted figures,
    the runs, the service version (a release may fit differently) and the owning tenant (the
    same runs posted by two tenants make two profiles: no tenant can make, and so claim,
    another's id)."""
    key = "\n".join(
        [base.content_sha256(), model, ",".join(sorted(fit)), digest, model_version, owner]
    )
    return f"{root}-cal-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def fit_key(model: str, pipeline_model: str | None) -> str:
    """The model part of a calibrated id's key: ``gemm-ws`` for a fit under the default
    pipeline model (the ids of profiles fitted before the pipeline models existed stay what
    they were), with the pipeline model appended for any other."""
    if pipeline_model in (None, pipelines.DEFAULT_NAME):
        return model
    return f"{model}/{pipeline_model}"


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
    # the hardware limits (shared memory per CTA; the SM's residency limits, async-copy)
    for name in ("shared_memory_per_block_bytes", *GemmWsDeviceParams.RESIDENCY_FIELDS):
        value = values.pop(name)
        if value is not None:
            hardware[name] = figure(value)
    return DeviceProfile.model_validate(
        {
            "schema_version": 1,
            "id": INLINE,
            "name": "inline device figures",
            "hardware": hardware,
            "gemm_ws": {name: figure(v) for name, v in values.items()},
        }
    )


def starting_value(
    section: str, name: str, shipped: Mapping[str, DeviceProfile]
) -> tuple[float, str] | None:
    """Where a fit of a figure the base lacks starts: the median of the shipped profiles that
    carry it (in ``section``, ``gemm_ws`` or ``many_bsp``), and where that came from (None
    when none does). A made-up number: it is stored only flagged ``estimate``."""
    carriers = {}
    for p in shipped.values():
        figures = getattr(p, section)
        figure = getattr(figures, name) if figures is not None else None
        if figure is not None and not figure.estimate:
            carriers[p.id] = figure.value
    if not carriers:
        return None
    value = float(statistics.median(carriers.values()))
    return value, f"median of the shipped profiles {', '.join(sorted(carriers))}"


def _missing(base: DeviceProfile, model: str) -> list[str]:
    if model == "gemm-ws":
        section = base.gemm_ws
        return [
            f"gemm_ws.{name}"
            for name in REQUIRED_GEMM_WS_FIGURES
            if section is None or getattr(section, name) is None
        ]
    return base.missing_many_bsp_figures()


#: the note of a starting value the fit keeps (the runs did not identify it)
STARTING_VALUE_NOTE = (
    "not measured on this device: the fit's starting value ({origin}), kept because the runs "
    "did not identify it; an estimate until runs that determine it are fitted"
)


def fit_ready(
    base: DeviceProfile,
    model: str,
    fit: Sequence[str],
    shipped: Mapping[str, DeviceProfile],
    field: str = "base_device",
) -> tuple[DeviceProfile, dict[str, float]]:
    """``base`` with a value for every figure the fit needs, and the starting values given to
    fitted figures it lacked (those figures flagged ``estimate``, schema_version 2, until the
    fit identifies them); ModelNotServed names what the base lacks and no fit can supply (and
    ``field``, the request field that chose the base)."""
    section_name = MODEL_SECTIONS[model]
    updates: dict[str, Any] = {}
    unfittable = []
    for dotted in _missing(base, model):
        name = dotted.removeprefix(f"{section_name}.")
        start = starting_value(section_name, name, shipped) if name in fit else None
        if start is None:
            unfittable.append(dotted)
        else:
            updates[name] = {
                "value": start[0],
                "source": f"starting value of the fit: {start[1]}",
                "note": STARTING_VALUE_NOTE.format(origin=start[1]),
                "estimate": True,
            }
    if unfittable:
        # every figure the base lacks, so that the calibrate hint names the whole fit
        raise ModelNotServed(base.id, model, _missing(base, model), field)
    if not updates:
        return base, {}
    section = getattr(base, section_name)
    present = section.model_dump() if section is not None else {}
    ready = DeviceProfile.model_validate(
        {
            **base.model_dump(),
            "schema_version": max(base.schema_version, 2),  # the estimate flag
            section_name: {**present, **updates},
        }
    )
    return ready, {name: update["value"] for name, update in updates.items()}


# ------------------------------------------------------------------------ measurements


def check_ptx_sizes(model: str, measurements: Sequence[BaseModel], max_ptx_bytes: int) -> None:
    """Refuse Many-BSP runs whose PTX is over the size limit, before any worker (422 naming
    ``measurements.<i>.ptx``). Every other check of a run against the device needs the core:
    :func:`app.convert.calibration_core.check_runs`, in a worker."""
    if model != "many-bsp":
        return
    for i, m in enumerate(measurements):
        assert isinstance(m, ManyBspMeasurementIn)
        try:
            check_ptx_size(m.ptx, max_ptx_bytes)
        except PTXTooLarge as exc:
            raise ModelInputError(f"measurements.{i}.ptx", str(exc)) from None


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


_INDEX = re.compile(r"measurements\[(\d+)\]")


def in_request(
    fit: CalibrationFit,
    order: Sequence[int],
    starts: Mapping[str, float],
    ready: DeviceProfile,
    model: str,
) -> CalibrationFit:
    """Residuals and warnings indexed by request position; no base value for the figures the
    base lacked (the fit started from ``starts``); every figure the runs did not determine
    flagged ``estimate`` (the prior holds it), with a warning where that prior is only a
    starting value the base lacked (:func:`fit_ready`'s made-up median) or the base's own
    estimate.
    """
    section = getattr(ready, MODEL_SECTIONS[model])
    fitted, warnings = [], []
    for f in fit.fitted:
        held_by_prior = not f.identifiable
        update: dict[str, Any] = {"estimate": held_by_prior}
        if f.name in starts:
            update["base_value"] = None
        figure = getattr(section, f.name, None)  # None: a configuration-less fit's own figure
        if held_by_prior and (f.name in starts or (figure is not None and figure.estimate)):
            origin = (
                f"the fit's starting value, {getattr(section, f.name).source.split(': ', 1)[-1]}"
                if f.name in starts
                else "the base profile's own estimate"
            )
            warnings.append(
                f"{f.name} was not determined by these runs: the calibrated profile holds it at "
                f"{f.value:.6g}, near its prior ({origin}), flagged estimate: true; it is not a "
                "measurement of this device. Add runs that vary it (e.g. other grid or problem "
                "sizes) and recalibrate"
            )
        fitted.append(f.model_copy(update=update))
    return fit.model_copy(
        update={
            "residuals": sorted(
                (r.model_copy(update={"index": order[r.index]}) for r in fit.residuals),
                key=lambda r: r.index,
            ),
            "warnings": [
                _INDEX.sub(lambda m: f"measurements.{order[int(m[1])]}", w) for w in fit.warnings
            ]
            + warnings,
            "fitted": fitted,
            "configless_runs": sorted(order[i] for i in fit.configless_runs),
        }
    )


#: where each figure of a configuration-less fit lives in a profile (section, field): the
#: stored figure is scaled by the fitted figure's ratio to its base value
#: (perfmodel/calibration/configless.py; device_profiles/memory.py builds its base from these)
CONFIGLESS_PROFILE_FIGURES: dict[str, tuple[tuple[str, str], ...]] = {
    "compute_throughput_macs_per_us": (("gemm_ws", "compute_throughput_macs_per_us"),),
    "t_epilogue_us": (("gemm_ws", "t_epilogue_us"),),
    "compute_startup_latency_us": (("gemm_ws", "compute_startup_latency_us"),),
    "t_init_us": (("memory", "kernel_launch_us"),),
    "l2_bandwidth_gb_per_s": (("memory", "l2_bandwidth_gb_per_s"),),
    "dram_bandwidth_gb_per_s": (("memory", "dram_bandwidth_gb_per_s"),),
    "load_latency_scale": (("memory", "dram_latency_ns"), ("memory", "l2_latency_ns")),
    "reduction_overhead_us": (),
}


def _configless_updates(
    base: DeviceProfile, fit: CalibrationFit, source: str
) -> dict[str, dict[str, Any]]:
    """The profile sections a configuration-less fit rewrites: each stored figure times its
    fitted figure's ratio to the base value."""
    sections: dict[str, dict[str, Any]] = {}
    for f in fit.fitted:
        assert f.base_value is not None  # a configuration-less fit starts from the profile
        for section_name, field in CONFIGLESS_PROFILE_FIGURES[f.name]:
            section = getattr(base, section_name)
            kept = getattr(section, field).model_dump()
            sections.setdefault(section_name, section.model_dump())[field] = {
                **kept,
                "value": kept["value"] * f.value / f.base_value,
                "source": source,
                "note": f"{f.name} fitted at {f.value:.6g} (base {f.base_value:.6g})",
                "estimate": False,
            }
    return sections


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
    pipeline_model: PipelineModelName | None = None,
) -> DeviceProfile:
    """``base`` (as :func:`fit_ready` filled it) with every fitted figure at its MAP value,
    citing the fit, and the provenance with the posterior. A figure the runs did not determine
    is flagged ``estimate`` (held by its prior: never a number presented as a measurement),
    with a note saying so. Written in schema_version 2."""
    section_name = MODEL_SECTIONS[model]
    section = getattr(base, section_name)
    assert section is not None  # fit_ready() refused bases without the section
    day = created_at.date().isoformat()
    runs = f"{count} {model} measurements (sha256 {digest[:12]})"
    updates: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    if fit.configless_runs:
        source = (
            f"fitted by POST /calibrate from {runs} on {day} (maximum a posteriori, "
            f"configuration-less runs as the model's optimum), base {base_id}"
        )
        sections = _configless_updates(base, fit, source)
    for f in fit.fitted:
        if fit.configless_runs:
            continue
        kept = getattr(section, f.name).model_dump()
        notes = [f"base value {f.base_value:.6g}" if f.base_value is not None else ""]
        if f.standard_error is not None:
            notes.append(f"posterior sd {f.standard_error:.4g}")
        if not f.identifiable:
            # the MAP value along a direction the runs do not see: held by the prior, an
            # estimate, never a measurement of this device (docs/model-notes.md)
            notes.append(f"{runs} did not determine it: held by its prior")
        updates[f.name] = {
            **kept,
            "value": f.value,
            "source": f"fitted by POST /calibrate from {runs} on {day} (maximum a "
            f"posteriori), base {base_id}",
            "note": "; ".join(n for n in notes if n) or None,
            "estimate": not f.identifiable,
        }
    provenance = CalibrationProvenance(
        base_device=base_id,
        base_digest=base_digest,
        root_device=root,
        model=model,  # type: ignore[arg-type] # one of the CalibrationModel literals
        pipeline_model=pipeline_model,
        fitted=[f.name for f in fit.fitted],
        measurement_count=count,
        measurements_digest=digest,
        created_at=created_at,
        training_error=fit.training_error,
        cross_validation_error=fit.cross_validation_error,
        method=fit.method,
        posterior=(
            CalibrationPosterior(
                figures=[f.name for f in fit.fitted],
                mean_log=fit.posterior_mean_log,
                covariance_log=fit.posterior_covariance_log,
            )
            if fit.posterior_mean_log
            else None
        ),
        determined=[f.name for f in fit.fitted if f.identifiable],
        noise_pct=fit.noise_pct,
    )
    return DeviceProfile.model_validate(
        {
            **base.model_dump(),
            "schema_version": max(base.schema_version, 2),
            "id": device_id,
            "name": f"{base.name}, calibrated ({fit_key(model, pipeline_model)})",
            "description": f"{base.name} with {model} figures fitted to {count} measured runs "
            f"on {day}; base profile {base_id}",
            section_name: {**section.model_dump(), **updates},
            **sections,
            "calibration": provenance.model_dump(),
        }
    )
