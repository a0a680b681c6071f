"""Request and response models of POST /predict-kernel (Many-BSP)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictFloat,
    StrictInt,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from app.schemas.base import ONE_DEVICE_SCHEMA, ProfileProvenanceOut, RequestModel
from app.schemas.devices import drop_read_only_keys
from device_profiles import DeviceProfile
from device_profiles.schema import (
    INCONSISTENT_LENGTHS,
    MAX_ID_CHARS,
    MAX_TEXT_CHARS,
    PROFILE_SCHEMA_VERSIONS,
)


def _inline_profile(value: object) -> object:
    """Before-validator of an inline profile: without what GET /devices/{id} adds, and strict.

    DeviceProfile (device_profiles/) keeps pydantic's lax mode for its files; figures sent in a
    request get the strict types of every other request field. Validated as the JSON it came
    in as: strict JSON reads an ISO 8601 string as the datetime its schema says
    (``calibration.created_at``), which strict Python validation of the parsed dict refuses.
    Read at the current schema version: the version gates of profile files (estimate flags
    from 2, priors and dtype ratios from 3) keep old files from being half-read, and a
    request body, read whole, has nothing to gate.
    """
    value = drop_read_only_keys(value)
    if not isinstance(value, dict):
        return value
    if "schema_version" in value and value["schema_version"] in PROFILE_SCHEMA_VERSIONS:
        value = {**value, "schema_version": PROFILE_SCHEMA_VERSIONS[-1]}
    try:
        return DeviceProfile.model_validate_json(json.dumps(value), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "device_params"
        if first["type"] == INCONSISTENT_LENGTHS:
            raise PydanticCustomError(INCONSISTENT_LENGTHS, f"{where}: {first['msg']}") from None
        raise ValueError(f"{where}: {first['msg']}") from None


#: a device profile sent in a request body (device_params, base_device_params)
InlineProfile = Annotated[DeviceProfile, BeforeValidator(_inline_profile)]
PositiveInt = Annotated[int, Field(gt=0)]
#: most items per list in one page of a /predict-kernel answer
MAX_LIST_LIMIT = 100_000
Dim3 = Annotated[list[PositiveInt], Field(min_length=3, max_length=3)]


class LaunchConfig(RequestModel):
    grid: Dim3 = Field(description="blocks per grid [x, y, z]; n_b is their product")
    block: Dim3 = Field(description="threads per block [x, y, z]; n_t is their product")


class Resources(RequestModel):
    registers_per_thread: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="registers per thread; default: `ptxas -v` when ptxas is on the server's "
        "PATH, otherwise required",
    )
    shared_bytes_per_block: int | None = Field(
        None, ge=0, description="shared memory per block in bytes; default: the kernel's .shared"
    )


class KernelLaunch(RequestModel):
    """A PTX kernel and how it is launched: the /predict-kernel body without its device; a
    Many-BSP measurement (POST /calibrate) is one of these plus the measured cycles."""

    ptx: str = Field(min_length=1, description="PTX module text")
    kernel: str | None = Field(
        None,
        max_length=MAX_TEXT_CHARS,
        description="entry name (mangled C++ names run long); required when several .entry",
    )
    launch: LaunchConfig
    resources: Resources = Field(
        default_factory=lambda: Resources(registers_per_thread=None, shared_bytes_per_block=None)
    )
    loop_trip_counts: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description="iterations per loop, keyed by the header's label; a label declared in a "
        "nested { } block is named label@line (e.g. LAB_WAIT@712)",
    )
    kernel_args: dict[str, StrictInt | StrictFloat] = Field(
        default_factory=dict,
        description="scalar kernel parameter values by parameter name (as in the PTX .entry): "
        "loop bounds, guards and addresses that depend on them are evaluated; a parameter "
        "the PTX reads as an integer needs a whole number",
        max_length=256,
    )
    # keys stay lax: a JSON object's keys are strings ("12"), and the worker re-validates the
    # dumped request in Python mode, where strict would refuse them; "x" is still a 422
    memory_transactions: dict[
        Annotated[int, Strict(False)], Annotated[int, Field(ge=1, le=1024)]
    ] = Field(
        default_factory=dict,
        description="n_ma overrides keyed by the 1-based line of the instruction in `ptx`",
        # the keys are line numbers written as JSON object keys: say so in the schema
        json_schema_extra={"propertyNames": {"pattern": "^[1-9][0-9]{0,8}$"}},
    )


class PredictKernelRequest(KernelLaunch):
    model_config = ConfigDict(json_schema_extra=ONE_DEVICE_SCHEMA)

    device: str | None = Field(
        None,
        max_length=MAX_ID_CHARS,
        description="device profile id, calibrated id or name (GET /devices)",
    )
    device_params: Annotated[DeviceProfile | None, BeforeValidator(_inline_profile)] = Field(
        None,
        description="an inline device profile with a complete many_bsp section (a "
        "GET /devices/{id} body is accepted as is)",
    )
    clock_mhz: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="clock for predicted_time_us (MHz)"
    )
    detail: Literal["auto", "summary", "full"] = Field(
        "auto",
        description="what the instruction and superstep lists hold. `auto` (default): the "
        "requested items, unless that answer would exceed the server's size limit for full "
        "answers (KPERF_PREDICT_SUMMARY_ABOVE_BYTES, 1 MiB by default), in which case the "
        "lists are left empty and `lists` says why and how many items there are; `summary`: "
        "always empty lists (every figure, the lengths in `lists`); `full`: the requested "
        "items whatever the size (a kernel of 90,000 instructions answers about 36 MB). "
        "Page through long lists with `list_offset` and `list_limit`",
    )
    list_offset: int = Field(
        0,
        ge=0,
        description="index of the first item returned in each list (instructions, "
        "level1_supersteps, level2_supersteps); with list_limit, pages through long lists",
    )
    list_limit: int | None = Field(
        None,
        ge=1,
        le=MAX_LIST_LIMIT,
        description="most items returned per list, from list_offset; default: to the end",
    )


class FuCycles(BaseModel):
    """Occupancy of each functional unit by the instruction (Table N-2), cycles."""

    SPs: float
    DPU: float
    SFU: float
    LDST: float


class InstructionOut(BaseModel):
    line: int = Field(description="1-based line in the submitted ptx")
    opcode: str
    instruction_class: str = Field(
        description="row of Tables 1-5..1-7 used to cost it; 'uncosted' when the device "
        "figures have none (a warning names the opcode)"
    )
    fu: str = Field(
        description="functional unit: SPs, DPU, SFU, LDST, MI (bar.sync) or none (uncosted)"
    )
    latency_cycles: float | None = Field(description="cycles; null when uncosted")
    throughput_per_ws: float | None = Field(
        description="T_i, results per cycle per warp scheduler; null when uncosted"
    )
    u: int | None = Field(description="line of the first instruction reading its result")
    d: int = Field(description="1 when that reader is the next instruction")
    n_ma: int = Field(description="memory transactions per warp")
    n_ma_inferred: bool = Field(description="true when n_ma came from the %tid.x stride")
    sectors: int = Field(
        0,
        description="32-byte sectors one warp's global access moves (devices with sectors: "
        "Volta and later); 0 for other instructions",
    )
    cache_level: str = Field(
        "",
        description="where the hit model serves a global load from: L1 (re-read by the "
        "block's warps), L2 (re-read by other blocks, fits in L2) or empty (DRAM)",
    )
    issue_cycles: float
    fu_cycles: FuCycles
    comm_cycles: float
    ovh_cycles: float
    sync_cycles: float


class SuperstepModel(BaseModel):
    start_line: int = Field(description="1-based line in ptx of its first instruction")
    end_line: int = Field(description="1-based line in ptx of its last instruction")
    comp_cycles: float
    comm_cycles: float
    ovh_cycles: float
    iterations: int = Field(description="times the superstep runs (loop trip count, or 1)")


class WarpRoleOut(BaseModel):
    """One warp role of a warp-specialized kernel, evaluated on its own."""

    warps: list[int] = Field(description="warp indices in the block (linear thread id // 32)")
    threads: int = Field(description="threads in those warps")
    w: int = Field(description="eq. (6) for the role's threads, warps")
    instructions: int = Field(description="instructions of the role's table (Table N-1)")
    uncosted_instructions: int = Field(description="of those, uncosted")
    predicted_cycles: float = Field(description="kernel_exec_cycle if every warp ran this role")
    block_exec_cycle: float = Field(description="eq. (4) for the role, cycles")
    COMP: float = Field(description="eq. (5) for the role, cycles")
    block_comm: float = Field(description="eq. (12) for the role, cycles")
    l: int = Field(description="executed instructions per thread")  # noqa: E741 - paper name
    bounds_kernel: bool = Field(description="true for the role the kernel's answer reports")
    level1_supersteps: list[SuperstepModel]


class BlockClassOut(BaseModel):
    """Blocks of the grid that run the same instructions, modelled as a grid of their own."""

    blocks: int = Field(description="blocks of the grid in the class")
    predicted_cycles: float = Field(description="kernel_exec_cycle of the class's blocks")
    throughput_floor_cycles: float = Field(description="their throughput floor, cycles")
    instructions: int = Field(description="instructions the class executes (Table N-1 rows)")


class ListsInfo(BaseModel):
    """What the instruction and superstep lists of this answer hold (see the request's
    `detail`, `list_offset` and `list_limit`)."""

    detail: Literal["full", "summary"] = Field(
        description="`full`: the lists hold the requested items; `summary`: they are empty"
    )
    offset: int = Field(description="index of the first item of each list in this answer")
    instructions_total: int = Field(description="items of `instructions` in the full answer")
    level1_supersteps_total: int = Field(description="items of `level1_supersteps` in full")
    level2_supersteps_total: int = Field(description="items of `level2_supersteps` in full")
    note: str | None = Field(
        None, description="why the lists were left out, and how to ask for them"
    )


class PredictKernelResponse(BaseModel):
    kernel: str
    device: str
    n_b: int = Field(description="blocks in the grid")
    n_t: int = Field(description="threads per block")
    registers_per_thread: int = Field(description="registers per thread used in eq. (21)")
    registers_source: str = Field(description="'request' or 'ptxas -v (sm_XX)'")
    shared_bytes_per_block: int = Field(description="shared memory per block, bytes")
    predicted_cycles: float = Field(description="kernel_exec_cycle, eq. (24)/(25), cycles")
    predicted_time_us: float | None = Field(description="predicted_cycles / clock (us)")
    clock_mhz: float | None = Field(description="clock used for predicted_time_us, MHz")
    predicted_cycles_interval: list[float] | None = Field(
        default=None,
        description="[10 %, 90 %] quantiles of predicted_cycles when mu and the launch "
        "overheads are drawn from the profile's posterior or priors, cycles (contains "
        "predicted_cycles)",
    )
    profile_provenance: ProfileProvenanceOut | None = Field(
        default=None, description="where the device figures come from"
    )
    equation: str = Field(description="'24' (rho >= tau) or '25'")
    w: int = Field(description="warps per warp scheduler, eq. (6)")
    parallel_comp: float = Field(description="eq. (10), cycles")
    block_bar_ovh: float = Field(description="eq. (11), cycles")
    block_comm: float = Field(description="eq. (12), cycles")
    block_comm_delta: float = Field(description="block_comm without the last access, cycles")
    COMP: float = Field(description="eq. (5), cycles")
    warps_need: float = Field(description="eq. (15), warps")
    overlapped: float = Field(description="eq. (16), cycles")
    nonoverlapped: float = Field(description="eq. (17), cycles")
    block_exec_cycle: float = Field(description="eq. (4), cycles")
    comp: float = Field(description="eq. (19), cycles")
    novlp: float = Field(description="eq. (20), cycles")
    rho: int = Field(description="eq. (21), resident blocks per SM")
    K: float = Field(description="eq. (22), rounds of resident blocks")
    tau: int = Field(description="eq. (23)")
    mu: float = Field(description="mu of eq. (24)-(25)")
    l: int = Field(description="executed instructions per thread")  # noqa: E741 - paper name
    l_c: int = Field(description="executed computational instructions per thread")
    l_m: int = Field(description="executed global-memory instructions per thread")
    l_b: int = Field(description="executed barriers (bar.sync) per thread")
    level1_supersteps: list[SuperstepModel]
    level2_supersteps: list[SuperstepModel]
    instructions: list[InstructionOut]
    warnings: list[str]
    throughput_floor_cycles: float = Field(
        0.0,
        description="the grid's warps at full issue and unit throughput (Volta and later; 0: "
        "not evaluated); predicted_cycles is never below it",
    )
    block_classes: list[BlockClassOut] = Field(
        default_factory=list,
        description="blocks that run different parts of the kernel (guards that send whole "
        "blocks past a tile or out); predicted_cycles is the sum over the classes, the other "
        "fields are those of the costliest. Empty when every block runs the same code",
    )
    warp_roles: list[WarpRoleOut] = Field(
        default_factory=list,
        description="warp-specialized kernels: one entry per group of warps that runs its own "
        "path, each modelled on its own; the fields above are those of the slowest "
        "(bounds_kernel). Empty when all warps run the same code",
    )
    lists: ListsInfo = Field(description="what the three lists hold: full, a page, or empty")
