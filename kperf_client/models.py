"""What the client reads from the service's answers: small typed views, not the server's schemas.

Each model declares only the fields the client, the CLI and the sweep read, and keeps every
other field the service sends (``extra="allow"``): a newer server that adds fields still
validates, ``model_dump`` still returns the whole answer, and an undeclared field is still
reachable as an attribute (as plain JSON). Values the server constrains (enums, bounds) are
read as their JSON type: validating them is the server's job, and a newer value must not break
an older client. tests/kperf_client/test_contract.py checks every field here against the server's
OpenAPI document (name, JSON type, required-ness), so a renamed or retyped field fails a test.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)


class Answer(BaseModel):
    """Base of every answer view: unknown fields kept, values read as the server wrote them."""

    model_config = ConfigDict(extra="allow")

    #: the answer's keys in the order the service wrote them
    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        answer = handler(data)
        if isinstance(data, dict):
            answer._keys = tuple(data)
        return answer

    @model_serializer(mode="wrap")
    def _in_key_order(self, handler: SerializerFunctionWrapHandler) -> Any:
        # declared fields would otherwise come first: `kperf ... --json` prints the answer
        # as the service wrote it
        dumped = handler(self)
        if not self._keys or not isinstance(dumped, dict):
            return dumped
        ordered = {key: dumped[key] for key in self._keys if key in dumped}
        return ordered | {key: value for key, value in dumped.items() if key not in ordered}


# ---------------------------------------------------------------------------- GET /devices


class StoredProfilesState(Answer):
    status: str = Field(description="'ok', or 'unavailable' when the store could not be read")
    reason: str | None = None


class DeviceSummary(Answer):
    id: str
    name: str
    architecture: str | None = None
    sm_count: int = Field(description="streaming multiprocessors")
    models: list[str] = Field(description="performance models the profile has figures for")
    model_status: dict[str, str] = Field(default_factory=dict, description="status per model")
    aliases: list[str] = Field(default_factory=list)


class DeviceList(Answer):
    devices: list[DeviceSummary]
    stored_profiles: StoredProfilesState


# ---------------------------------------------------------------------------- GET /devices/{id}


class FigurePrior(Answer):
    median: float = Field(description="prior median, in the unit of the figure's name")
    sigma_log: float = Field(description="prior sd of ln(value)")


class ProfileFigure(Answer):
    """One figure of a profile section; its unit is in its name (``t_init_us``, ...)."""

    value: float | bool
    source: str
    estimate: bool = False
    prior: FigurePrior | None = None


class FigureNeed(Answer):
    figure: str = Field(description="dotted path in the profile, e.g. many_bsp.mu")


class CalibrateCall(Answer):
    cli: str = Field(description="the kperf command that fills the figures")


class ModelCalibration(Answer):
    status: str
    figures: list[FigureNeed] = Field(default_factory=list)
    missing: list[FigureNeed] = Field(default_factory=list)
    calibrate: CalibrateCall | None = None


class DeviceDetail(Answer):
    id: str
    name: str
    architecture: str | None = None
    #: section -> figure (or null when the profile lacks it), e.g. ``hardware["sm_count"]``
    hardware: dict[str, ProfileFigure | None]
    gemm_ws: dict[str, ProfileFigure | None] | None = None
    needs_calibration: dict[str, ModelCalibration] = Field(default_factory=dict)


# ---------------------------------------------------------------------------- /optimize-tiling


class Tiling(Answer):
    """A GeMM-WS tiling: TM x TN output tiles, TK-deep stages, buffer_depth buffers."""

    tile_m: int = Field(description="TM, elements")
    tile_n: int = Field(description="TN, elements")
    tile_k: int = Field(description="TK, elements")
    buffer_depth: int = Field(description="stages held by the shared-memory circular buffer")


class GemmWsRun(Tiling):
    """One GEMM launch: the problem, its element type and the tiling it ran with (elements)."""

    m: int
    n: int
    k: int
    dtype: str


class TilingPrediction(Tiling):
    predicted_time_us: float
    waves: int
    stages: int
    bound: str = Field(description="'latency', 'load' or 'math'")
    ctas_per_sm: int = Field(description="CTAs resident per SM (async-copy; 1 under 'paper')")
    stages_in_flight: int = Field(description="stages loading or loaded in steady state")
    load_latency_us: float | None = Field(
        default=None, description="a copy's latency in flight, us (async-copy; null: 'paper')"
    )
    group_m: int | None = Field(default=None, description="raster group rows (l2-reuse)")
    split_k: int | None = Field(default=None, description="split-K slices, 1 = none (l2-reuse)")
    #: this run, ready to post back with its measured_time_us (to ``feedback.url``)
    measurement: GemmWsRun
    probability_best: float | None = None
    interval_low_us: float | None = None
    interval_high_us: float | None = None


class RankedCandidate(TilingPrediction):
    rank: int
    why: str | None = Field(default=None, description="why this rank (the shortlist's order)")


class SolverStats(Answer):
    elapsed_ms: float


class ShortlistInfo(Answer):
    mode: str = Field(description="'explore' or 'exploit'")


class ProfileProvenance(Answer):
    kind: str = Field(description="'published', 'estimated', 'calibrated' or 'inline'")
    measurement_count: int | None = None


class Feedback(Answer):
    """Where measured times of the shortlisted tilings go to calibrate the device."""

    url: str = Field(description="path to POST measured runs to, relative to the service")
    recalibrate_url: str = Field(description="path to POST to refit from every posted run")
    model: str = "gemm-ws"


class OptimizeTilingResponse(Answer):
    status: str = Field(description="'optimal' (proven by Z3) or 'timeout'")
    device: str
    dtype: str
    pipeline_model: str = Field(description="'paper' or 'async-copy': the model that answered")
    memory_model: str | None = Field(
        default=None, description="'l2-reuse' or 'dram-stream': the memory model that answered"
    )
    best: TilingPrediction
    candidates: list[RankedCandidate]
    solver: SolverStats
    shortlist: ShortlistInfo | None = None
    profile_provenance: ProfileProvenance | None = None
    feedback: Feedback | None = None


class FieldReason(Answer):
    field: str
    reason: str


class ItemProblem(Answer):
    status: int = Field(description="HTTP status the item would have had on its own")
    title: str
    detail: str
    errors: list[FieldReason] = Field(default_factory=list)


class BatchItem(Answer):
    index: int = Field(description="position of the problem in the request")
    status: str = Field(description="'ok' or 'error'")
    cache: str | None = None
    result: OptimizeTilingResponse | None = None
    error: ItemProblem | None = None


class OptimizeTilingBatchResponse(Answer):
    items: list[BatchItem]


# ---------------------------------------------------------------------------- calibration


class CalibrationErrorSummary(Answer):
    mean_abs_pct: float | None = None
    max_abs_pct: float | None = None


class FittedFigure(Answer):
    name: str
    value: float
    identifiable: bool
    prior: FigurePrior | None = None
    interval_low: float | None = None
    interval_high: float | None = None


class CalibrateResponse(Answer):
    device: str = Field(description="id of the calibrated profile: use it as device anywhere")
    name: str | None = None
    created: bool
    model: str
    base_device: str
    measurement_count: int
    fitted: list[FittedFigure]
    training_error: CalibrationErrorSummary
    cross_validation_error: CalibrationErrorSummary | None = None
    noise_pct: float | None = None
    determined_combinations: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    configless_runs: list[int] = Field(
        default_factory=list, description="runs without a configuration (fitted as the optimum)"
    )


class MeasurementsAdded(Answer):
    device: str
    model: str
    added: int = Field(description="runs newly stored by this request")
    total: int = Field(description="runs in the device's record")


class GemmWsRunRecord(Answer):
    """A recorded GeMM-WS run; no configuration for a library's own pick."""

    m: int
    n: int
    k: int
    dtype: str
    tile_m: int | None = None
    tile_n: int | None = None
    tile_k: int | None = None
    buffer_depth: int | None = None
    measured_time_us: float


class ManyBspRunRecord(Answer):
    measured_cycles: float


class MeasurementRecord(Answer):
    device: str
    gemm_ws: list[GemmWsRunRecord]
    many_bsp: list[ManyBspRunRecord]


# ---------------------------------------------------------------------------- /tuning-table


class EngineConfig(Answer):
    """One entry of the engine's file: the six integers its Triton kernel takes."""

    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int
    num_stages: int


class TableShortlistEntry(Answer):
    tiling: Tiling
    config: EngineConfig
    predicted_time_us: float


class TableEntry(Answer):
    m: int
    config: EngineConfig
    tiling: Tiling
    predicted_time_us: float
    interval_low_us: float | None = None
    interval_high_us: float | None = None
    probability_best: float | None = None
    optimum: Tiling
    optimum_time_us: float
    loss: float = Field(description="predicted_time / optimum_time - 1")
    certified: bool
    shortlist: list[TableShortlistEntry] = Field(description="fastest by prediction, best first")


class LossOverRange(Answer):
    m_min: int
    m_max: int
    worst_loss: float = Field(description="bound over every M of the range, nearest-key lookup")
    worst_m_first: int
    worst_m_last: int
    worst_key: int


class TableSelection(Answer):
    max_distinct_configs: int | None = None
    distinct_configs: int
    worst_key_loss: float
    lower_bound_loss: float
    exact: bool


class TableSearch(Answer):
    configurations: int = Field(description="configurations asked for")
    feasible_tilings: int


class TableSolver(Answer):
    elapsed_ms: float
    cpu_ms: float
    keys_certified: int


class TuningTableResponse(Answer):
    status: str = Field(description="'optimal' (every key proven by Z3) or 'timeout'")
    device: str
    dtype: str
    pipeline_model: str
    n: int
    k: int
    format: str = Field(description="'vllm', 'sglang' or 'json'")
    file_name: str
    file: dict[str, Any] = Field(description="the file's JSON: str(M) -> entry (an object)")
    entries: list[TableEntry]
    loss_over_range: LossOverRange
    selection: TableSelection
    search: TableSearch
    solver: TableSolver
