"""Request and response models of calibration: POST /calibrate, POST /devices/{id}/measurements,
POST /devices/{id}/recalibrate (the HTTP boundary only; the fit is perfmodel.calibration's).

A measurement is one measured run of one model: GeMM-WS, the GEMM and its tiling plus
``measured_time_us``; Many-BSP, the /predict-kernel body without its device plus
``measured_cycles``. Which of the two a list holds follows from the request's ``model``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.schemas.base import RequestModel
from app.schemas.optimize import (
    DEFAULT_TIME_LIMIT_S,
    GemmWsDeviceParams,
    GemmWsRun,
    RegistersPerThread,
    ThreadsPerCta,
)
from app.schemas.predict import InlineProfile, KernelLaunch
from app.settings import MAX_CALIBRATION_MEASUREMENTS_CEILING, TIME_LIMIT_CEILING_S
from device_profiles import DeviceProfile
from device_profiles.schema import (
    CALIBRATABLE_FIGURES,
    MAX_ID_CHARS,
    MAX_LIST_ITEMS,
    MAX_NAME_CHARS,
    CalibrationErrorSummary,
    PipelineModelName,
)
from solver.search_space import MAX_BUFFER_DEPTH, MAX_TILE

CalibrationModel = Literal["gemm-ws", "many-bsp"]
#: figures each model can fit, by the name of their profile field (units in the names): the
#: profile schema's list, the same as perfmodel.calibration's GEMM_WS_FIGURES and
#: MANY_BSP_FIGURES (tests/app/test_calibrate_schemas.py), which the service's process does
#: not import (numpy, scipy: the fits run in the workers)
FIGURES: dict[str, tuple[str, ...]] = dict(CALIBRATABLE_FIGURES)
#: the unit of a model's measured and predicted values
UNITS: dict[str, Literal["us", "cycles"]] = {"gemm-ws": "us", "many-bsp": "cycles"}
DEFAULT_FOLDS = 5
MAX_FOLDS = 20
#: an alias: the profile id pattern, short enough for a store key
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
MAX_NAME_LENGTH = 64

#: keys only a measurement of the other model has: a list mixing models is refused by name
_GEMM_WS_ONLY = frozenset({"measured_time_us", "tile_m", "tile_n", "tile_k", "buffer_depth"})
_MANY_BSP_ONLY = frozenset({"ptx", "launch", "measured_cycles"})


def _not_of_other_model(data: Any, other_keys: frozenset[str], other: str, this: str) -> None:
    if isinstance(data, dict):
        found = sorted(other_keys & data.keys())
        if found:
            raise ValueError(
                f"this is a {other} measurement (it has {', '.join(found)}), but the request's "
                f"model is {this}: send it with model {other!r}"
            )


def _absent(value: object) -> bool:
    """An optional run field left out of the run's canonical form when null, so that the digest
    and the id of runs without it are what they were before it existed."""
    return value is None


#: the fields of a GeMM-WS run's configuration: a run gives all of them or none
CONFIGURATION_FIELDS = ("tile_m", "tile_n", "tile_k", "buffer_depth")
#: that rule in JSON schema: every configuration field an integer, or each absent or null
_WHOLE_OR_NO_CONFIGURATION: dict[str, Any] = {
    "anyOf": [
        {
            "required": list(CONFIGURATION_FIELDS),
            "properties": {name: {"type": "integer"} for name in CONFIGURATION_FIELDS},
        },
        {"properties": {name: {"type": "null"} for name in CONFIGURATION_FIELDS}},
    ]
}


class GemmWsMeasurementIn(GemmWsRun):
    """One measured GEMM run: the problem, the tiling it ran with, and its time. A run may
    leave out its whole configuration (``tile_m``, ``tile_n``, ``tile_k``, ``buffer_depth``):
    it is then a library's own pick (torch.matmul, cuBLAS), "the fastest kernel's time for
    this shape", fitted as the model's optimum over the default space."""

    model_config = ConfigDict(
        **{**GemmWsRun.model_config, "json_schema_extra": _WHOLE_OR_NO_CONFIGURATION}
    )
    tile_m: int | None = Field(  # type: ignore[assignment] # optional here only
        default=None, ge=1, le=MAX_TILE, exclude_if=_absent, description="TM, elements"
    )
    tile_n: int | None = Field(  # type: ignore[assignment]
        default=None, ge=1, le=MAX_TILE, exclude_if=_absent, description="TN, elements"
    )
    tile_k: int | None = Field(  # type: ignore[assignment]
        default=None, ge=1, le=MAX_TILE, exclude_if=_absent, description="TK, elements"
    )
    buffer_depth: int | None = Field(  # type: ignore[assignment]
        default=None,
        ge=1,
        le=MAX_BUFFER_DEPTH,
        exclude_if=_absent,
        description="stages held by the shared-memory circular buffer",
    )

    measured_time_us: float = Field(
        gt=0, le=1e12, allow_inf_nan=False, description="measured kernel time, us"
    )
    threads_per_cta: ThreadsPerCta | None = Field(
        default=None,
        exclude_if=_absent,
        description="threads per CTA of the kernel, when known: with registers_per_thread it "
        "limits the CTAs resident per SM under the async-copy pipeline model",
    )
    registers_per_thread: RegistersPerThread | None = Field(
        default=None,
        exclude_if=_absent,
        description="registers per thread of the kernel (ptxas -v), when known; used with "
        "threads_per_cta",
    )

    @model_validator(mode="before")
    @classmethod
    def _gemm_ws_only(cls, data: Any) -> Any:
        _not_of_other_model(data, _MANY_BSP_ONLY, "many-bsp", "gemm-ws")
        return data

    @model_validator(mode="after")
    def _whole_configuration(self) -> GemmWsMeasurementIn:
        given = [getattr(self, name) is not None for name in CONFIGURATION_FIELDS]
        if any(given) and not all(given):
            missing = [n for n, g in zip(CONFIGURATION_FIELDS, given, strict=True) if not g]
            raise ValueError(
                f"a run gives its whole configuration ({', '.join(CONFIGURATION_FIELDS)}) or "
                f"none of it; missing: {', '.join(missing)}"
            )
        return self

    @property
    def configured(self) -> bool:
        """False for a library's own pick (no configuration given)."""
        return self.tile_m is not None


class ManyBspMeasurementIn(KernelLaunch):
    """One measured kernel launch: the /predict-kernel body without device, and its cycles."""

    measured_cycles: float = Field(
        gt=0, le=1e15, allow_inf_nan=False, description="measured kernel execution, cycles"
    )

    @model_validator(mode="before")
    @classmethod
    def _many_bsp_only(cls, data: Any) -> Any:
        _not_of_other_model(data, _GEMM_WS_ONLY, "gemm-ws", "many-bsp")
        return data


Measurement = GemmWsMeasurementIn | ManyBspMeasurementIn

_MEASUREMENTS: dict[str, TypeAdapter[Any]] = {
    "gemm-ws": TypeAdapter(list[GemmWsMeasurementIn]),
    "many-bsp": TypeAdapter(list[ManyBspMeasurementIn]),
}
_BASE_PARAMS: dict[str, TypeAdapter[Any]] = {
    "gemm-ws": TypeAdapter(GemmWsDeviceParams),
    "many-bsp": TypeAdapter(InlineProfile),
}


def _for_model(adapters: dict[str, TypeAdapter[Any]], value: Any, info: ValidationInfo) -> Any:
    """Validate ``value`` as the type the already-validated ``model`` field calls for, so that
    errors name ``measurements.3.tile_m`` rather than a branch of a union."""
    model = info.data.get("model")
    if model not in adapters:
        return value  # the model field itself is invalid, and that error is reported
    return adapters[model].validate_python(value)


def _check_fit(fit: list[str] | None, info: ValidationInfo) -> list[str] | None:
    model = info.data.get("model")
    if fit is None or model not in FIGURES:
        return fit
    allowed = FIGURES[model]
    unknown = [name for name in fit if name not in allowed]
    if unknown:
        raise ValueError(
            f"unknown {model} figure(s) {', '.join(map(repr, unknown))}; choose from: "
            + ", ".join(allowed)
        )
    if len(set(fit)) != len(fit):
        raise ValueError("name each figure once")
    return fit


def _check_folds(folds: int) -> int:
    if folds == 1:
        raise ValueError(f"0 turns cross-validation off; otherwise use 2..{MAX_FOLDS} folds")
    return folds


ModelMeasurements = Annotated[
    list[GemmWsMeasurementIn] | list[ManyBspMeasurementIn],
    Field(
        min_length=1,
        max_length=MAX_CALIBRATION_MEASUREMENTS_CEILING,
        description="measured runs of the model (its measurement schema), at least one; at "
        "most the server's max_calibration_measurements",
        # on a union, pydantic writes min_length as "minLength" (strings only): an empty list
        # looked valid to clients; minItems says it
        json_schema_extra={"minItems": 1},
    ),
]
Fit = Annotated[
    # each figure named once (checked by _check_fit; uniqueItems says so in the schema)
    Annotated[
        list[Annotated[str, Field(max_length=MAX_NAME_CHARS)]],
        Field(min_length=1, max_length=MAX_LIST_ITEMS, json_schema_extra={"uniqueItems": True}),
    ]
    | None,
    Field(
        description="figures to fit, by profile field name; default: every figure of the model "
        f"(gemm-ws: {', '.join(FIGURES['gemm-ws'])}; many-bsp: {', '.join(FIGURES['many-bsp'])})",
    ),
]
Folds = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_FOLDS,
        description="k of the k-fold cross-validation, 0 = off; when not given: "
        f"{DEFAULT_FOLDS}, or the number of measurements if fewer",
        json_schema_extra={"not": {"const": 1}},  # one fold has nothing to validate on
    ),
]
Name = Annotated[
    str | None,
    Field(
        pattern=NAME_PATTERN,
        max_length=MAX_NAME_LENGTH,
        description="alias of the new profile, usable as a device id; a name taken by other "
        "content is a 409 (POST /devices/{name}/recalibrate moves it)",
    ),
]
TimeLimit = Annotated[
    float,
    Field(
        gt=0,
        le=TIME_LIMIT_CEILING_S,
        description="fitting budget, s; default and maximum are the server's settings",
    ),
]


def _of_model(model: str, measured: str, base_params: dict[str, Any] | None) -> dict[str, Any]:
    """One branch of the schemas below: runs, fitted figures and (when ``base_params`` is
    given) the inline base figures of ``model``'s kind."""
    properties: dict[str, Any] = {
        "model": {"const": model},
        "measurements": {"items": {"required": [measured]}},
        "fit": {"items": {"enum": list(FIGURES[model])}},
    }
    if model != "gemm-ws":
        properties["pipeline_model"] = {"type": "null"}  # a GeMM-WS choice only
    if base_params is not None:
        properties["base_device_params"] = base_params
    return {"properties": properties}


#: measured field of each model's runs (each kind forbids the other's fields, so requiring
#: its measured field picks the kind)
_MEASURED = (("gemm-ws", "measured_time_us"), ("many-bsp", "measured_cycles"))


def _base_params_of(model: str) -> dict[str, Any]:
    # inline base figures of the model's kind: a device profile (many-bsp) has
    # schema_version, which gemm-ws's device_params forbid
    return (
        {"type": "object", "required": ["schema_version"]}
        if model == "many-bsp"
        else {"type": "object", "not": {"required": ["schema_version"]}}
    )


#: the schema of a body with ``model``, ``measurements`` and ``fit``: the runs are the
#: model's kind and the figures fitted are the model's (anyOf: with no model, either model's)
MEASUREMENTS_OF_MODEL_SCHEMA: dict[str, Any] = {
    "anyOf": [_of_model(model, measured, None) for model, measured in _MEASURED]
}


def _calibrate_branch(model: str, measured: str, base: str) -> dict[str, Any]:
    """A /calibrate body of ``model`` whose base is ``base`` (the other base field null)."""
    branch = _of_model(model, measured, _base_params_of(model))
    other = "base_device_params" if base == "base_device" else "base_device"
    branch["properties"][other] = {"type": "null"}
    if base == "base_device":
        branch["properties"]["base_device"] = {"type": "string"}
    branch["required"] = [base]
    return branch


#: /calibrate's: as above, and exactly one base, ``base_device`` or ``base_device_params``
#: of the model's kind. One flat anyOf of model x base: an anyOf for the base beside the
#: model's (allOf of two anyOfs) made schemathesis' generation take minutes.
CALIBRATE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        _calibrate_branch(model, measured, base)
        for model, measured in _MEASURED
        for base in ("base_device", "base_device_params")
    ]
}


class _ModelChecks(RequestModel):
    """Checks against the request's ``model`` (declared first by every subclass)."""

    @field_validator("measurements", mode="before", check_fields=False)
    @classmethod
    def _measurements_of_model(cls, value: Any, info: ValidationInfo) -> Any:
        return _for_model(_MEASUREMENTS, value, info)

    @field_validator("fit", check_fields=False)
    @classmethod
    def _fit_of_model(cls, fit: list[str] | None, info: ValidationInfo) -> list[str] | None:
        return _check_fit(fit, info)

    @field_validator("cross_validation_folds", check_fields=False)
    @classmethod
    def _folds(cls, folds: int) -> int:
        return _check_folds(folds)

    @field_validator("pipeline_model", check_fields=False)
    @classmethod
    def _pipeline_of_gemm_ws(
        cls, pipeline: PipelineModelName | None, info: ValidationInfo
    ) -> PipelineModelName | None:
        model = info.data.get("model")
        if pipeline is not None and model is not None and model != "gemm-ws":
            raise ValueError(
                f"pipeline_model applies to gemm-ws fits only (model is {model!r}): leave it out"
            )
        return pipeline


PipelineModelField = Annotated[
    PipelineModelName | None,
    Field(
        description="gemm-ws only: the pipeline model the figures are fitted under, 'paper' "
        "(eq. 1-3) or 'async-copy' (loads in flight, CTAs sharing an SM: docs/model-notes.md); "
        "null: the base profile's default (its calibration's, else async-copy for estimated "
        "figures of compute capability >= 8.0, else paper). The calibrated profile records it "
        "and answers under it by default",
    ),
]


class CalibrateRequest(_ModelChecks):
    """Fit a model's figures of a base profile to measured runs: a new calibrated profile."""

    model_config = ConfigDict(json_schema_extra=CALIBRATE_SCHEMA)

    model: CalibrationModel = Field(description="the performance model whose figures to fit")
    base_device: str | None = Field(
        default=None,
        max_length=MAX_ID_CHARS,
        description="profile id or alias to start from (GET /devices)",
    )
    base_device_params: GemmWsDeviceParams | DeviceProfile | None = Field(
        default=None,
        description="inline figures to start from instead: gemm-ws, the device_params of "
        "/optimize-tiling; many-bsp, a device profile (the fitted figures may be absent)",
    )
    name: Name = None
    fit: Fit = None
    pipeline_model: PipelineModelField = None
    measurements: ModelMeasurements
    cross_validation_folds: Folds = DEFAULT_FOLDS
    time_limit_s: TimeLimit = DEFAULT_TIME_LIMIT_S

    @field_validator("base_device_params", mode="before")
    @classmethod
    def _params_of_model(cls, value: Any, info: ValidationInfo) -> Any:
        return None if value is None else _for_model(_BASE_PARAMS, value, info)


class MeasurementsRequest(_ModelChecks):
    """Measured runs to append to a device's record."""

    model_config = ConfigDict(json_schema_extra=MEASUREMENTS_OF_MODEL_SCHEMA)

    model: CalibrationModel = Field(description="the model these runs measure")
    measurements: ModelMeasurements


class RecalibrateRequest(_ModelChecks):
    """Refit from every run recorded for the device; every field is optional."""

    model_config = ConfigDict(json_schema_extra=MEASUREMENTS_OF_MODEL_SCHEMA)

    model: CalibrationModel | None = Field(
        default=None,
        description="the model to refit; default: the one the device was calibrated for, or "
        "the only model it has measurements of",
    )
    name: Name = None
    fit: Fit = None
    pipeline_model: PipelineModelField = None
    cross_validation_folds: Folds = DEFAULT_FOLDS
    time_limit_s: TimeLimit = DEFAULT_TIME_LIMIT_S


class FigurePriorOut(BaseModel):
    """What was believed before the runs: ln(value) ~ Normal(ln median, sigma_log^2)."""

    median: float = Field(description="prior median, in the unit of the figure's name")
    sigma_log: float = Field(description="prior sd of ln(value) (0.1: about +-10 %)")
    source: str = Field(description="where the prior comes from (docs/model-notes.md, Priors)")


class FittedFigureOut(BaseModel):
    name: str = Field(description="profile field name of the figure (its unit is in the name)")
    value: float = Field(
        description="maximum a posteriori value, in the unit of its name; mu: dimensionless"
    )
    base_value: float | None = Field(
        description="the base profile's value, same unit; null when the base lacked the figure "
        "and the fit started from the shipped profiles' median"
    )
    standard_error: float | None = Field(
        description="posterior sd of value (Laplace approximation), same unit"
    )
    identifiable: bool = Field(
        description="true when the runs determine the figure on its own (they shrink its prior "
        "sd at least by half); false: the prior holds it, moved only as far as the determined "
        "combinations require"
    )
    estimate: bool = Field(
        default=False,
        description="true when the figure was not determined and the value is therefore an "
        "estimate (held by its prior): the calibrated profile flags it estimate: true",
    )
    prior: FigurePriorOut | None = Field(default=None, description="the figure's prior")
    interval_low: float | None = Field(
        default=None, description="10 % quantile of the posterior, same unit"
    )
    interval_high: float | None = Field(
        default=None, description="90 % quantile of the posterior, same unit"
    )


class ResidualOut(BaseModel):
    index: int = Field(description="position of the measurement in the request (or the record)")
    measured: float = Field(description="measured value: us (gemm-ws) or cycles (many-bsp)")
    predicted: float = Field(description="calibrated model's prediction, same unit")
    error_pct: float | None = Field(
        description="100 x (predicted - measured) / measured, %; null if not finite (JSON has "
        "no infinity)"
    )
    predicted_low: float | None = Field(
        default=None,
        description="10 % quantile of the prediction over the posterior, same unit (widened "
        "to contain predicted); null for held-out predictions",
    )
    predicted_high: float | None = Field(
        default=None, description="90 % quantile of the prediction over the posterior, same unit"
    )


class CalibrationFit(BaseModel):
    """What the fit found (the worker's answer)."""

    fitted: list[FittedFigureOut]
    training_error: CalibrationErrorSummary
    cross_validation_error: CalibrationErrorSummary | None = Field(
        description="error on runs each fit did not see; null when cross-validation was off"
    )
    residuals: list[ResidualOut]
    warnings: list[str]
    method: str = Field(description="fitting method")
    determined_combinations: list[str] = Field(
        default_factory=list,
        description="the combinations of figures the runs determine, in words, with their "
        "value and posterior sd (e.g. a stage's load time of the measured tiles)",
    )
    noise_pct: float | None = Field(
        default=None,
        description="relative noise of the runs the fit estimated, % (3 % assumed where the "
        "runs are too few to tell)",
    )
    effective_figures: float | None = Field(
        default=None, description="how many figures' worth the runs determine (0 .. fitted)"
    )
    posterior_mean_log: list[float] = Field(
        default_factory=list, description="posterior mean of ln(value) per fitted figure"
    )
    posterior_covariance_log: list[list[float]] = Field(
        default_factory=list, description="posterior covariance of ln(value), fitted order"
    )
    configless_runs: list[int] = Field(
        default_factory=list,
        description="indices of the runs that gave no configuration, fitted as the model's "
        "optimum over the default space (GeMM-WS; empty when every run named its tiling)",
    )


class CalibrateResponse(CalibrationFit):
    device: str = Field(description="id of the calibrated profile: use it as device anywhere")
    name: str | None = Field(description="its alias, when one was asked for")
    created: bool = Field(description="false when the same base and runs had made it before")
    model: CalibrationModel
    pipeline_model: PipelineModelName | None = Field(
        default=None,
        description="gemm-ws: the pipeline model the figures were fitted under (the profile's "
        "default for /optimize-tiling); null for many-bsp",
    )
    base_device: str = Field(description="id of the profile the fit started from")
    unit: Literal["us", "cycles"] = Field(description="unit of measured and predicted values")
    measurement_count: int = Field(description="runs the fit used")
    measurements_digest: str = Field(description="sha256 of the canonical runs, hex")


class MeasurementsAdded(BaseModel):
    device: str = Field(description="profile id the runs were recorded under")
    model: CalibrationModel
    added: int = Field(description="runs newly stored by this request")
    duplicates: int = Field(
        default=0, description="runs of this request already in the record (stored once)"
    )
    total: int = Field(
        description="runs now in the device's record (every model), counted by the store in "
        "the same transaction that wrote them"
    )
    batch: str | None = Field(
        default=None,
        description="id of this batch: DELETE /devices/{id}/measurements/batches/{batch}",
    )
    digests: list[str] = Field(
        default_factory=list,
        description="content digest of each posted run, in request order "
        "(DELETE /devices/{id}/measurements/runs/{digest})",
    )
    recalibrate_url: str = Field(description="POST here to refit from every recorded run")


class RunsDeleted(BaseModel):
    device: str = Field(description="profile id whose record changed")
    deleted: int = Field(description="runs removed by this request")
    total: int = Field(description="runs left in the record")


class ProfileDeleted(BaseModel):
    device: str = Field(description="the calibrated profile id removed, with its record")
    names: list[str] = Field(description="names that pointed at it, removed with it")


class MeasurementRecord(BaseModel):
    device: str = Field(description="profile id")
    gemm_ws: list[GemmWsMeasurementIn] = Field(description="recorded GeMM-WS runs, oldest first")
    many_bsp: list[ManyBspMeasurementIn] = Field(description="recorded Many-BSP runs, oldest first")
    gemm_ws_digests: list[str] = Field(
        default_factory=list,
        description="content digest of each GeMM-WS run, in the same order "
        "(DELETE /devices/{id}/measurements/runs/{digest})",
    )
    many_bsp_digests: list[str] = Field(
        default_factory=list, description="content digest of each Many-BSP run, in order"
    )
