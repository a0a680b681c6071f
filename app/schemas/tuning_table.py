"""Request and response models of POST /tuning-table (the HTTP boundary only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.base import ONE_DEVICE_SCHEMA, ProfileProvenanceOut, RequestModel
from app.schemas.optimize import (
    MAX_CANDIDATES,
    MAX_PROBLEM_DIMENSION,
    SPACE_OR_CANDIDATES_SCHEMA,
    CandidateIn,
    ColumnsN,
    DepthRange,
    DepthValues,
    Dtype,
    GemmWsDeviceParams,
    ReductionK,
    SearchSpaceSpec,
    TileValues,
    TilingOut,
)
from app.settings import TIME_LIMIT_CEILING_S
from device_profiles.schema import MAX_ID_CHARS, PipelineModelName

#: vLLM's batch sizes for its tuning scripts (benchmarks/kernels/benchmark_moe.py and
#: benchmark_w8a8_block_fp8.py, the ``batch_sizes`` default): the keys of its shipped tables
DEFAULT_M_VALUES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
MAX_M_VALUES = 64
#: the space of vLLM's tuning scripts (``get_configs_compute_bound``: BLOCK_SIZE_M, _N, _K,
#: GROUP_SIZE_M, num_warps, num_stages), 1,920 configurations; tile_k values not dividing an
#: fp8 quantization block's K are dropped, as the scripts drop them
DEFAULT_TILE_M = (16, 32, 64, 128, 256)
DEFAULT_TILE_N = (32, 64, 128, 256)
DEFAULT_TILE_K = (64, 128, 256)
DEFAULT_DEPTHS = (2, 3, 4, 5)
DEFAULT_NUM_WARPS = (4, 8)
DEFAULT_GROUP_SIZE_M = (1, 16, 32, 64)
MAX_CONFIG_VALUES = 64


class TableSearchSpace(SearchSpaceSpec):
    """Tile sizes and buffer depths to choose from (defaults: vLLM's tuning space)."""

    tile_m: TileValues = Field(default=list(DEFAULT_TILE_M), description="BLOCK_SIZE_M values")
    tile_n: TileValues = Field(default=list(DEFAULT_TILE_N), description="BLOCK_SIZE_N values")
    tile_k: TileValues = Field(
        default=list(DEFAULT_TILE_K),
        description="BLOCK_SIZE_K values (default: those dividing block_shape's K for fp8)",
    )
    buffer_depth: DepthValues = Field(
        default=DepthRange(min=DEFAULT_DEPTHS[0], max=DEFAULT_DEPTHS[-1]),
        description="A/B buffers in shared memory; written as Triton's num_stages for the "
        "device's compute capability (sm_8x: depth + 1, else the depth)",
    )


MValue = Annotated[int, Field(ge=1, le=MAX_PROBLEM_DIMENSION)]
ConfigValues = Annotated[
    list[Annotated[int, Field(ge=1, le=1024)]], Field(min_length=1, max_length=MAX_CONFIG_VALUES)
]


#: the engines' formats are block-quantized fp8 tables: with format vllm or sglang (the
#: default) the dtype is fp8 (its default), and inline device_params need a device_name
ENGINE_FORMAT_SCHEMA: dict[str, Any] = {
    "allOf": [
        {
            "if": {"properties": {"format": {"enum": ["vllm", "sglang"]}}},
            "then": {"properties": {"dtype": {"const": "fp8"}}},
        },
        {
            "if": {
                "required": ["device_params"],
                "properties": {
                    "device_params": {"type": "object"},
                    "format": {"enum": ["vllm", "sglang"]},
                },
            },
            "then": {
                "required": ["device_name"],
                "properties": {"device_name": {"type": "string"}},
            },
        },
    ]
}


class TuningTableRequest(RequestModel):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [ONE_DEVICE_SCHEMA, SPACE_OR_CANDIDATES_SCHEMA, ENGINE_FORMAT_SCHEMA]
        }
    )

    n: ColumnsN
    k: ReductionK
    dtype: Dtype = Field(
        default="fp8",
        description="element type of A and B; the vllm and sglang formats are fp8 "
        "block-quantized (w8a8) tables only",
    )
    device: str | None = Field(
        default=None, max_length=MAX_ID_CHARS, description="device profile id or name"
    )
    device_params: GemmWsDeviceParams | None = Field(
        default=None, description="inline machine figures instead of a profile"
    )
    device_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="the CUDA device name for the file name (torch.cuda.get_device_name(), "
        "e.g. 'NVIDIA H100 80GB HBM3'); null: the one known for the profile (h100, a100, "
        "rtx-a6000), else required by the vllm and sglang formats",
    )
    compute_capability: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,2}\.[0-9]$",
        description="e.g. '9.0': sets num_stages from buffer_depth (null: the profile's)",
    )
    m_values: list[MValue] = Field(
        default=list(DEFAULT_M_VALUES),
        min_length=1,
        max_length=MAX_M_VALUES,
        description=f"the table's M keys, distinct (1..{MAX_M_VALUES}; default vLLM's 18)",
        json_schema_extra={"uniqueItems": True},
    )
    search_space: TableSearchSpace | None = Field(
        default=None, description="tiles and depths to choose from (null: vLLM's tuning space)"
    )
    num_warps: ConfigValues = Field(
        default=list(DEFAULT_NUM_WARPS),
        description="num_warps values (search_space only): the model does not rank them; an "
        "entry takes the first, a candidate's params may give its own",
    )
    group_size_m: ConfigValues = Field(
        default=list(DEFAULT_GROUP_SIZE_M),
        description="GROUP_SIZE_M values, as num_warps",
    )
    candidates: list[CandidateIn] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CANDIDATES,
        description="explicit configurations instead of a search space; params (echoed) may "
        "hold num_warps, GROUP_SIZE_M and num_stages (integers) for the engine's entry",
    )
    max_distinct_configs: int | None = Field(
        default=None,
        ge=1,
        le=MAX_M_VALUES,
        description="at most this many distinct configurations in the table (fewer compiles "
        "in the engine); chosen to minimise the worst per-key loss, exactly (Z3) or with a "
        "stated lower bound",
    )
    format: Literal["vllm", "sglang", "json"] = Field(
        default="vllm", description="the file's form: the engine's loader or kperf's own"
    )
    block_shape: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default=[128, 128],
        min_length=2,
        max_length=2,
        description="fp8 quantization block [N, K] of the weights, in the file name",
    )
    shortlist_per_m: int = Field(
        default=3,
        ge=1,
        le=16,
        description="per key, this many configurations fastest by prediction (the ones worth "
        "timing on the GPU: kperf table --verify)",
    )
    loss_sample_step: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="the range between keys is cut every this many M for the loss bound",
    )
    pipeline_model: PipelineModelName | None = Field(
        default=None, description="as /optimize-tiling (null: the device's default)"
    )
    time_limit_s: float = Field(
        default=30.0, ge=0.1, le=TIME_LIMIT_CEILING_S, description="budget of the whole table, s"
    )


class EngineConfigOut(BaseModel):
    """One entry of the engine's file."""

    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int
    num_stages: int


class ShortlistEntryOut(BaseModel):
    tiling: TilingOut
    config: EngineConfigOut
    predicted_time_us: float = Field(description="at this key, us")
    probability_best: float | None = Field(description="as the entry's")


class TableEntryOut(BaseModel):
    m: int = Field(description="the key")
    config: EngineConfigOut
    tiling: TilingOut
    input_index: int | None = Field(
        default=None, description="position in the request's candidates (null for a space)"
    )
    params: dict[str, Any] | None = Field(default=None, description="the candidate's params")
    predicted_time_us: float = Field(description="predicted time of the entry at this M, us")
    interval_low_us: float | None = Field(description="10 % quantile over the draws, us")
    interval_high_us: float | None = Field(description="90 % quantile over the draws, us")
    probability_best: float | None = Field(
        description="share of draws of the device's figures in which this tiling is fastest"
    )
    optimum: TilingOut = Field(description="this M's own certified optimum")
    optimum_time_us: float = Field(description="its predicted time, us")
    loss: float = Field(description="predicted_time / optimum_time - 1 (0: the optimum)")
    certified: bool = Field(description="Z3 proved the optimum at this M")
    shortlist: list[ShortlistEntryOut] = Field(
        description="the shortlist_per_m configurations fastest by prediction at this M, the "
        "optimum first"
    )


class LossOverRange(BaseModel):
    m_min: int = Field(description="first M of the range (the smallest key)")
    m_max: int = Field(description="last M of the range (the largest key)")
    sample_step: int = Field(description="pieces start after every multiple of it")
    pieces: int = Field(description="pieces the range was cut into")
    points_evaluated: int = Field(description="M values predicted for the bound")
    worst_loss: float = Field(
        description="bound on t(entry, M) / t*(M) - 1 for every integer M of the range under "
        "the engine's nearest-key lookup (exact when times are constant on each piece)"
    )
    worst_m_first: int = Field(description="first M of the piece attaining it")
    worst_m_last: int = Field(description="last M of that piece")
    worst_key: int = Field(description="the key that piece is served by")


class SelectionOut(BaseModel):
    max_distinct_configs: int | None
    distinct_configs: int = Field(description="distinct configurations in the table")
    worst_key_loss: float = Field(description="largest entry loss over the keys")
    lower_bound_loss: float = Field(
        description="no choice of at most max_distinct_configs does better than this worst "
        "key loss (equal to it when exact)"
    )
    exact: bool
    z3_checks: int


class TableSearchOut(BaseModel):
    configurations: int = Field(
        description="configurations asked for: the candidates, or the space's tilings times "
        "its num_warps and group_size_m values (what exhaustive tuning times per key)"
    )
    tilings: int = Field(description="distinct (tile_m, tile_n, tile_k, buffer_depth)")
    feasible_tilings: int
    rejected: dict[str, int] = Field(description="tilings rejected, per constraint")


class TableSolverOut(BaseModel):
    elapsed_ms: float = Field(description="wall time of the table in the worker, ms")
    cpu_ms: float = Field(description="CPU time the worker spent on it, ms")
    keys_certified: int = Field(description="keys whose optimum Z3 proved")
    z3_checks: int = Field(description="checks over every key and the selection")


class TuningTableResponse(BaseModel):
    status: Literal["optimal", "timeout"] = Field(
        description="'optimal': every key's optimum proven; 'timeout': some were not"
    )
    device: str
    dtype: Dtype
    pipeline_model: PipelineModelName
    n: int
    k: int
    format: Literal["vllm", "sglang", "json"]
    file_name: str = Field(description="the name the engine's loader looks for")
    file: dict[str, dict[str, Any]] = Field(
        description="the file's JSON: str(M) -> entry (vllm/sglang: the six integers)"
    )
    entries: list[TableEntryOut]
    loss_over_range: LossOverRange
    selection: SelectionOut
    search: TableSearchOut
    solver: TableSolverOut
    profile_provenance: ProfileProvenanceOut | None = None
