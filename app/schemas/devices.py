"""Response models of the device-profile routes, and the calibration call they point at."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.schemas.base import ProfileProvenanceOut, provenance_out
from device_profiles import DeviceProfile, FigureNeed, ModelStatus, calibration_status
from device_profiles.provenance import figure_statuses, provenance
from device_profiles.schema import (
    MODEL_SECTIONS,
    CalibrationErrorSummary,
    CalibrationProvenance,
    FigurePrior,
)

#: the state of one model on one profile (device_profiles.status.ModelStatus.state)
ModelStateName = Literal[
    "served", "calibrated", "uncalibrated-estimates", "needs-calibration", "missing-figures"
]

#: keys GET /devices/{id} adds to the profile; an inline ``device_params`` drops them, so the
#: detail can be posted back as is
READ_ONLY_PROFILE_KEYS: tuple[str, ...] = (
    "needs_calibration",
    "profile_provenance",
    "figures",
    "history",
)


class DeviceSummary(BaseModel):
    id: str
    name: str
    architecture: str | None
    sm_count: int = Field(description="streaming multiprocessors")
    models: list[str] = Field(description="performance models this profile has figures for")
    model_status: dict[str, ModelStateName] = Field(
        description="per model: served, calibrated (served, fitted to measured runs of this "
        "model; figures the runs did not determine are listed as estimates held by their "
        "priors), uncalibrated-estimates (served, some figures are estimates), "
        "needs-calibration (POST /calibrate fills what is missing) or "
        "missing-figures (a figure no calibration fits must be cited first); "
        "GET /devices/{id} lists the figures"
    )
    aliases: list[str] = Field(default_factory=list, description="names that resolve to it")
    calibration: CalibrationProvenance | None = Field(
        default=None, description="provenance of a calibrated profile; null for shipped ones"
    )


class StoredProfilesState(BaseModel):
    """Whether the calibrated profiles could be read from the shared store."""

    status: Literal["ok", "unavailable"] = Field(
        description="ok: `devices` lists every profile; unavailable: the shared store "
        "(KPERF_STORE_URL) could not be read, so `devices` lists the shipped profiles only and "
        "no calibrated profile or name: retry later"
    )
    reason: str | None = Field(
        default=None, description="why the store could not be read (its error); null when ok"
    )


class DeviceList(BaseModel):
    devices: list[DeviceSummary] = Field(
        description="shipped profiles, then calibrated ones (see stored_profiles)"
    )
    stored_profiles: StoredProfilesState = Field(
        description="whether the calibrated profiles are listed: while the shared store is "
        "unavailable only the shipped profiles are, and this says so and why"
    )


class FigureNeedOut(BaseModel):
    figure: str = Field(description="dotted path in the profile, e.g. many_bsp.mu")
    state: Literal["absent", "estimate"] = Field(
        description="absent, or present as an uncalibrated estimate"
    )
    calibratable: bool = Field(description="whether POST /calibrate fits it")
    reason: str = Field(description="why no public figure is in the profile")


class CalibrateCall(BaseModel):
    """The request that fills a model's ``figures`` from runs measured on the device."""

    method: Literal["POST"] = "POST"
    path: Literal["/calibrate"] = "/calibrate"
    body: dict[str, Any] = Field(
        description="request body; measurements: the runs measured on the device"
    )
    cli: str = Field(description="the same from the command line")


class ModelCalibration(BaseModel):
    status: ModelStateName
    figures: list[FigureNeedOut] = Field(
        description="figures the model needs that a calibration run fits: absent, or "
        "uncalibrated estimates"
    )
    missing: list[FigureNeedOut] = Field(
        description="absent figures no calibration fits: a cited figure must be added to the "
        "profile before the model can serve it"
    )
    estimates: list[FigureNeedOut] = Field(
        description="uncalibrated estimates no calibration fits (served; flagged until a "
        "cited figure replaces them)"
    )
    calibrate: CalibrateCall | None = Field(
        description="the call that fills `figures`; null when there is nothing to fit"
    )


class FigureOut(BaseModel):
    figure: str = Field(description="dotted path in the profile, e.g. gemm_ws.t_init_us")
    value: float = Field(description="the value the model uses, in the unit its name gives")
    status: Literal["published", "estimated", "calibrated"] = Field(
        description="stated by a cited source, an uncalibrated estimate, or fitted to runs"
    )
    prior: FigurePrior | None = Field(
        description="log-normal prior (median in the figure's unit, sigma_log of ln value, "
        "source) of a calibratable figure; null for the others"
    )


class FigureVsPriorOut(BaseModel):
    """One fitted figure against its prior."""

    figure: str = Field(description="profile field name (its unit is in the name)")
    prior: float | None = Field(description="the prior's median, in the figure's unit")
    fitted: float = Field(description="the fitted (MAP) value, in the figure's unit")
    determined: bool = Field(
        description="whether the runs determined it; false: the prior holds it (an estimate)"
    )


class DeviceHistory(BaseModel):
    """What a device's record holds and what its fit made of it."""

    owner: str | None = Field(description="tenant that created it; null for a shipped profile")
    recorded_runs: int | None = Field(
        description="runs in the device's record (for a shipped profile: the caller's own "
        "draft record of it), from the store's counter; null while the store is unavailable"
    )
    fitted: list[str] = Field(
        default_factory=list, description="figures the fit fitted (calibrated only)"
    )
    fit_measurement_count: int | None = Field(
        default=None, description="runs the profile's fit used (calibrated only)"
    )
    training_error: CalibrationErrorSummary | None = Field(
        default=None, description="the fit's error on its own runs, % of measured"
    )
    cross_validation_error: CalibrationErrorSummary | None = Field(
        default=None, description="k-fold error on held-out runs, % of measured"
    )
    figures_vs_priors: list[FigureVsPriorOut] | None = Field(
        default=None,
        description="each fitted figure against its prior and whether the runs determined it "
        "(calibrated only)",
    )


class DeviceDetail(DeviceProfile):
    """A device profile (every figure with its source) and what each model still needs."""

    needs_calibration: dict[str, ModelCalibration] = Field(
        description="per model (gemm-ws, many-bsp): the figures that need calibration, those "
        "that must be cited first, and the call that fills the former"
    )
    profile_provenance: dict[str, ProfileProvenanceOut] = Field(
        description="per model (gemm-ws, many-bsp): what its answers' profile_provenance says"
    )
    figures: dict[str, list[FigureOut]] = Field(
        description="per model (gemm-ws, many-bsp): each scalar figure it uses, its value, "
        "status (published, estimated, calibrated) and prior"
    )
    history: DeviceHistory | None = Field(
        default=None, description="its record and fit: run count, fit errors, owner"
    )


def device_history(
    profile: DeviceProfile, owner: str | None, recorded_runs: int | None
) -> DeviceHistory:
    calibration = profile.calibration
    if calibration is None:
        return DeviceHistory(owner=owner, recorded_runs=recorded_runs)
    section = getattr(profile, MODEL_SECTIONS[calibration.model])
    versus = []
    for name in calibration.fitted:
        figure = getattr(section, name, None) if section is not None else None
        if figure is None:
            continue
        versus.append(
            FigureVsPriorOut(
                figure=name,
                prior=figure.prior.median if figure.prior is not None else None,
                fitted=figure.value,
                determined=name in calibration.determined,
            )
        )
    return DeviceHistory(
        owner=owner,
        recorded_runs=recorded_runs,
        fitted=list(calibration.fitted),
        fit_measurement_count=calibration.measurement_count,
        training_error=calibration.training_error,
        cross_validation_error=calibration.cross_validation_error,
        figures_vs_priors=versus,
    )


def calibrate_call(
    model: str,
    device_id: str,
    fit: Sequence[str],
    default_fit: Sequence[str] | None,
) -> CalibrateCall:
    """POST /calibrate (and ``kperf calibrate``) fitting ``fit`` for ``model`` on a device
    whose calibration without ``fit`` fits ``default_fit`` (None: not known here)."""
    body = {"model": model, "base_device": device_id, "fit": list(fit), "measurements": []}
    cli = f"kperf calibrate runs.jsonl --model {model} --device {device_id}"
    if default_fit is None or set(fit) != set(default_fit):
        cli += f" --fit {','.join(fit)}"  # without --fit the device's default is fitted
    return CalibrateCall(body=body, cli=cli)


def calibrate_hint(model: str, device_id: str, fit: Sequence[str]) -> str:
    """One line naming the calibration call, for error messages (the device's default fit
    is not at hand there: the command names the figures)."""
    head = json.dumps({"model": model, "base_device": device_id, "fit": list(fit)})[:-1]
    cli = calibrate_call(model, device_id, fit, None).cli
    return f'POST /calibrate {head}, "measurements": [...]}} or `{cli}`'


def _need(need: FigureNeed) -> FigureNeedOut:
    return FigureNeedOut(
        figure=need.figure, state=need.state, calibratable=need.calibratable, reason=need.reason
    )


def model_calibration(device_id: str, status: ModelStatus) -> ModelCalibration:
    return ModelCalibration(
        status=status.state,
        figures=[_need(n) for n in status.needs_calibration],
        missing=[_need(n) for n in status.missing],
        estimates=[_need(n) for n in status.estimates],
        calibrate=(
            calibrate_call(status.model, device_id, status.fit, status.default_fit)
            if status.fit
            else None
        ),
    )


def detail_profile(profile: DeviceProfile, history: DeviceHistory | None = None) -> DeviceDetail:
    listing = {
        model: model_calibration(profile.id, status)
        for model, status in calibration_status(profile).items()
    }
    figures = {
        model: [
            FigureOut(figure=f.figure, value=f.value, status=f.status, prior=f.prior)
            for f in figure_statuses(profile, model)
        ]
        for model in listing
    }
    origins = {model: provenance_out(provenance(profile, model)) for model in listing}
    return DeviceDetail.model_validate(
        {
            **profile.model_dump(),
            "needs_calibration": listing,
            "profile_provenance": origins,
            "figures": figures,
            "history": history,
        }
    )


def summarize_profile(profile: DeviceProfile, aliases: list[str] | None = None) -> DeviceSummary:
    return DeviceSummary(
        id=profile.id,
        name=profile.name,
        architecture=profile.architecture,
        sm_count=int(profile.hardware.sm_count.value),
        models=profile.models_served(),
        model_status={m: s.state for m, s in calibration_status(profile).items()},
        aliases=aliases or [],
        calibration=profile.calibration,
    )


def drop_read_only_keys(value: Any) -> Any:
    """Before-validator for an inline profile: drop what GET /devices/{id} adds."""
    if isinstance(value, dict) and any(k in value for k in READ_ONLY_PROFILE_KEYS):
        return {k: v for k, v in value.items() if k not in READ_ONLY_PROFILE_KEYS}
    return value
