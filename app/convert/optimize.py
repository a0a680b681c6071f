"""Conversions for POST /optimize-tiling: request schema -> core problem, core result ->
response schema. Used by the route (early 4xx checks) and by the worker job alike."""

from __future__ import annotations

from dataclasses import dataclass

from app.schemas.base import provenance_out
from app.schemas.optimize import (
    CertificateCheckOut,
    Feedback,
    GemmWsRun,
    OptimizeTilingRequest,
    OptimizeTilingResponse,
    RankedCandidate,
    SearchSpaceSpec,
    SearchSummaryOut,
    ShortlistOut,
    SolverStats,
    TileValues,
    TilingPrediction,
    TimelineStage,
    ValueRange,
)
from device_profiles import DeviceProfile, ModelNotServed, get_profile
from device_profiles.priors import gemm_ws_dtype_ratios
from device_profiles.provenance import Provenance
from device_profiles.schema import REQUIRED_GEMM_WS_FIGURES
from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import (
    GemmShape,
    GemmWsMachine,
    Simulation,
    WaveTimeModel,
    ns_to_us,
    scaled_throughputs,
)
from solver import (
    ELEMENT_BYTES,
    SearchSpace,
    SolverMode,
    TilingProblem,
    TilingResult,
    values_from_range,
)
from solver.candidates import CandidateProblem
from solver.optimize import check_mode

#: most stages a timeline may list: S = ceil(K / TK) for the largest K (2^20) and the smallest
#: default tile (16). A smaller TK makes the body grow ~120 bytes per stage (TK = 1 and
#: K = 2^20 gave a 129 MB answer that took longer than its time limit to send)
MAX_TIMELINE_STAGES = 1 << 16


def gemm_ws_machine(profile: DeviceProfile, dtype: str = "fp16") -> GemmWsMachine:
    """The GeMM-WS figures of a profile for element type ``dtype`` (the fp16 figures scaled
    by the profile's cited ratios); ModelNotServed names what is missing, a dtype the device
    lacks is a ModelInputError naming ``dtype``."""
    section = profile.gemm_ws
    if section is None:
        missing = [f"gemm_ws.{name}" for name in REQUIRED_GEMM_WS_FIGURES]
        raise ModelNotServed(profile.id, "gemm-ws", missing)
    ratios = dtype_ratios(profile, dtype)
    shared = profile.hardware.shared_memory_per_block_bytes
    reference = GemmWsMachine(
        sm_count=int(profile.hardware.sm_count.value),
        t_init_us=section.t_init_us.value,
        t_epilogue_us=section.t_epilogue_us.value,
        load_startup_latency_us=section.load_startup_latency_us.value,
        compute_startup_latency_us=section.compute_startup_latency_us.value,
        load_throughput_elements_per_us=section.load_throughput_elements_per_us.value,
        compute_throughput_macs_per_us=section.compute_throughput_macs_per_us.value,
        shared_memory_per_block_bytes=int(shared.value) if shared is not None else None,
    )
    return scaled_throughputs(reference, ratios)


def dtype_ratios(profile: DeviceProfile, dtype: str) -> tuple[float, float]:
    """(load, compute) throughput ratios of ``dtype`` to the profile's fp16 figures; a dtype
    the device lacks is a ModelInputError naming ``dtype``."""
    ratios = gemm_ws_dtype_ratios(profile)
    if dtype not in ratios:
        raise ModelInputError(
            "dtype",
            f"device {profile.id!r} has no {dtype} GEMM rate (its element types: "
            + ", ".join(sorted(ratios))
            + ")",
        )
    return ratios[dtype]


def _values(field: str, spec: TileValues) -> tuple[int, ...]:
    if isinstance(spec, ValueRange):
        return values_from_range(field, spec.min, spec.max, spec.multiple_of)
    return tuple(spec)


def to_problem(
    request: OptimizeTilingRequest, profile: DeviceProfile | None = None
) -> tuple[str, TilingProblem]:
    """The core problem on ``profile`` (what ``request.device`` resolved to: the service
    resolves calibrated ids and names, ``Service.resolve_profile``; None looks up a shipped
    id) or on the inline ``device_params``; returns (device id or "inline", problem)."""
    device, machine = request_machine(request, profile)
    spec = request.search_space or SearchSpaceSpec()
    space = SearchSpace(
        tile_m=_values("tile_m", spec.tile_m),
        tile_n=_values("tile_n", spec.tile_n),
        tile_k=_values("tile_k", spec.tile_k),
        buffer_depth=_values("buffer_depth", spec.buffer_depth),
        enforce_shared_memory=spec.enforce_shared_memory,
    )
    check_timeline(request, space.tile_k[0])
    # the pure Z3 search's own space limit, up front (422 before a worker is taken)
    check_mode(space, SolverMode(request.solver))
    problem = TilingProblem(
        shape=GemmShape(request.m, request.n, request.k),
        machine=machine,
        space=space,
        element_bytes=ELEMENT_BYTES[request.dtype],
        wave_model=WaveTimeModel(request.wave_time_model),
    )
    return device, problem


def request_machine(
    request: OptimizeTilingRequest, profile: DeviceProfile | None = None
) -> tuple[str, GemmWsMachine]:
    """(device id or "inline", GeMM-WS figures for the request's dtype): from ``profile``
    (see :func:`to_problem`) or the inline ``device_params``."""
    if request.device is not None and request.device_params is not None:
        raise ModelInputError("device", "give either device or device_params, not both")
    if request.device is not None:
        profile = profile if profile is not None else get_profile(request.device)
        device = profile.id
        machine = gemm_ws_machine(profile, request.dtype)
    elif request.device_params is not None:
        device = "inline"
        machine = GemmWsMachine(**request.device_params.model_dump())
    else:
        raise ModelInputError(
            "device", "give a device profile id (GET /devices) or inline device_params"
        )
    return device, machine


def check_timeline(request: OptimizeTilingRequest, smallest_tile_k: int) -> None:
    """Refuse a timeline longer than MAX_TIMELINE_STAGES stages (ModelInputError)."""
    stages = -(-request.k // smallest_tile_k)  # the most stages any candidate has
    if request.include_timeline and stages > MAX_TIMELINE_STAGES:
        raise ModelInputError(
            "include_timeline",
            f"a timeline of up to {stages} stages (k / smallest tile_k) exceeds the limit of "
            f"{MAX_TIMELINE_STAGES}; drop include_timeline or allow larger tile_k values",
        )


@dataclass(frozen=True, slots=True)
class Solved:
    """A solve's result with the shortlist chosen for the request, and how."""

    result: TilingResult
    shortlist: ShortlistOut | None
    #: per ranked candidate: (probability_best, interval low, interval high), or empty
    uncertainty: tuple[tuple[float, float, float], ...] = ()


def _prediction(
    request: OptimizeTilingRequest, sim: Simulation, element_bytes: int
) -> dict[str, object]:
    t, d = sim.tiling, sim.durations
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
    return {
        "measurement": run,
        "tile_m": t.tile_m,
        "tile_n": t.tile_n,
        "tile_k": t.tile_k,
        "buffer_depth": t.buffer_depth,
        "predicted_time_us": ns_to_us(sim.overall_time_ns),
        "waves": sim.waves,
        "stages": sim.stages,
        "t_load_a_us": ns_to_us(d.t_load_a_ns),
        "t_load_b_us": ns_to_us(d.t_load_b_ns),
        "t_math_us": ns_to_us(d.t_math_ns),
        "math_wait_us": ns_to_us(sim.total_math_wait_ns),
        "bound": "load" if sim.load_bound else "math",
        "shared_memory_bytes": t.shared_memory_bytes(element_bytes),
    }


def to_response(
    request: OptimizeTilingRequest,
    device: str,
    problem: TilingProblem | CandidateProblem,
    solved: Solved,
    origin: Provenance | None = None,
) -> OptimizeTilingResponse:
    result = solved.result
    eb = problem.element_bytes

    def with_uncertainty(rank: int, sim: Simulation) -> dict[str, object]:
        out = _prediction(request, sim, eb)
        if solved.uncertainty:
            p, low, high = solved.uncertainty[rank - 1]
            out.update(probability_best=p, interval_low_us=low, interval_high_us=high)
        return out

    timeline = None
    if request.include_timeline:
        timeline = [
            TimelineStage(
                stage=e.stage,
                load_a_start_us=ns_to_us(e.load_a_start_ns),
                load_b_start_us=ns_to_us(e.load_b_start_ns),
                math_start_us=ns_to_us(e.math_start_ns),
                math_wait_us=ns_to_us(e.math_wait_ns),
            )
            for e in result.best.events
        ]
    return OptimizeTilingResponse(
        status="optimal" if result.status == "optimal" else "timeout",
        device=device,
        dtype=request.dtype,
        best=TilingPrediction.model_validate(with_uncertainty(1, result.best)),
        candidates=[
            RankedCandidate.model_validate({"rank": rank, **with_uncertainty(rank, sim)})
            for rank, sim in enumerate(result.candidates, start=1)
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
            mode=result.statistics.mode.value,
            configurations_scored=result.statistics.configurations_scored,
            certificate=[
                CertificateCheckOut(claim=c.claim, outcome=c.outcome)  # type: ignore[arg-type]
                for c in result.statistics.certificate
            ],
            certificate_mismatches=result.statistics.certificate_mismatches,
        ),
        timeline=timeline,
        shortlist=solved.shortlist,
        profile_provenance=provenance_out(origin) if origin is not None else None,
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
