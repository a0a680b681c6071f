"""Request and response models of POST /optimize-tiling (the HTTP boundary only)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.base import ONE_DEVICE_SCHEMA, ProfileProvenanceOut, RequestModel
from app.settings import TIME_LIMIT_CEILING_S
from device_profiles.schema import MAX_ID_CHARS, PipelineModelName
from solver.search_space import (
    DEFAULT_BUFFER_DEPTHS,
    DEFAULT_TILE_VALUES,
    MAX_BUFFER_DEPTH,
    MAX_TILE,
)

MAX_PROBLEM_DIMENSION = 1 << 20
MAX_TOP_K = 50
DEFAULT_TIME_LIMIT_S = 10.0
#: the shortest budget a solve can be answered in: a worker round trip and one chunk of the
#: exact scorer (~50 ms); below it the answer could only be a 504, so it is a 422 up front
MIN_TIME_LIMIT_S = 0.1

Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]

#: most threads a CTA may have (CUDA C++ Programming Guide, "Technical Specifications per
#: Compute Capability": maximum number of threads per block, 1024 on every compute capability
#: >= 2.0)
MAX_THREADS_PER_CTA = 1024
#: most registers a thread may use (same table: maximum number of 32-bit registers per thread,
#: 255 on every compute capability >= 3.5)
MAX_REGISTERS_PER_THREAD = 255
#: a CTA's threads and a thread's 32-bit registers, where a request states them (async-copy
#: GeMM-WS: together they bound the CTAs resident per SM)
ThreadsPerCta = Annotated[int, Field(ge=1, le=MAX_THREADS_PER_CTA)]
RegistersPerThread = Annotated[int, Field(ge=1, le=MAX_REGISTERS_PER_THREAD)]

#: a problem's dimensions and a tiling's, as a request gives them: each bounded and described
#: once for every request that carries them
RowsM = Annotated[
    int, Field(ge=1, le=MAX_PROBLEM_DIMENSION, description="rows of A and C, elements")
]
ColumnsN = Annotated[
    int, Field(ge=1, le=MAX_PROBLEM_DIMENSION, description="columns of B and C, elements")
]
ReductionK = Annotated[
    int, Field(ge=1, le=MAX_PROBLEM_DIMENSION, description="reduction dimension, elements")
]
TileM = Annotated[int, Field(ge=1, le=MAX_TILE, description="TM, elements")]
TileN = Annotated[int, Field(ge=1, le=MAX_TILE, description="TN, elements")]
TileK = Annotated[int, Field(ge=1, le=MAX_TILE, description="TK, elements")]
BufferDepth = Annotated[
    int,
    Field(
        ge=1, le=MAX_BUFFER_DEPTH, description="stages held by the shared-memory circular buffer"
    ),
]


class ValueRange(RequestModel):
    """Every multiple of ``multiple_of`` between ``min`` and ``max`` inclusive.

    An empty range (min > max) or one of over 4,096 values is refused by the solver's
    ``values_from_range`` (422, invalid search space): no JSON schema keyword compares two
    fields, so the model leaves both rules to the one place that owns them."""

    min: int = Field(ge=1, le=MAX_TILE)
    max: int = Field(ge=1, le=MAX_TILE)
    multiple_of: int = Field(default=1, ge=1, le=MAX_TILE)


#: a list of candidate tile sizes: at most this many (the search space's own cap,
#: max_search_space_candidates, bounds their product)
MAX_TILE_VALUES = 4096
TileValues = Annotated[list[int], Field(max_length=MAX_TILE_VALUES)] | ValueRange


class DepthRange(ValueRange):
    """Every multiple of ``multiple_of`` between ``min`` and ``max`` inclusive (buffer depths:
    at most MAX_BUFFER_DEPTH, so the schema says what the solver accepts)."""

    min: int = Field(ge=1, le=MAX_BUFFER_DEPTH)
    max: int = Field(ge=1, le=MAX_BUFFER_DEPTH)
    multiple_of: int = Field(default=1, ge=1, le=MAX_BUFFER_DEPTH)


DepthValues = list[Annotated[int, Field(ge=1, le=MAX_BUFFER_DEPTH)]] | DepthRange


class SearchSpaceSpec(RequestModel):
    """Candidate values per dimension: an explicit list or a range."""

    tile_m: TileValues = Field(default=list(DEFAULT_TILE_VALUES), description="TM, elements")
    tile_n: TileValues = Field(default=list(DEFAULT_TILE_VALUES), description="TN, elements")
    tile_k: TileValues = Field(default=list(DEFAULT_TILE_VALUES), description="TK, elements")
    buffer_depth: DepthValues = Field(
        default=DepthRange(min=DEFAULT_BUFFER_DEPTHS[0], max=DEFAULT_BUFFER_DEPTHS[-1]),
        description=f"stages held by the shared-memory circular buffer (1..{MAX_BUFFER_DEPTH})",
    )
    enforce_shared_memory: bool = Field(
        default=True,
        description="reject tilings whose buffer_depth*(TM*TK+TK*TN)*element_bytes exceeds "
        "the device's shared memory per CTA (the paper has no such limit)",
    )
    group_m: TileValues | None = Field(
        default=None,
        description="raster group rows, output tiles (Triton's GROUP_SIZE_M; 1: row-major): "
        "CTAs walk group_m tile rows column by column. Searched under memory_model 'l2-reuse' "
        "only (else only [1]); null: [1, 8] under 'l2-reuse', [1] under 'dram-stream'",
    )
    split_k: TileValues | None = Field(
        default=None,
        description="split-K slices (1: none): each CTA reduces ceil(k / split_k) of K, the "
        "grid grows split_k-fold and the fp32 partial sums cost a reduction. At most "
        "ceil(k / smallest tile_k) (422 beyond); larger tile_k values skip the split_k they "
        "cannot fill. Searched under memory_model 'l2-reuse' only (else only [1]); null: "
        "[1, 2, 4, 8, 16] under 'l2-reuse', those the smallest tile_k can fill, [1] under "
        "'dram-stream'",
    )


class GemmWsDeviceParams(RequestModel):
    """Inline machine figures instead of a profile id (§2.2 / §4.2 of the GeMM-WS paper)."""

    sm_count: int = Field(ge=1, le=100_000, description="streaming multiprocessors")
    t_init_us: float = Field(ge=0, le=1e6, description="kernel launch time T_INIT, us")
    t_epilogue_us: float = Field(ge=0, le=1e6, description="epilogue time T_EPILOGUE, us")
    load_startup_latency_us: float = Field(ge=0, le=1e6, description="DMA startup latency, us")
    compute_startup_latency_us: float = Field(
        default=0.0, ge=0, le=1e6, description="MATH startup latency, us"
    )
    load_throughput_elements_per_us: float = Field(
        # ge, not gt=0: a subnormal throughput makes every time overflow a float (found by
        # the schema fuzzing test, tests/app/test_fuzz_schema.py)
        ge=1e-6,
        le=1e12,
        description="DMA throughput, matrix elements per microsecond",
    )
    compute_throughput_macs_per_us: float = Field(
        ge=1e-6, le=1e15, description="MATH throughput, multiply-accumulates per microsecond"
    )
    shared_memory_per_block_bytes: int | None = Field(
        default=None, ge=1, le=1 << 30, description="shared memory a CTA may use, bytes"
    )
    # residency limits of one SM: async-copy only (CTAs per SM); null: no limit from it
    max_blocks_per_sm: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="async-copy: resident CTAs per SM at most (null: 1, one CTA per SM)",
    )
    shared_memory_per_sm_bytes: int | None = Field(
        default=None, ge=1, le=1 << 30, description="async-copy: shared memory of one SM, bytes"
    )
    max_threads_per_sm: int | None = Field(
        default=None, ge=1, le=1 << 20, description="async-copy: resident threads per SM at most"
    )
    registers_per_sm: int | None = Field(
        default=None, ge=1, le=1 << 30, description="async-copy: 32-bit registers of one SM"
    )

    #: the fields that are not GeMM-WS machine figures (perfmodel.gemm_ws.GemmWsMachine)
    RESIDENCY_FIELDS: ClassVar[tuple[str, ...]] = (
        "max_blocks_per_sm",
        "shared_memory_per_sm_bytes",
        "max_threads_per_sm",
        "registers_per_sm",
    )


# --- explicit candidate lists ---------------------------------------------------------------
#: most entries a request's ``candidates`` list may hold
MAX_CANDIDATES = 4096
#: largest ``params`` object of one candidate, compact JSON in UTF-8 bytes (checked by the
#: conversion: no JSON schema keyword bounds an object's encoded size)
MAX_CANDIDATE_PARAMS_BYTES = 1024
#: the shortlist length of a search space when top_k is not given (a candidate list ranks
#: every feasible candidate instead)
DEFAULT_TOP_K = 5

#: ``search_space`` and ``candidates`` exclude each other: at most one of them non-null
SPACE_OR_CANDIDATES_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"properties": {"search_space": {"type": "null"}}},
        {"properties": {"candidates": {"type": "null"}}},
    ]
}


class CandidateIn(RequestModel):
    """One tiling of an explicit candidate list (elements; buffer depth in stages), with an
    opaque ``params`` object (e.g. a Triton config's num_warps) echoed untouched."""

    tile_m: TileM
    tile_n: TileN
    tile_k: TileK
    buffer_depth: BufferDepth
    params: dict[str, Any] | None = Field(
        default=None,
        description="opaque JSON object echoed untouched in the answer (at most "
        f"{MAX_CANDIDATE_PARAMS_BYTES} bytes as compact UTF-8 JSON, else 422); candidates "
        "with equal tiles and buffer depth but other params form one group",
    )


class OptimizeTilingRequest(RequestModel):
    model_config = ConfigDict(
        json_schema_extra={"allOf": [ONE_DEVICE_SCHEMA, SPACE_OR_CANDIDATES_SCHEMA]}
    )

    m: RowsM
    n: ColumnsN
    k: ReductionK
    dtype: Dtype = Field(default="fp16", description="element type of A and B")
    device: str | None = Field(
        default=None,
        max_length=MAX_ID_CHARS,
        description="device profile id, calibrated id or name (GET /devices)",
    )
    device_params: GemmWsDeviceParams | None = Field(
        default=None, description="inline machine figures instead of a profile"
    )
    search_space: SearchSpaceSpec | None = Field(
        default=None,
        description="candidate values per dimension (null: the default space); not with candidates",
    )
    candidates: list[CandidateIn] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CANDIDATES,
        description=f"explicit tilings to rank instead of a search space (1..{MAX_CANDIDATES} "
        "entries; not with search_space): the answer ranks exactly these, lists the ones a "
        "hardware constraint rejects under 'infeasible', and Z3 proves the best among them",
    )
    top_k: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOP_K,
        description=f"length of the shortlist, in ranks (null: {DEFAULT_TOP_K} for a search "
        "space, every feasible candidate for a candidate list)",
    )
    time_limit_s: float = Field(
        default=DEFAULT_TIME_LIMIT_S,
        ge=MIN_TIME_LIMIT_S,
        # the server's configured maximum (KPERF_MAX_TIME_LIMIT_S) is checked per request
        le=TIME_LIMIT_CEILING_S,
        description=f"solver budget, s (at least {MIN_TIME_LIMIT_S}); default and maximum are "
        "the server's settings",
    )
    solver: Literal["certified", "z3-search"] = Field(
        default="certified",
        description="'certified': the exact scorer ranks the whole space and Z3 proves its "
        "best optimal (one check); 'z3-search': Z3 searches rank by rank (slower; for "
        "comparison, spaces of at most 4096 tile triples)",
    )
    include_timeline: bool = Field(
        default=False,
        description="return per-stage event times; refused (422) above 65536 stages, "
        "k / smallest tile_k",
    )
    wave_time_model: Literal["paper", "include-last-math"] = Field(
        default="paper",
        description="'paper': wave time = Sm(S) + T_EPILOGUE as printed in §2.2; "
        "'include-last-math': also waits for the last MATH to finish (pipeline_model 'paper' "
        "only: an async-copy wave always ends when its last MATH does)",
    )
    pipeline_model: PipelineModelName | None = Field(
        default=None,
        description="GeMM-WS pipeline model: 'paper' (eq. (1)-(3): one load in flight, every "
        "buffer depth >= 2 predicts the same time) or 'async-copy' (cp.async/TMA: copies issued "
        "back to back, up to buffer_depth stages in flight, several CTAs per SM sharing it); "
        "null: the device's default (GET /devices/{id}; 'paper' for inline device_params). "
        "The answer names the model used",
    )
    threads_per_cta: ThreadsPerCta | None = Field(
        default=None,
        description=f"async-copy: threads of one CTA (1..{MAX_THREADS_PER_CTA}, at most the "
        "device's max_threads_per_block, else 422); with registers_per_thread it limits the "
        "CTAs per SM by the SM's threads and registers (null: no limit from them; a CTA no SM "
        "holds is a 422); 'paper' runs one CTA per SM whatever they are",
    )
    registers_per_thread: RegistersPerThread | None = Field(
        default=None,
        description=f"async-copy: 32-bit registers per thread (1..{MAX_REGISTERS_PER_THREAD}, "
        "at most the device's max_registers_per_thread, else 422); used with threads_per_cta "
        "(ignored without it)",
    )
    memory_model: Literal["dram-stream", "l2-reuse"] | None = Field(
        default=None,
        description="where the tile loads come from. 'l2-reuse': per wave, CTAs sharing an A "
        "row panel or a B column panel fetch it from DRAM once and hit L2 otherwise (raster "
        "order by group_m, reuse bounded by the L2 size, bytes), so each configuration's load "
        "throughput (elements/us) and latency (us) follow from the device's memory section "
        "(DRAM and L2 bandwidth, GB/s; latencies, ns); split-K adds its reduction (partial "
        "sums at DRAM bandwidth plus a kernel launch, us). Each candidate then reports "
        "dram_bytes, l2_hit_rate, group_m and split_k. Needs a device profile with a memory "
        "section and the certified solver. 'dram-stream' (the GeMM-WS paper's): every CTA "
        "streams its A and B tiles at the device's per-SM load throughput (elements/us) and "
        "load latency (us). null: 'l2-reuse' where it can answer (a profile with a memory "
        "section, the certified solver), else 'dram-stream'. The answer names the model used",
    )
    shortlist: Literal["explore", "exploit"] = Field(
        default="explore",
        description="'explore': rank 1 is the proven optimum, the other ranks the "
        "configurations most often fastest when the device's figures are drawn from its "
        "posterior (or priors), so the true best is likely among them; 'exploit': the top_k "
        "fastest under the point estimate. A confident profile makes them agree",
    )


class GemmWsRun(RequestModel):
    """One GEMM launch: the problem, its element type and the tiling it ran with (elements).

    A GeMM-WS measurement (POST /calibrate, POST /devices/{id}/measurements) is one of these
    plus ``measured_time_us``; every /optimize-tiling candidate carries its own, prefilled.
    """

    m: RowsM
    n: ColumnsN
    k: ReductionK
    dtype: Dtype = Field(description="element type of A and B")
    tile_m: TileM
    tile_n: TileN
    tile_k: TileK
    buffer_depth: BufferDepth


class TilingOut(BaseModel):
    """A tiling in an answer: the output tile and stage depth (elements), the buffer depth."""

    tile_m: int = Field(description="TM, rows of the output tile, elements")
    tile_n: int = Field(description="TN, columns of the output tile, elements")
    tile_k: int = Field(description="TK, reduction depth of one stage, elements")
    buffer_depth: int = Field(description="stages held by the shared-memory circular buffer")


class TilingPrediction(TilingOut):
    predicted_time_us: float = Field(description="overall execution time W x wave + T_INIT, us")
    waves: int = Field(description="W = ceil(output tiles / SMs)")
    stages: int = Field(description="S = ceil(K / TK)")
    t_load_a_us: float = Field(
        description="T_LOAD-A per stage, us (async-copy: the A tile's share of the issue time "
        "d, by element count, at the CTAs' shared throughput; the latency is load_latency_us)"
    )
    t_load_b_us: float = Field(description="T_LOAD-B per stage, us (async-copy: B's share of d)")
    t_math_us: float = Field(
        description="T_MATH per stage, us (async-copy: at the CTAs' shared throughput)"
    )
    math_wait_us: float = Field(description="total MATH wait, W x sum of per-stage waits, us")
    group_m: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="raster group rows (memory_model 'l2-reuse' only)",
    )
    split_k: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="split-K slices, 1 = none (memory_model 'l2-reuse' only)",
    )
    dram_bytes: float | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="bytes of A and B tiles read from DRAM, whole GEMM (memory_model "
        "'l2-reuse' only)",
    )
    l2_hit_rate: float | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="fraction of the bytes the CTAs load that hit L2, 0..1 (memory_model "
        "'l2-reuse' only)",
    )
    bound: Literal["latency", "load", "math"] = Field(
        description="what sets the steady-state period of a stage. 'paper': 'load' when "
        "T_LOAD-A + T_LOAD-B exceeds T_MATH, else 'math' (never 'latency': each load carries "
        "its latency). 'async-copy': 'latency' when d + latency + T_MATH exceeds "
        "buffer_depth x max(d, T_MATH) (too few slots to hide the latency), else 'load' when "
        "d > T_MATH, else 'math'"
    )
    ctas_per_sm: int = Field(
        description="CTAs resident on one SM and sharing it in a full wave ('paper': always 1; "
        "async-copy: the tightest of max_blocks_per_sm, shared memory, and threads/registers "
        "when given, at most the CTAs the SM receives)"
    )
    stages_in_flight: int = Field(
        description="stages holding a buffer slot in the steady state. 'paper': buffer_depth "
        "when MATH-bound (the DMA warp fills every slot ahead), else min(buffer_depth, 2) (one "
        "stage loading, one multiplied). 'async-copy': buffer_depth when latency- or "
        "MATH-bound, ceil((d + latency + T_MATH) / d) when load-bound"
    )
    load_latency_us: float | None = Field(
        default=None,
        description="async-copy: time from the end of a copy's issue to its data in shared "
        "memory, us (the profile's load_startup_latency_us); null under 'paper', whose "
        "T_LOAD-A and T_LOAD-B include it",
    )
    shared_memory_bytes: int = Field(description="circular buffer size for this dtype, bytes")
    measurement: GemmWsRun = Field(
        description="this run, ready to post back: add measured_time_us and send it to the "
        "response's feedback.url"
    )
    probability_best: float | None = Field(
        default=None,
        description="share of posterior draws of the device's figures in which this tiling is "
        "the fastest of the space (null when the space was too large to draw over); for a "
        "candidate list, the share of its group (candidates with equal tiles and buffer depth "
        "share one rank and prediction), summing to 1 over the groups",
    )
    interval_low_us: float | None = Field(
        default=None, description="10 % quantile of the predicted time over the draws, us"
    )
    interval_high_us: float | None = Field(
        default=None, description="90 % quantile of the predicted time over the draws, us"
    )
    input_index: int | None = Field(
        default=None,
        description="position of this candidate in the request's candidates list (null for "
        "a search space)",
    )
    params: dict[str, Any] | None = Field(
        default=None, description="the candidate's params, as the request gave them"
    )


class InfeasibleCandidate(TilingOut):
    """A requested candidate that a hardware constraint rejects (not ranked)."""

    input_index: int = Field(description="position in the request's candidates list")
    params: dict[str, Any] | None = Field(description="the candidate's params, as given")
    constraint: str = Field(
        description="the constraint that rejects it, named as in search.rejected (e.g. "
        "'shared_memory_per_block')"
    )
    reason: str = Field(description="why, with the figures compared (bytes)")


class RankedCandidate(TilingPrediction):
    rank: int = Field(
        ge=1, description="1 = best: by predicted time, then total MATH wait, then tie-break"
    )
    why: str | None = Field(
        default=None,
        max_length=400,
        description="why this rank: rank 1 the proven optimum under the device's point "
        "figures; in 'explore' the likeliest true bests next (fastest in the most draws of "
        "the device's figures), then, fastest in no draw, the point estimate's order; in "
        "'exploit' the point estimate's order",
    )


class ShortlistOut(BaseModel):
    """How the shortlist was chosen and what its uncertainty is drawn from."""

    mode: Literal["explore", "exploit"] = Field(description="the request's shortlist mode")
    belief: Literal["calibration", "priors", "none"] = Field(
        description="'calibration': the posterior of the profile's last GeMM-WS calibration; "
        "'priors': the profile's priors (uncalibrated); 'none': not drawn (see note)"
    )
    draws: int = Field(description="posterior draws behind probability_best and the intervals")
    note: str | None = Field(default=None, description="why nothing was drawn, when so")


class SearchSummaryOut(BaseModel):
    candidates_considered: int = Field(description="tilings in the search space")
    feasible: int = Field(description="tilings that passed every hardware constraint")
    rejected: dict[str, int] = Field(description="candidates rejected, per constraint")


class CertificateCheckOut(BaseModel):
    claim: str = Field(description="what the check asked Z3 (refuted by 'unsat')")
    outcome: Literal["unsat", "sat", "unknown"] = Field(
        description="'unsat': proven, no configuration beats the answer; 'sat': Z3 found a "
        "better one (a bug; the answer then comes from the Z3 search); 'unknown': out of time"
    )


class SolverStats(BaseModel):
    elapsed_ms: float = Field(description="time the solve took in the worker, ms")
    z3_version: str
    checks: int = Field(description="Z3 satisfiability checks run")
    mode: Literal["certified", "z3-search"] = Field(description="which solver path ran")
    configurations_scored: int = Field(
        description="configurations the exact scorer evaluated (0 for z3-search)"
    )
    certificate: list[CertificateCheckOut] = Field(
        description="the Z3 checks certifying the scorer's best (empty for z3-search, or when "
        "the time ran out before them)"
    )
    certificate_mismatches: int = Field(
        default=0, description="1 when Z3 refuted the scorer's best (answered by the Z3 search)"
    )


class TimelineStage(BaseModel):
    stage: int = Field(description="stage index i, 1..stages")
    load_a_start_us: float = Field(
        description="start of the A tile's load (async-copy: of the stage's copy issue)"
    )
    load_b_start_us: float = Field(
        description="start of the B tile's load (async-copy: after A's share of the issue)"
    )
    math_start_us: float
    math_wait_us: float
    arrival_us: float | None = Field(
        default=None,
        description="async-copy: the stage's data in shared memory (issue end + latency); "
        "null under 'paper'",
    )


class Feedback(BaseModel):
    """Where measured times of the shortlisted tilings go to calibrate the device: POST
    ``{"model": "gemm-ws", "measurements": [...]}`` to ``url``, each item a candidate's
    ``measurement`` plus its ``measured_time_us``; then POST ``recalibrate_url``."""

    url: str = Field(description="path to POST measured runs to, relative to the service")
    recalibrate_url: str = Field(description="path to POST to refit from every posted run")
    model: Literal["gemm-ws"] = Field(
        default="gemm-ws", description="the model field of the measurements request body"
    )


class OptimizeTilingResponse(BaseModel):
    status: Literal["optimal", "timeout"] = Field(
        description="'optimal': Z3 proved every ranked entry; 'timeout': best found in time"
    )
    device: str = Field(description="profile id, or 'inline' for device_params")
    dtype: Dtype
    pipeline_model: PipelineModelName = Field(
        description="the GeMM-WS pipeline model that answered: the request's, else the "
        "device's default"
    )
    memory_model: Literal["dram-stream", "l2-reuse"] = Field(
        description="the memory model that answered: the request's, else 'l2-reuse' where the "
        "device has a memory section and the certified solver searched, else 'dram-stream'"
    )
    best: TilingPrediction
    candidates: list[RankedCandidate] = Field(
        description="the shortlist, best first; for a candidate list every requested entry of "
        "the ranked groups, in request order within a group"
    )
    infeasible: list[InfeasibleCandidate] | None = Field(
        default=None,
        description="requested candidates a hardware constraint rejects, in request order "
        "(null for a search space)",
    )
    search: SearchSummaryOut
    solver: SolverStats
    shortlist: ShortlistOut | None = Field(
        default=None, description="how the shortlist was chosen; null on a timeout answer"
    )
    profile_provenance: ProfileProvenanceOut | None = Field(
        default=None, description="where the device figures come from"
    )
    timeline: list[TimelineStage] | None = Field(
        default=None, description="one wave of the best tiling, us from the wave's start"
    )
    feedback: Feedback | None = Field(
        default=None,
        description="how to post measured times back (POST /devices/{device}/measurements, "
        "then POST /devices/{device}/recalibrate, with the device as the request named it: a "
        "name moves to the refit profile); null for inline device_params",
    )
