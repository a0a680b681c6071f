"""Versioned schema of a device profile file.

Every number in a profile is a :class:`Figure`: the value plus where it comes from (paper,
section/table, or public document). One pydantic model validates every file at load time;
files with an unknown ``schema_version`` are refused rather than half-read.

A profile may serve several models. Each model reads its own optional section:
``gemm_ws`` (Liu & Grover, warp-specialization GEMM model) and the Many-BSP sections. Which
models a profile can serve follows from which sections are present; which of the missing
figures a calibration run can fit is :mod:`device_profiles.status`.

Schema versions: 1 is the original format; 2 adds the optional ``estimate`` flag on cited
numbers (an uncalibrated starting value derived in docs/model-notes.md rather than a figure a
source states). A version-1 file may not flag estimates, so a reader that knows only version 1
never half-reads a file that relies on them. 3 adds priors and per-dtype ratios; 4 adds the
``memory`` section (DRAM and L2 latency, bandwidth and size, kernel launch time).

A calibrated profile (POST /calibrate, kept in the service's store, never a file here) also
carries a ``calibration`` provenance block; the service writes those in version 2, flagging
``estimate`` any figure it had to start from another GPU's value and the runs did not identify.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2, 3, 4)

_ESTIMATE_DESCRIPTION = (
    "true for an uncalibrated starting value derived in docs/model-notes.md (the source names "
    "what it was derived from); listed by GET /devices/{id} under needs_calibration "
    "(schema_version 2)"
)


#: size bounds of every text and list a profile holds: a profile sent inline
#: (``base_device_params``) is stored, and unbounded text filled a store tenants share
MAX_ID_CHARS = 128
MAX_NAME_CHARS = 200
MAX_SOURCE_CHARS = 1000
MAX_TEXT_CHARS = 4000
MAX_LIST_ITEMS = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FigurePrior(_Strict):
    """What a figure is believed to be before any run of the user's GPU: ln(value) ~
    Normal(ln median, sigma_log^2), cited like the figure (docs/model-notes.md, "Priors")."""

    median: float = Field(gt=0, description="prior median, in the figure's unit")
    sigma_log: float = Field(gt=0, le=5, description="sd of ln(value): 0.1 is about +-10 %")
    source: str = Field(
        min_length=3, max_length=MAX_SOURCE_CHARS, description="measurement or derivation"
    )
    note: str | None = Field(None, max_length=MAX_TEXT_CHARS)


class Figure(_Strict):
    """One cited number."""

    value: float
    source: str = Field(
        min_length=3,
        max_length=MAX_SOURCE_CHARS,
        description="citation: paper + section/table, or document",
    )
    note: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    estimate: bool = Field(False, description=_ESTIMATE_DESCRIPTION)
    prior: FigurePrior | None = Field(
        None,
        description="the figure's log-normal prior, for the MAP calibration and the "
        "uncertainty of predictions (schema_version 3)",
    )


class PositiveFigure(Figure):
    value: float = Field(gt=0)


class NonNegativeFigure(Figure):
    value: float = Field(ge=0)


class SwitchFigure(Figure):
    """A cited yes/no reading of a paper's tables (e.g. how a device's worked examples apply
    a rule the text leaves open)."""

    value: bool


class HardwareLimits(_Strict):
    """Per-SM / per-CTA hardware limits from public documentation."""

    sm_count: PositiveFigure
    #: resident CTAs per SM cap (CUDA guide technical specifications); async-copy GeMM-WS
    max_blocks_per_sm: PositiveFigure | None = None
    shared_memory_per_block_bytes: PositiveFigure | None = None
    shared_memory_per_sm_bytes: PositiveFigure | None = None
    max_threads_per_block: PositiveFigure | None = None
    max_threads_per_sm: PositiveFigure | None = None
    registers_per_sm: PositiveFigure | None = None
    max_registers_per_thread: PositiveFigure | None = None
    clock_mhz: PositiveFigure | None = None
    #: the SM clock the data sheet's tensor-core rate assumes, where below clock_mhz: the clock
    #: a tensor-core GEMM runs at (device_profiles/memory.py scales the SM-clocked figures)
    tensor_clock_mhz: PositiveFigure | None = None


class GemmWsSection(_Strict):
    """Figures of the GeMM-WS model (warp-specialization-gemm-model.txt §2, §4.2).

    Units: times in microseconds; load throughput in matrix elements per microsecond;
    compute throughput in multiply-accumulates (MACs) per microsecond.
    """

    t_init_us: NonNegativeFigure
    t_epilogue_us: NonNegativeFigure
    load_startup_latency_us: NonNegativeFigure
    compute_startup_latency_us: NonNegativeFigure
    load_throughput_elements_per_us: PositiveFigure
    compute_throughput_macs_per_us: PositiveFigure


class MemorySection(_Strict):
    """The memory hierarchy behind a GEMM's tile loads (docs/model-notes.md, "Memory
    hierarchy priors"): pointer-chase latencies, streaming bandwidths, the L2 capacity and the
    launch time of an empty kernel. Bandwidths in GB/s (10^9 bytes per second)."""

    dram_latency_ns: PositiveFigure
    l2_latency_ns: PositiveFigure
    dram_bandwidth_gb_per_s: PositiveFigure
    l2_bandwidth_gb_per_s: PositiveFigure
    l2_size_bytes: PositiveFigure
    kernel_launch_us: PositiveFigure


ManyBspUnit = Literal["SPs", "DPU", "SFU", "LDST"]

#: the error type of lists whose lengths must agree: a rule no JSON schema keyword can state
#: (none relates two arrays' lengths), so requests name it apart from schema violations
INCONSISTENT_LENGTHS = "inconsistent_lengths"

#: the profile formats this loader reads, oldest first
ProfileSchemaVersion = Literal[1, 2, 3, 4]
PROFILE_SCHEMA_VERSIONS: tuple[ProfileSchemaVersion, ...] = (1, 2, 3, 4)


#: the pipeline models' registry (perfmodel.pipelines.names), handed in by whoever serves
#: them (:func:`serve_pipeline_models`; the service does in app/__init__.py): the file format
#: imports nothing of the models that read it. Until then any name passes the schema, and the
#: registry refuses an unknown one where it resolves it.
_pipeline_models: list[Callable[[], tuple[str, ...]]] = []


def serve_pipeline_models(names: Callable[[], tuple[str, ...]]) -> None:
    """Check pipeline model names against ``names()``, the names registered when it is called."""
    _pipeline_models[:] = [names]


def _registered_pipeline_model(name: str) -> str:
    """``name`` when a pipeline model is registered under it (perfmodel/pipelines)."""
    for names in _pipeline_models:
        if name not in names():
            raise ValueError(
                f"unknown pipeline model {name!r}; choose one of: {', '.join(names())}"
            )
    return name


class _PipelineModelSchema:
    """The JSON schema of a pipeline model name: the names registered when it is generated."""

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema: JsonSchemaValue = {"type": "string"}
        for names in _pipeline_models:
            schema["enum"] = list(names())
        return schema


#: a GeMM-WS pipeline model's name: one the registry serves ('paper', 'async-copy', ...)
PipelineModelName = Annotated[str, AfterValidator(_registered_pipeline_model), _PipelineModelSchema]


class InstructionClassFigures(_Strict):
    """One row of Tables 1-5..1-7 (many-bsp-supplementary.txt): the functional unit, n_fu^i
    (units available to one warp scheduler), T_i (results per cycle per warp scheduler) and the
    latency: computational, or communication for global memory. ``source`` cites the row."""

    fu: ManyBspUnit
    units_per_ws: float = Field(gt=0, description="n_fu^i, units per warp scheduler")
    throughput_per_ws: float = Field(gt=0, description="T_i, results per cycle per scheduler")
    latency_cycles: float = Field(ge=0, description="comp latency, or comm latency (cycles)")
    source: str = Field(min_length=3, max_length=MAX_SOURCE_CHARS)
    note: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    estimate: bool = Field(False, description=_ESTIMATE_DESCRIPTION)


class BarrierOverheadPoint(_Strict):
    """bar.sync overhead measured at one block size (Tables 1-5..1-7, first rows)."""

    threads_per_block: int = Field(gt=0)
    overhead_cycles: float = Field(ge=0)
    source: str = Field(min_length=3, max_length=MAX_SOURCE_CHARS)
    note: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    estimate: bool = Field(False, description=_ESTIMATE_DESCRIPTION)


#: instruction classes every Many-BSP profile must carry (the classifier falls back to them)
REQUIRED_MANY_BSP_CLASSES: tuple[str, ...] = (
    "alu",
    "ld_global",
    "st_global",
    "ld_shared",
    "st_shared",
)

#: scalar figures of the Many-BSP model (Table 1-8) a profile must carry to serve it
REQUIRED_MANY_BSP_FIGURES: tuple[str, ...] = (
    "warp_size",
    "n_ws",
    "n_du",
    "issue_cycle",
    "mem_lat_cycles",
    "warp_launch_overhead_cycles",
    "block_launch_overhead_cycles",
    "max_threads_per_sm",
    "registers_per_sm",
    "shared_memory_per_sm_bytes",
    "mu",
)

#: figures of the GeMM-WS model (§4.2) a profile must carry to serve it: all its section's
REQUIRED_GEMM_WS_FIGURES: tuple[str, ...] = tuple(GemmWsSection.model_fields)

#: model name -> the profile section holding its figures
MODEL_SECTIONS: dict[str, str] = {"gemm-ws": "gemm_ws", "many-bsp": "many_bsp"}

#: the Many-BSP figure only the throughput floor reads (profiles with ``sector_bytes``)
FLOOR_FIGURE = "throughput_efficiency"
#: model name -> the section names of the figures a calibration run fits from measured runs
#: (POST /calibrate, ``kperf calibrate``): what no public source gives for a device but
#: measurements on it determine. Every other required figure must be cited in the file.
CALIBRATABLE_FIGURES: dict[str, tuple[str, ...]] = {
    "many-bsp": (
        "mu",
        "block_launch_overhead_cycles",
        "warp_launch_overhead_cycles",
        FLOOR_FIGURE,
    ),
    "gemm-ws": REQUIRED_GEMM_WS_FIGURES,
}


class ManyBspSection(_Strict):
    """Figures of the Many-BSP model (many-bsp-supplementary.txt Tables 1-1..1-8 and the
    parameter blocks of §2-§7). Every figure is optional so that a partial profile can say
    exactly which ones it lacks (:meth:`DeviceProfile.missing_many_bsp_figures`).

    Units: cycles (``_cycles``), bytes (``_bytes``); ``mu`` is dimensionless.
    """

    warp_size: PositiveFigure | None = None
    n_ws: PositiveFigure | None = Field(None, description="warp schedulers per SM")
    n_du: PositiveFigure | None = Field(None, description="dispatch units per SM")
    issue_cycle: PositiveFigure | None = Field(None, description="cycles to issue one warp")
    g0_cycles: NonNegativeFigure | None = None
    g1_cycles: NonNegativeFigure | None = None
    g2_cycles: NonNegativeFigure | None = None
    mem_lat_cycles: PositiveFigure | None = Field(None, description="mem_lat = G_2 (eq. 26)")
    l1_hit_latency_cycles: PositiveFigure | None = None
    warp_launch_overhead_cycles: NonNegativeFigure | None = None
    block_launch_overhead_cycles: NonNegativeFigure | None = None
    max_threads_per_sm: PositiveFigure | None = None
    registers_per_sm: PositiveFigure | None = Field(None, description="n_reg")
    shared_memory_per_sm_bytes: PositiveFigure | None = Field(None, description="shmem_size")
    segment_bytes: PositiveFigure | None = Field(None, description="global memory segment")
    sector_bytes: PositiveFigure | None = Field(
        None,
        description="L1/L2 sector (Volta and later: 32); with it the front end counts a "
        "warp's sectors, bank conflicts and cache hits from every lane's address",
    )
    l2_hit_latency_cycles: PositiveFigure | None = Field(
        None, description="latency of a global load served by L2, cycles"
    )
    l2_cache_bytes: PositiveFigure | None = Field(None, description="L2 cache size, bytes")
    mu: PositiveFigure | None = Field(None, description="mu of eq. (24)-(25)")
    throughput_efficiency: PositiveFigure | None = Field(
        None,
        description="dimensionless: the fraction of the issue/unit peak (per cycle at "
        "clock_mhz) the SMs sustain; divides the throughput floor (default 1)",
    )
    latency_exposed_after_eq8_stall: SwitchFigure | None = Field(
        None,
        description="whether the instruction after an eq. (8) stall shows its latency "
        "(default true); read off the device's BLOCK tables",
    )
    bar_sync_overhead: list[BarrierOverheadPoint] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS
    )
    instruction_classes: dict[str, InstructionClassFigures] = Field(
        default_factory=dict, max_length=MAX_LIST_ITEMS
    )

    def missing_figures(self) -> list[str]:
        missing = [f"many_bsp.{n}" for n in REQUIRED_MANY_BSP_FIGURES if getattr(self, n) is None]
        if not self.bar_sync_overhead:
            missing.append("many_bsp.bar_sync_overhead")
        missing += [
            f"many_bsp.instruction_classes.{c}"
            for c in REQUIRED_MANY_BSP_CLASSES
            if c not in self.instruction_classes
        ]
        return missing


class SyncLatencyPoint(_Strict):
    threads_per_block: int = Field(gt=0)
    latency_cycles: float = Field(ge=0)
    throughput_block_syncs_per_us: float | None = Field(None, ge=0)
    source: str = Field(min_length=3, max_length=MAX_SOURCE_CHARS)


class GridSyncPoint(_Strict):
    blocks_per_sm: int = Field(gt=0)
    threads_per_block: int = Field(gt=0)
    latency_us: float = Field(ge=0)
    source: str = Field(min_length=3, max_length=MAX_SOURCE_CHARS)


class SynchronizationSection(_Strict):
    """Measured synchronization costs (gpu-synchronization-study.txt Table 5, Fig. 8)."""

    block_sync: list[SyncLatencyPoint] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    grid_sync: list[GridSyncPoint] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)


class CalibrationErrorSummary(_Strict):
    """Absolute percentage error of the calibrated model over a set of measured runs."""

    # JSON has no infinity: an error that overflowed (a fit that predicts inf) is written null
    mean_abs_pct: float | None = Field(
        ge=0, description="mean absolute error, % of the measured value; null if not finite"
    )
    max_abs_pct: float | None = Field(
        ge=0, description="largest absolute error, % of the measured value; null if not finite"
    )


class CalibrationPosterior(_Strict):
    """The Laplace posterior of a calibration: ln(figures) ~ Normal(mean, covariance), which
    the service draws from for shortlists and intervals (docs/model-notes.md, MAP calibration)."""

    figures: list[str] = Field(
        max_length=MAX_LIST_ITEMS, description="names of the fitted figures, in order"
    )
    mean_log: list[float] = Field(
        max_length=MAX_LIST_ITEMS, description="posterior mean of ln(value), per figure"
    )
    covariance_log: list[list[float]] = Field(
        max_length=MAX_LIST_ITEMS, description="posterior covariance of ln(value)"
    )

    @model_validator(mode="after")
    def _square(self) -> CalibrationPosterior:
        p = len(self.figures)
        if (
            len(self.mean_log) != p
            or len(self.covariance_log) != p
            or any(len(row) != p for row in self.covariance_log)
        ):
            raise PydanticCustomError(
                INCONSISTENT_LENGTHS,
                "mean_log and covariance_log must match figures in length",
            )
        return self


class CalibrationProvenance(_Strict):
    """Where a calibrated profile comes from (POST /calibrate); absent from shipped profiles."""

    base_device: str = Field(
        max_length=MAX_ID_CHARS, description="id of the profile whose figures the fit started from"
    )
    base_digest: str = Field(
        max_length=MAX_ID_CHARS, description="content digest of that base profile"
    )
    root_device: str = Field(
        max_length=MAX_ID_CHARS,
        description="the shipped profile (or 'inline') a chain of calibrations started from",
    )
    model: Literal["gemm-ws", "many-bsp"]
    pipeline_model: PipelineModelName | None = Field(
        default=None,
        description="the GeMM-WS pipeline model the figures were fitted under (answers on this "
        "profile default to it); null for Many-BSP fits and profiles fitted before it existed",
    )
    fitted: list[str] = Field(max_length=MAX_LIST_ITEMS, description="names of the fitted figures")
    measurement_count: int = Field(ge=1, description="measured runs the fit used")
    measurements_digest: str = Field(
        max_length=MAX_ID_CHARS, description="sha256 of the canonical measurements, hex"
    )
    created_at: datetime = Field(description="when the profile was first fitted (UTC)")
    training_error: CalibrationErrorSummary
    cross_validation_error: CalibrationErrorSummary | None = Field(
        default=None,
        description="k-fold error on held-out runs; null when cross-validation was off",
    )
    method: str = Field(
        max_length=MAX_TEXT_CHARS, description="fitting method reported by the calibration core"
    )
    posterior: CalibrationPosterior | None = Field(
        default=None, description="the fit's posterior (absent from older calibrated profiles)"
    )
    determined: list[str] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="the fitted figures the runs determined on their own",
    )
    noise_pct: float | None = Field(
        default=None, description="relative noise of the runs the fit estimated, %"
    )


class GemmWsDtypeRatios(_Strict):
    """Throughputs of one element type relative to the gemm_ws section's (fp16) figures."""

    load: float = Field(gt=0, description="load throughput ratio (elements per us)")
    compute: float = Field(gt=0, description="MATH throughput ratio (MACs per us)")
    source: str = Field(min_length=3, max_length=MAX_TEXT_CHARS)


class DeviceProfile(_Strict):
    schema_version: ProfileSchemaVersion
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=MAX_ID_CHARS)
    name: str = Field(max_length=MAX_NAME_CHARS)
    architecture: str | None = Field(None, max_length=MAX_NAME_CHARS)
    compute_capability: str | None = Field(None, max_length=MAX_NAME_CHARS)
    description: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    hardware: HardwareLimits
    gemm_ws: GemmWsSection | None = None
    gemm_ws_dtypes: dict[str, GemmWsDtypeRatios] | None = Field(
        None,
        description="per element type the hardware has (fp32, fp16, bf16, fp8), the GeMM-WS "
        "throughputs relative to the gemm_ws figures, which are for fp16 (schema_version 3); "
        "absent: every dtype at the fp16 figures (the paper's reading, GeMM-WS 3)",
    )
    memory: MemorySection | None = Field(
        None,
        description="DRAM and L2 latencies, bandwidths and size, kernel launch time "
        "(schema_version 4)",
    )
    many_bsp: ManyBspSection | None = None
    synchronization: SynchronizationSection | None = None
    calibration: CalibrationProvenance | None = Field(
        default=None, description="provenance of a calibrated profile; none in shipped files"
    )

    @model_validator(mode="after")
    def _estimates_need_version_2(self) -> DeviceProfile:
        if self.schema_version == 1 and self.estimated_figures():
            raise ValueError(
                "estimate flags need schema_version 2 (flagged: "
                + ", ".join(self.estimated_figures())
                + ")"
            )
        if self.schema_version < 3 and (self.prior_figures() or self.gemm_ws_dtypes):
            raise ValueError("priors and gemm_ws_dtypes need schema_version 3")
        if self.schema_version < 4 and self.memory is not None:
            raise ValueError("the memory section needs schema_version 4")
        return self

    def prior_figures(self) -> list[str]:
        """Dotted names of the figures that carry a prior (schema_version 3)."""
        out = []
        for section_name in ("gemm_ws", "memory", "many_bsp"):
            section = getattr(self, section_name)
            if section is None:
                continue
            for name in type(section).model_fields:
                figure = getattr(section, name)
                if isinstance(figure, Figure) and figure.prior is not None:
                    out.append(f"{section_name}.{name}")
        return out

    def content_sha256(self) -> str:
        """SHA-256 (hex) of the profile's JSON: any edited figure, note or flag changes it
        (cache keys and calibrated ids are built on it)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    def estimated_figures(self) -> list[str]:
        """Dotted names of the numbers flagged as uncalibrated estimates (schema_version 2)."""
        return sorted({path for path, estimate in _estimate_flags(self, "") if estimate})

    def estimated_figures_of(self, section: str) -> list[str]:
        """:meth:`estimated_figures` of one top-level section (``gemm_ws``): the answer's
        path walks that section alone (a request resolves its pipeline model this way)."""
        node = getattr(self, section)
        return sorted({path for path, estimate in _estimate_flags(node, section) if estimate})

    def missing_many_bsp_figures(self) -> list[str]:
        """Dotted names of the figures the Many-BSP model needs and this profile lacks."""
        return (self.many_bsp or ManyBspSection.model_validate({})).missing_figures()

    def models_served(self) -> list[str]:
        """Names of the performance models whose figures this profile carries."""
        served = []
        if self.gemm_ws is not None:
            served.append("gemm-ws")
        if self.many_bsp is not None and not self.missing_many_bsp_figures():
            served.append("many-bsp")
        return served


def _estimate_flags(node: object, path: str) -> Iterator[tuple[str, bool]]:
    """(dotted path, estimate flag) of every cited number under ``node``; a list item is
    reported under its list's path (``many_bsp.bar_sync_overhead``)."""
    if isinstance(node, Figure | InstructionClassFigures | BarrierOverheadPoint):
        yield path, node.estimate
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            yield from _estimate_flags(getattr(node, name), f"{path}.{name}" if path else name)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _estimate_flags(value, f"{path}.{key}")
    elif isinstance(node, list):
        for item in node:
            yield from _estimate_flags(item, path)
