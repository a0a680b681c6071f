"""Conversions for POST /optimize-tiling: request schema -> core problem, core result ->
response schema. Used by the route (early 4xx checks) and by the worker job alike."""

from __future__ import annotations

from collections.abc import Sequence

from app.schemas.optimize import (
    Feedback,
    GemmWsRun,
    OptimizeTilingRequest,
    OptimizeTilingResponse,
    RankedCandidate,
    SearchSummaryOut,
    SolverStats,
    TileValues,
    TilingPrediction,
    TimelineStage,
    ValueRange,
)
from device_profiles import DeviceProfile, ModelNotServed, get_profile
from device_profiles.schema import REQUIRED_GEMM_WS_FIGURES
from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Simulation, WaveTimeModel, ns_to_us
from perfmodel.gemm_ws_async import AsyncSimulation, PipelineModel, SmLimits
from solver import (
    ELEMENT_BYTES,
    SearchSpace,
    TilingProblem,
    TilingResult,
    optimize_tiling,
    values_from_range,
)
from solver.optimize_async import AsyncTilingProblem, AsyncTilingResult, optimize_tiling_async

#: async-copy is the default for estimated GeMM-WS figures from this compute capability on
#: (cp.async, Ampere sm_80; TMA, Hopper sm_90: CUDA C++ Programming Guide, asynchronous copies)
ASYNC_COPY_FROM_COMPUTE_CAPABILITY = (8, 0)

#: the inline device_params fields that are SM limits, not GeMM-WS machine figures
_SM_LIMIT_PARAMS = {"shared_memory_per_sm_bytes", "max_blocks_per_sm"}

#: most stages a timeline may list: S = ceil(K / TK) for the largest K (2^20) and the smallest
#: default tile (16). A smaller TK makes the body grow ~120 bytes per stage (TK = 1 and
#: K = 2^20 gave a 129 MB answer that took longer than its time limit to send)
MAX_TIMELINE_STAGES = 1 << 16


def gemm_ws_machine(profile: DeviceProfile) -> GemmWsMachine:
    """The GeMM-WS figures of a profile; ModelNotServed names what is missing."""
    section = profile.gemm_ws
    if section is None:
        missing = [f"gemm_ws.{name}" for name in REQUIRED_GEMM_WS_FIGURES]
        raise ModelNotServed(profile.id, "gemm-ws", missing)
    shared = profile.hardware.shared_memory_per_block_bytes
    return GemmWsMachine(
        sm_count=int(profile.hardware.sm_count.value),
        t_init_us=section.t_init_us.value,
        t_epilogue_us=section.t_epilogue_us.value,
        load_startup_latency_us=section.load_startup_latency_us.value,
        compute_startup_latency_us=section.compute_startup_latency_us.value,
        load_throughput_elements_per_us=section.load_throughput_elements_per_us.value,
        compute_throughput_macs_per_us=section.compute_throughput_macs_per_us.value,
        shared_memory_per_block_bytes=int(shared.value) if shared is not None else None,
    )


def default_pipeline_model(profile: DeviceProfile | None) -> PipelineModel:
    """'paper' where the GeMM-WS figures are published (the paper's A6000) or given inline;
    'async-copy' for estimated GeMM-WS figures on compute capability >= 8.0."""
    if profile is None or profile.gemm_ws is None:
        return PipelineModel.PAPER
    estimated = any(f.startswith("gemm_ws.") for f in profile.estimated_figures())
    try:
        capability = tuple(int(part) for part in (profile.compute_capability or "").split("."))
    except ValueError:
        return PipelineModel.PAPER
    if estimated and capability >= ASYNC_COPY_FROM_COMPUTE_CAPABILITY:
        return PipelineModel.ASYNC_COPY
    return PipelineModel.PAPER


def sm_limits(request: OptimizeTilingRequest, profile: DeviceProfile | None) -> SmLimits:
    """CTAs-per-SM limits: the profile's hardware section (or inline device_params) and the
    request's threads and registers per CTA."""
    if (request.threads_per_cta is None) != (request.registers_per_thread is None):
        missing = (
            "registers_per_thread" if request.registers_per_thread is None else ("threads_per_cta")
        )
        raise ModelInputError(
            missing, "give threads_per_cta and registers_per_thread together, or neither"
        )
    threads, registers = request.threads_per_cta, request.registers_per_thread
    if profile is None:
        params = request.device_params
        return SmLimits(
            max_blocks_per_sm=(params.max_blocks_per_sm if params else None) or 1,
            shared_memory_per_sm_bytes=params.shared_memory_per_sm_bytes if params else None,
            threads_per_cta=threads,
            registers_per_thread=registers,
        )
    hw = profile.hardware

    def figure(value: object) -> int | None:
        return int(value.value) if value is not None else None  # type: ignore[attr-defined]

    return SmLimits(
        max_blocks_per_sm=figure(hw.max_blocks_per_sm) or 1,
        shared_memory_per_sm_bytes=figure(hw.shared_memory_per_sm_bytes),
        registers_per_sm=figure(hw.registers_per_sm),
        max_threads_per_sm=figure(hw.max_threads_per_sm),
        threads_per_cta=threads,
        registers_per_thread=registers,
    )


def _values(field: str, spec: TileValues) -> tuple[int, ...]:
    if isinstance(spec, ValueRange):
        return values_from_range(field, spec.min, spec.max, spec.multiple_of)
    return tuple(spec)


def to_problem(
    request: OptimizeTilingRequest, profile: DeviceProfile | None = None
) -> tuple[str, TilingProblem | AsyncTilingProblem]:
    """The core problem on ``profile`` (what ``request.device`` resolved to: the service
    resolves calibrated ids and names, ``Service.resolve_profile``; None looks up a shipped
    id) or on the inline ``device_params``; returns (device id or "inline", problem)."""
    if request.device is not None and request.device_params is not None:
        raise ModelInputError("device", "give either device or device_params, not both")
    if request.device is not None:
        profile = profile if profile is not None else get_profile(request.device)
        device = profile.id
        machine = gemm_ws_machine(profile)
    elif request.device_params is not None:
        device = "inline"
        machine = GemmWsMachine(**request.device_params.model_dump(exclude=_SM_LIMIT_PARAMS))
        profile = None
    else:
        raise ModelInputError(
            "device", "give a device profile id (GET /devices) or inline device_params"
        )
    spec = request.search_space
    space = SearchSpace(
        tile_m=_values("tile_m", spec.tile_m),
        tile_n=_values("tile_n", spec.tile_n),
        tile_k=_values("tile_k", spec.tile_k),
        buffer_depth=_values("buffer_depth", spec.buffer_depth),
        enforce_shared_memory=spec.enforce_shared_memory,
    )
    stages = -(-request.k // space.tile_k[0])  # the most stages any candidate has
    if request.include_timeline and stages > MAX_TIMELINE_STAGES:
        raise ModelInputError(
            "include_timeline",
            f"a timeline of up to {stages} stages (k / smallest tile_k) exceeds the limit of "
            f"{MAX_TIMELINE_STAGES}; drop include_timeline or allow larger tile_k values",
        )
    shape = GemmShape(request.m, request.n, request.k)
    element_bytes = ELEMENT_BYTES[request.dtype]
    pipeline = (
        PipelineModel(request.pipeline_model)
        if request.pipeline_model is not None
        else default_pipeline_model(profile)
    )
    limits = sm_limits(request, profile)
    if pipeline is PipelineModel.ASYNC_COPY:
        return device, AsyncTilingProblem(shape, machine, space, limits, element_bytes)
    problem = TilingProblem(
        shape=shape,
        machine=machine,
        space=space,
        element_bytes=element_bytes,
        wave_model=WaveTimeModel(request.wave_time_model),
    )
    return device, problem


def solve(
    problem: TilingProblem | AsyncTilingProblem, top_k: int, time_limit_s: float
) -> TilingResult | AsyncTilingResult:
    """Run the optimizer of the problem's pipeline model."""
    if isinstance(problem, AsyncTilingProblem):
        return optimize_tiling_async(problem, top_k=top_k, time_limit_s=time_limit_s)
    return optimize_tiling(problem, top_k=top_k, time_limit_s=time_limit_s)


def _prediction(
    request: OptimizeTilingRequest, sim: Simulation | AsyncSimulation, element_bytes: int
) -> dict[str, object]:
    t = sim.tiling
    run = GemmWsRun(
        m=request.m,
        n=request.n,
        k=request.k,
        dtype=request.dtype,
        tile_m=t.tile_m,
        tile_n=t.tile_n,
        tile_k=t.tile_k,
        buffer_depth=t.buffer_depth,
    )
    common: dict[str, object] = {
        "measurement": run,
        "tile_m": t.tile_m,
        "tile_n": t.tile_n,
        "tile_k": t.tile_k,
        "buffer_depth": t.buffer_depth,
        "predicted_time_us": ns_to_us(sim.overall_time_ns),
        "waves": sim.waves,
        "stages": sim.stages,
        "math_wait_us": ns_to_us(sim.total_math_wait_ns),
        "shared_memory_bytes": t.shared_memory_bytes(element_bytes),
    }
    if isinstance(sim, AsyncSimulation):
        d = sim.durations
        # The issue cost splits between the A (TM x TK) and B (TK x TN) tiles by elements.
        a_share = t.tile_m / (t.tile_m + t.tile_n)
        return common | {
            "t_load_a_us": ns_to_us(d.issue_ns) * a_share,
            "t_load_b_us": ns_to_us(d.issue_ns) * (1 - a_share),
            "t_math_us": ns_to_us(d.math_ns),
            "bound": sim.bound.value,
            "ctas_per_sm": sim.ctas_per_sm,
            "stages_in_flight": sim.stages_in_flight,
            "load_latency_us": ns_to_us(d.latency_ns),
        }
    p = sim.durations
    depth = t.buffer_depth
    return common | {
        "t_load_a_us": ns_to_us(p.t_load_a_ns),
        "t_load_b_us": ns_to_us(p.t_load_b_ns),
        "t_math_us": ns_to_us(p.t_math_ns),
        "bound": "load" if sim.load_bound else "math",
        "ctas_per_sm": 1,
        # eq. (1)-(3): one load at a time; MATH-bound, the DMA warp fills every slot ahead
        # of MATH; load-bound, one stage loads while the previous one is multiplied.
        "stages_in_flight": min(depth, 2) if sim.load_bound else depth,
    }


def _timeline(result: TilingResult | AsyncTilingResult) -> list[TimelineStage]:
    best = result.best
    if isinstance(best, AsyncSimulation):
        # A and B are issued together: B's issue follows A's on the copy engine.
        a_share = best.tiling.tile_m / (best.tiling.tile_m + best.tiling.tile_n)
        issue_a_ns = best.durations.issue_ns * a_share
        return [
            TimelineStage(
                stage=e.stage,
                load_a_start_us=ns_to_us(e.issue_start_ns),
                load_b_start_us=(e.issue_start_ns + issue_a_ns) / 1000,
                math_start_us=ns_to_us(e.math_start_ns),
                math_wait_us=ns_to_us(e.math_wait_ns),
                data_arrival_us=ns_to_us(e.arrival_ns),
            )
            for e in best.events
        ]
    return [
        TimelineStage(
            stage=e.stage,
            load_a_start_us=ns_to_us(e.load_a_start_ns),
            load_b_start_us=ns_to_us(e.load_b_start_ns),
            math_start_us=ns_to_us(e.math_start_ns),
            math_wait_us=ns_to_us(e.math_wait_ns),
        )
        for e in best.events
    ]


def to_response(
    request: OptimizeTilingRequest,
    device: str,
    problem: TilingProblem | AsyncTilingProblem,
    result: TilingResult | AsyncTilingResult,
) -> OptimizeTilingResponse:
    eb = problem.element_bytes
    ranked: Sequence[Simulation | AsyncSimulation] = result.candidates
    timeline = _timeline(result) if request.include_timeline else None
    return OptimizeTilingResponse(
        status="optimal" if result.status == "optimal" else "timeout",
        pipeline_model="async-copy" if isinstance(problem, AsyncTilingProblem) else "paper",
        device=device,
        dtype=request.dtype,
        best=TilingPrediction.model_validate(_prediction(request, result.best, eb)),
        candidates=[
            RankedCandidate.model_validate({"rank": rank, **_prediction(request, sim, eb)})
            for rank, sim in enumerate(ranked, start=1)
        ],
        search=SearchSummaryOut(
            candidates_considered=result.summary.candidates_considered,
            feasible=result.summary.feasible,
            rejected=result.summary.rejected,
        ),
        solver=SolverStats(
            elapsed_ms=result.statistics.elapsed_ms,
            z3_version=result.statistics.z3_version,
            checks=result.statistics.checks,
        ),
        timeline=timeline,
        # the device as the request named it: recalibrating through a name moves the name
        feedback=None if request.device is None else feedback(request.device),
    )


def feedback(device_id: str) -> Feedback:
    """Where the measured times of this answer's tilings go back to (``device_id``: an id or
    a name)."""
    return Feedback(
        url=f"/devices/{device_id}/measurements",
        recalibrate_url=f"/devices/{device_id}/recalibrate",
    )
