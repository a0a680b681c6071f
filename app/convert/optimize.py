"""Conversions for POST /optimize-tiling: request schema -> core problem, core result ->
response schema. Used by the route (early 4xx checks) and by the worker job alike."""

from __future__ import annotations

from dataclasses import dataclass

from app.convert.fields import shared_fields
from app.convert.shortlist_why import Ranked, reasons
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
from device_profiles.pipeline import default_pipeline_model
from device_profiles.priors import gemm_ws_dtype_ratios
from device_profiles.provenance import Provenance
from device_profiles.schema import REQUIRED_GEMM_WS_FIGURES
from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import (
    DEFAULT_GROUP_M,
    DEFAULT_SPLIT_K,
    GemmShape,
    GemmWsMachine,
    SmLimits,
    WaveTimeModel,
    ns_to_us,
    scaled_throughputs,
)
from perfmodel.pipeline import PipelineModel, Prediction
from perfmodel.pipelines import PipelineSettings
from solver import (
    ELEMENT_BYTES,
    InvalidSearchSpace,
    SearchSpace,
    SolverMode,
    TilingProblem,
    TilingResult,
    values_from_range,
)
from solver.problem import CandidateProblem, check_mode

#: the profile's hardware figures that limit async-copy's CTAs per SM (SmLimits' names)
GEMM_WS_RESIDENCY_FIGURES = (
    "max_blocks_per_sm",
    "shared_memory_per_sm_bytes",
    "max_threads_per_sm",
    "registers_per_sm",
)

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


class DtypeNotServed(ModelInputError):
    """A dtype the device has no GEMM rate for: schema-valid, refused by the profile's content
    (a problem type of its own, like a model the device does not serve)."""


def dtype_ratios(profile: DeviceProfile, dtype: str) -> tuple[float, float]:
    """(load, compute) throughput ratios of ``dtype`` to the profile's fp16 figures; a dtype
    the device lacks is a :class:`DtypeNotServed` naming ``dtype``."""
    ratios = gemm_ws_dtype_ratios(profile)
    if dtype not in ratios:
        raise DtypeNotServed(
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


def _raster_values(
    field: str, given: TileValues | None, searched: tuple[int, ...], raster: bool
) -> tuple[int, ...]:
    """A raster dimension's values: the request's, else ``searched`` under the L2-reuse term
    (the only memory model they change), else (1,)."""
    if given is not None:
        return _values(field, given)
    return searched if raster else (1,)


def to_problem(
    request: OptimizeTilingRequest, profile: DeviceProfile | None = None
) -> tuple[str, TilingProblem]:
    """The core problem on ``profile`` (what ``request.device`` resolved to: the service
    resolves calibrated ids and names, ``Service.resolve_profile``; None looks up a shipped
    id) or on the inline ``device_params``; returns (device id or "inline", problem)."""
    if request.device is not None and request.device_params is None and profile is None:
        profile = get_profile(request.device)
    device, machine = request_machine(request, profile)
    spec = request.search_space or SearchSpaceSpec()
    tile_k = _values("tile_k", spec.tile_k)
    raster = memory_model_of(request, profile) == "l2-reuse"
    space = SearchSpace(
        tile_m=_values("tile_m", spec.tile_m),
        tile_n=_values("tile_n", spec.tile_n),
        tile_k=tile_k,
        buffer_depth=_values("buffer_depth", spec.buffer_depth),
        enforce_shared_memory=spec.enforce_shared_memory,
        group_m=_raster_values("group_m", spec.group_m, DEFAULT_GROUP_M, raster),
        # the smallest tile_k (an empty list is SearchSpace's 422 to give)
        split_k=_raster_values(
            "split_k", spec.split_k, default_split_k(request.k, min(tile_k, default=1)), raster
        ),
    )
    check_memory_model(request, profile, space)
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


def memory_model_of(request: OptimizeTilingRequest, profile: DeviceProfile | None) -> str:
    """The memory model that answers: the request's, else 'l2-reuse' where it can (a profile,
    not inline device_params, with a memory section; the certified solver, the only one that
    searches it), else the paper's 'dram-stream'. The L2-aware term is the default because it
    is the model that holds on real GPUs (bench/RESULTS.md, "Real-GPU fidelity").
    A calibrated GeMM-WS profile answers under the model its figures were fitted under, the
    DRAM-stream loads: a load throughput fitted to explain DRAM-stream loads would double
    count the L2's reuse under the L2-aware term (docs/model-notes.md)."""
    if request.memory_model is not None:
        return request.memory_model
    calibration = profile.calibration if profile is not None else None
    if (
        request.device_params is not None
        or profile is None
        or profile.memory is None
        or request.solver != "certified"
        or (calibration is not None and calibration.model == "gemm-ws")
    ):
        return "dram-stream"
    return "l2-reuse"


def default_split_k(k: int, smallest_tile_k: int) -> tuple[int, ...]:
    """The split-K slices searched by default: DEFAULT_SPLIT_K, those the smallest tile_k can
    fill (a slice holds at least one stage)."""
    k_tiles = -(-k // smallest_tile_k)
    return tuple(s for s in DEFAULT_SPLIT_K if s <= k_tiles) or (1,)


def check_memory_model(
    request: OptimizeTilingRequest, profile: DeviceProfile | None, space: SearchSpace
) -> None:
    """Refuse what the memory term cannot answer (ModelInputError naming the field): group_m
    or split_k other than 1 without it, a split_k no tile_k can fill (a slice without a
    stage), the pure Z3 search under it."""
    on = memory_model_of(request, profile) != "dram-stream"
    for name in ("group_m", "split_k"):
        if not on and getattr(space, name) != (1,):
            raise InvalidSearchSpace(
                f"search_space.{name}",
                f"{name} other than 1 is searched under memory_model 'l2-reuse' only",
            )
    k_tiles = -(-request.k // space.tile_k[0])
    if space.split_k[-1] > k_tiles:
        raise InvalidSearchSpace(
            "search_space.split_k",
            f"split_k {space.split_k[-1]} exceeds the {k_tiles} k tiles of the smallest "
            f"tile_k (ceil({request.k} / {space.tile_k[0]})): a slice would hold no stage",
        )


def memory_term(
    model: PipelineModel,
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    settings: PipelineSettings,
) -> PipelineModel:
    """``model`` with the request's memory term: unchanged for 'dram-stream', else the
    L2-reuse term on the profile's cited memory section (device_profiles/memory.py), under the
    residency limits of ``settings`` (:func:`pipeline_settings`: the request's CTA size and
    enforce_shared_memory), whichever pipeline model answers."""
    memory_model = memory_model_of(request, profile)
    if memory_model == "dram-stream":
        return model
    # numpy and the memory figures load only for requests that ask for them
    from device_profiles.memory import memory_model_device
    from perfmodel.pipelines import check_cta_fits, memory_recurrences
    from perfmodel.pipelines.l2_reuse import L2ReuseModel

    if request.solver != "certified":
        raise InvalidSearchSpace(
            "solver",
            f"memory_model {memory_model!r} is searched by the certified solver only",
        )
    if profile is None or request.device_params is not None:
        raise ModelNotServed("inline", "l2-reuse", ["memory"], field="memory_model")
    # the term's residency counts CTAs under every pipeline model: one must fit an SM
    check_cta_fits(settings.limits)
    pipeline = memory_recurrences(model)
    try:
        device = memory_model_device(profile, request.dtype, pipeline)
    except ValueError as error:
        raise ModelNotServed(profile.id, "l2-reuse", [str(error)], field="memory_model") from error
    wrapped: PipelineModel = L2ReuseModel(model, device.base, settings.limits, pipeline)
    return wrapped


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
        params = request.device_params
        machine = GemmWsMachine(**params.model_dump(exclude=set(params.RESIDENCY_FIELDS)))
    else:
        raise ModelInputError(
            "device", "give a device profile id (GET /devices) or inline device_params"
        )
    return device, machine


def pipeline_settings(
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None = None,
    *,
    enforce_shared_memory: bool = True,
) -> PipelineSettings:
    """What a pipeline model may read of the request and the device: the wave-time variant,
    and the SM's residency limits (the profile's, or the inline device_params', with the
    request's threads_per_cta and registers_per_thread; without ``enforce_shared_memory``,
    no shared-memory limit). A CTA size above the device's is a ModelInputError naming the
    field."""
    threads = request.threads_per_cta
    # registers limit residency per CTA: without threads_per_cta they say nothing (ignored)
    registers = request.registers_per_thread if threads is not None else None
    figures: dict[str, int | None] = {}
    max_threads_per_block = max_registers = None
    if request.device_params is not None:
        figures = {f: getattr(request.device_params, f) for f in GEMM_WS_RESIDENCY_FIGURES}
    elif profile is not None:
        hardware = profile.hardware
        for field_name in GEMM_WS_RESIDENCY_FIGURES:
            figure = getattr(hardware, field_name)
            figures[field_name] = int(figure.value) if figure is not None else None
        if hardware.max_threads_per_block is not None:
            max_threads_per_block = int(hardware.max_threads_per_block.value)
        if hardware.max_registers_per_thread is not None:
            max_registers = int(hardware.max_registers_per_thread.value)
    if (
        threads is not None
        and max_threads_per_block is not None
        and threads > max_threads_per_block
    ):
        raise ModelInputError(
            "threads_per_cta",
            f"{threads} threads exceed the device's {max_threads_per_block} threads per CTA",
        )
    if registers is not None and registers > (max_registers or registers):
        raise ModelInputError(
            "registers_per_thread",
            f"{registers} registers exceed the device's {max_registers} per thread",
        )
    shared = figures.get("shared_memory_per_sm_bytes") if enforce_shared_memory else None
    limits = SmLimits(
        max_blocks_per_sm=figures.get("max_blocks_per_sm") or 1,
        shared_memory_per_sm_bytes=shared,
        registers_per_sm=figures.get("registers_per_sm"),
        max_threads_per_sm=figures.get("max_threads_per_sm"),
        threads_per_cta=threads,
        registers_per_thread=registers,
    )
    return PipelineSettings(WaveTimeModel(request.wave_time_model), limits)


def pipeline_name(request: OptimizeTilingRequest, profile: DeviceProfile | None) -> str:
    """The pipeline model that answers: the request's, else the device's default
    (device_profiles/pipeline.py; inline device_params: the paper's)."""
    return request.pipeline_model or default_pipeline_model(
        profile if request.device_params is None else None
    )


def check_timeline(request: OptimizeTilingRequest, smallest_tile_k: int) -> None:
    """Refuse a timeline longer than MAX_TIMELINE_STAGES stages (ModelInputError)."""
    stages = -(-request.k // smallest_tile_k)  # the most stages any candidate has
    if request.include_timeline and stages > MAX_TIMELINE_STAGES:
        raise ModelInputError(
            "include_timeline",
            f"a timeline of up to {stages} stages (k / smallest tile_k) exceeds the limit of "
            f"{MAX_TIMELINE_STAGES}; drop include_timeline or allow larger tile_k values",
        )


#: the core problem of a request: a search space or a candidate list (under its pipeline model)
AnyProblem = TilingProblem | CandidateProblem


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request resolved once, in the parent: the device it names (an id or "inline") and
    the core problem, which carries the pipeline model that answers. The route, the cache key,
    the inline runner and the worker all read this."""

    device: str
    problem: AnyProblem
    #: the memory model that answers (:func:`memory_model_of`)
    memory_model: str = "dram-stream"

    @property
    def model(self) -> PipelineModel:
        return self.problem.model


@dataclass(frozen=True, slots=True)
class Solved:
    """A solve's result with the shortlist chosen for the request, and how."""

    result: TilingResult
    shortlist: ShortlistOut | None
    #: per ranked candidate: (probability_best, interval low, interval high), or empty
    uncertainty: tuple[tuple[float, float, float], ...] = ()


def _prediction(
    request: OptimizeTilingRequest, model: PipelineModel, sim: Prediction, element_bytes: int
) -> dict[str, object]:
    t = sim.tiling
    shape = shared_fields(GemmWsRun, t)  # tile_m, tile_n, tile_k, buffer_depth
    run = GemmWsRun(m=request.m, n=request.n, k=request.k, dtype=request.dtype, **shape)
    return {
        "measurement": run,
        **shape,
        "predicted_time_us": ns_to_us(sim.overall_time_ns),
        "waves": sim.waves,
        "stages": sim.stages,
        **model.answer_fields(sim, element_bytes),
        "shared_memory_bytes": t.shared_memory_bytes(element_bytes),
    }


def to_response(
    request: OptimizeTilingRequest,
    prepared: PreparedRequest,
    solved: Solved,
    origin: Provenance | None = None,
) -> OptimizeTilingResponse:
    result = solved.result
    model = prepared.model
    eb = prepared.problem.element_bytes

    def with_uncertainty(rank: int, sim: Prediction) -> dict[str, object]:
        out = _prediction(request, model, sim, eb)
        if solved.uncertainty:
            p, low, high = solved.uncertainty[rank - 1]
            out.update(probability_best=p, interval_low_us=low, interval_high_us=high)
        return out

    timeline = None
    if request.include_timeline:
        timeline = [TimelineStage.model_validate(row) for row in model.timeline_rows(result.best)]
    return OptimizeTilingResponse(
        status="optimal" if result.status == "optimal" else "timeout",
        device=prepared.device,
        dtype=request.dtype,
        pipeline_model=model.name,
        memory_model=prepared.memory_model,  # type: ignore[arg-type]
        best=TilingPrediction.model_validate(with_uncertainty(1, result.best)),
        candidates=[
            RankedCandidate.model_validate(
                {"rank": rank, **with_uncertainty(rank, sim), "why": why}
            )
            for rank, (sim, why) in enumerate(
                zip(result.candidates, _reasons(solved), strict=True), 1
            )
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


def _reasons(solved: Solved) -> list[str]:
    """Each rank's ``why``, from the shortlist's mode and belief and each rank's prediction."""
    result, shortlist = solved.result, solved.shortlist
    ranked: tuple[Prediction, ...] = result.candidates
    entries = [
        Ranked(
            predicted_time_us=ns_to_us(sim.overall_time_ns),
            probability_best=solved.uncertainty[i][0] if solved.uncertainty else None,
        )
        for i, sim in enumerate(ranked)
    ]
    return reasons(
        entries,
        proven=result.status == "optimal",
        mode=None if shortlist is None else shortlist.mode,
        belief=None if shortlist is None else shortlist.belief,
        draws=0 if shortlist is None else shortlist.draws,
    )


def feedback(device_id: str) -> Feedback:
    """Where the measured times of this answer's tilings go back to (``device_id``: an id or
    a name)."""
    return Feedback(
        url=f"/devices/{device_id}/measurements",
        recalibrate_url=f"/devices/{device_id}/recalibrate",
    )
