"""Jobs run inside pool workers, and the async path a route takes to them.

Layering: routes call these jobs, jobs call the core (through ``app/convert``), never back.

A worker job receives the validated request as JSON, rebuilds the core problem, solves it and
returns the response already encoded (:class:`EncodedAnswer`): the response model is built and
validated in the worker, the pipe carries one bytes object, and the parent stores and sends
those bytes as they are, with no validation or serialisation on its event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from types import ModuleType
from typing import Any

from pydantic import TypeAdapter

from app.auth import Principal
from app.convert import candidates as candidates_convert
from app.convert import optimize as optimize_convert
from app.convert import predict as predict_convert
from app.convert.candidates import configurations_of
from app.convert.optimize import PreparedRequest
from app.inline import inline_eligible
from app.schemas.calibrate import CalibrationFit
from app.schemas.optimize import (
    DEFAULT_TOP_K,
    OptimizeTilingRequest,
    OptimizeTilingResponse,
    SearchSpaceSpec,
)
from app.schemas.predict import PredictKernelRequest
from app.service import (
    CachedAnswer,
    EncodedAnswer,
    Job,
    RequestedItemMissing,
    RequestFieldError,
    Service,
    cached_solve,
    run_job,
)
from device_profiles import DeviceProfile
from device_profiles.provenance import provenance
from perfmodel.gemm_ws import Tiling
from perfmodel.manybsp import predict_kernel
from solver.problem import CandidateProblem

OPTIMIZE_KIND = "optimize-tiling"
PREDICT_KIND = "predict-kernel"
RENDER_KIND = "render-svg"
CALIBRATE_KIND = "calibrate"
CHECK_RUNS_KIND = "check-measurements"
#: worker time for one picture: the first one in a worker imports matplotlib (~0.5-1.5 s);
#: the timeline of the longest pipeline (2^20 stages, tile_k = 1) simulates in 3-10 s on a
#: loaded 2-core machine. Not the request's time_limit_s, which budgets the solve.
RENDER_TIME_LIMIT_S = 30.0


_OPTIMIZE_JSON = TypeAdapter(OptimizeTilingResponse)


def _profile(profile_json: dict[str, Any] | None) -> DeviceProfile | None:
    return None if profile_json is None else DeviceProfile.model_validate(profile_json)


def _profile_json(profile: DeviceProfile | None) -> dict[str, Any] | None:
    return None if profile is None else profile.model_dump(mode="json")


async def request_profile(
    service: Service, request: OptimizeTilingRequest | PredictKernelRequest, viewer: Principal
) -> DeviceProfile | None:
    """The profile ``request.device`` names (shipped id, calibrated id or name); None for
    inline device_params (with both given, the conversion refuses the request). Resolved
    once per request, in the parent: jobs get the profile itself, workers never look up."""
    if request.device is None or request.device_params is not None:
        return None
    return await service.resolve_profile(request.device, viewer)


def optimize_job(
    request_json: dict[str, Any],
    profile_json: dict[str, Any] | None,
    prepared: PreparedRequest,
    time_limit_s: float,
) -> EncodedAnswer:
    """Worker side of POST /optimize-tiling: solve within ``time_limit_s``, return the body.
    ``profile_json`` is the profile ``device`` resolved to in the parent (None: inline),
    ``prepared`` the request resolved there (its problem under its pipeline model)."""
    request = OptimizeTilingRequest.model_validate(request_json)
    profile = _profile(profile_json)
    problem = prepared.problem
    from app.convert import explore  # numpy: worker side only

    origin = provenance(profile, "gemm-ws")
    if isinstance(problem, CandidateProblem):
        solved, ranking = explore.solve_candidates(request, profile, problem, time_limit_s)
        answer = candidates_convert.to_candidates_response(
            request, prepared, solved, ranking, origin
        )
    else:
        solved = explore.solve(request, profile, problem, time_limit_s)
        answer = optimize_convert.to_response(request, prepared, solved, origin)
    return EncodedAnswer(
        _OPTIMIZE_JSON.dump_json(answer),
        cacheable=answer.status == "optimal",
        certificate_mismatches=solved.result.statistics.certificate_mismatches,
    )


#: the solve itself, for the warm-up: a test may swap ``optimize_job`` for a failing one
_solve = optimize_job


def warm_up_job(request_json: dict[str, Any]) -> None:
    """Solve ``request_json`` (a shipped device) once, to load what a solve loads."""
    request = OptimizeTilingRequest.model_validate(request_json)
    _solve(request_json, None, candidates_convert.prepare(request), 5.0)


def canonical_optimize_request(
    request: OptimizeTilingRequest, prepared: PreparedRequest
) -> dict[str, Any]:
    """The request with defaults filled, minus what does not change a complete answer.

    ``pipeline_model`` is the effective one (null resolves to the device's default, which may
    differ between profiles and between a profile's calibrations), so a request naming the
    default model and one leaving it null share an answer.

    ``time_limit_s`` only decides whether the answer is complete; incomplete ("timeout")
    answers are never cached, so it stays out of the key.
    A search space's request keeps its former key: ``top_k`` and ``search_space`` left null
    are their defaults spelled out, and no ``candidates``. A candidate list's key holds every
    entry, ``params`` included (they are echoed).
    """
    canonical = request.model_dump(mode="json", exclude={"time_limit_s"})
    canonical["pipeline_model"] = prepared.model.name
    canonical["memory_model"] = prepared.memory_model
    if request.candidates is None:
        del canonical["candidates"]
        canonical["top_k"] = request.top_k or DEFAULT_TOP_K
        space = request.search_space or SearchSpaceSpec()
        canonical["search_space"] = space.model_dump(mode="json")
    return canonical


async def optimize_via_pool(
    service: Service,
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    prepared: PreparedRequest,
    *,
    admitted: bool = False,
) -> CachedAnswer:
    """Cache, then the worker pool; the answer's body and whether it was a cache hit.
    ``profile``: what ``request.device`` resolved to (:func:`request_profile`); its content
    digest is part of the cache key, so a recalibrated profile never gets an old answer.
    ``prepared``: the request resolved once (:func:`app.convert.candidates.prepare`)."""
    time_limit_s = service.resolve_time_limit(
        request.time_limit_s if "time_limit_s" in request.model_fields_set else None
    )
    request_json = request.model_dump(mode="json")

    async def compute() -> EncodedAnswer:
        kwargs = {
            "request_json": request_json,
            "profile_json": _profile_json(profile),
            "prepared": prepared,
        }
        job = Job(OPTIMIZE_KIND, optimize_job, kwargs, time_limit_s)
        if (
            service.inline is not None
            and service.pool.running  # stopping or not started: the pool's 503 for all
            and inline_eligible(
                request,
                configurations_of(prepared.problem),
                service.settings.inline_max_configurations,
            )
        ):
            # small and bounded: the service's own thread, no pool round trip (app/inline.py)
            inline = await service.inline.run(service, job, admitted=admitted)
            if inline is not None:
                return inline
        answer: EncodedAnswer = await run_job(service, job, admitted=admitted)
        return answer

    return await cached_solve(
        service,
        kind=OPTIMIZE_KIND,
        canonical_request=canonical_optimize_request(request, prepared),
        profile=profile,
        compute=compute,
        wait_limit_s=time_limit_s,
    )


async def optimize_model_via_pool(
    service: Service,
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    prepared: PreparedRequest,
    *,
    admitted: bool = False,
) -> tuple[OptimizeTilingResponse, bool]:
    """:func:`optimize_via_pool` as a response model (decoded off the event loop)."""
    answer = await optimize_via_pool(service, request, profile, prepared, admitted=admitted)
    # bytes(): a body read from the store may be a view, which pydantic does not take
    body = answer.body
    model = await asyncio.to_thread(lambda: OptimizeTilingResponse.model_validate_json(bytes(body)))
    return model, answer.hit


def predict_job(
    request_json: dict[str, Any],
    profile_json: dict[str, Any] | None,
    max_ptx_bytes: int,
    summary_above_bytes: int,
) -> EncodedAnswer:
    """Worker side of POST /predict-kernel: PTX analysis + Many-BSP model, the body encoded
    with the lists the request asked for (``detail``, ``list_offset``, ``list_limit``);
    ``profile_json`` as for :func:`optimize_job`."""
    request = PredictKernelRequest.model_validate(request_json)
    core = predict_convert.to_core(request, max_ptx_bytes, _profile(profile_json))
    result = predict_kernel(core)
    clock = core.clock_mhz if core.clock_mhz is not None else core.device.clock_mhz
    from app.convert import beliefs  # numpy: worker side only
    from perfmodel.calibration.many_bsp import predict_interval_cycles

    profile = _profile(profile_json)
    values = {n: float(getattr(core.device.device, n)) for n in beliefs.MANY_BSP_BELIEF_FIGURES}
    _, belief = beliefs.many_bsp_belief(profile, values)
    interval = predict_interval_cycles(core.device, result, belief)
    # the lists' models are built for the page the request asks, not all of them
    full = predict_convert.to_response(
        result,
        clock,
        interval,
        provenance(profile if request.device else None, "many-bsp"),
        lists=False,
    )
    # the prediction is a pure function of the request and the profile: always cacheable
    return EncodedAnswer(
        predict_convert.encode_view(full, request, summary_above_bytes, result), cacheable=True
    )


def canonical_predict_request(
    request_json: dict[str, Any], summary_above_bytes: int
) -> dict[str, Any]:
    """The request, plus the server's size limit when that limit decides the lists (auto)."""
    if request_json.get("detail") != "auto":
        return request_json
    return {**request_json, "summary_above_bytes": summary_above_bytes}


async def predict_via_pool(
    service: Service, request: PredictKernelRequest, profile: DeviceProfile | None
) -> CachedAnswer:
    """Cache, then a worker (the PTX analysis is CPU-bound and input-sized); ``profile`` as
    for :func:`optimize_via_pool`."""
    request_json = request.model_dump(mode="json")
    summary_above_bytes = service.settings.predict_summary_above_bytes

    async def compute() -> EncodedAnswer:
        kwargs = {
            "request_json": request_json,
            "profile_json": _profile_json(profile),
            "max_ptx_bytes": service.settings.max_ptx_bytes,
            "summary_above_bytes": summary_above_bytes,
        }
        job = Job(PREDICT_KIND, predict_job, kwargs, service.settings.default_time_limit_s)
        answer: EncodedAnswer = await run_job(service, job, pass_time_limit=False)
        return answer

    return await cached_solve(
        service,
        kind=PREDICT_KIND,
        canonical_request=canonical_predict_request(request_json, summary_above_bytes),
        profile=profile,
        compute=compute,
        wait_limit_s=service.settings.default_time_limit_s,
    )


# ---------------------------------------------------------------------------- pictures


def _render() -> ModuleType:
    """The render package, imported in the worker on the first picture (matplotlib is slow
    to import; the service's own process never imports it)."""
    if "numpy" not in sys.modules:
        # numpy's OpenBLAS reserves address space per core it sees; pictures need no BLAS,
        # and the worker's RLIMIT_AS cap must not be spent on it on a many-core host
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import render

    return render


async def _render_job(
    service: Service, fn: Any, kwargs: dict[str, Any], *, answer_was_computed: bool
) -> bytes:
    svg: bytes = await run_job(
        service,
        Job(RENDER_KIND, fn, kwargs, RENDER_TIME_LIMIT_S),
        pass_time_limit=False,
        # a request that was solved was admitted to the queue once already (as a batch is)
        admitted=answer_was_computed,
    )
    return svg


def timeline_svg_job(
    request_json: dict[str, Any],
    prepared: PreparedRequest,
    candidate: dict[str, Any],
    rank: int,
) -> bytes:
    """Worker side of the SVG answer of POST /optimize-tiling: simulate the ranked candidate
    under the answer's pipeline model (the answer keeps no per-stage events) and draw its
    timeline."""
    request = OptimizeTilingRequest.model_validate(request_json)
    problem, model = prepared.problem, prepared.model
    tiling = Tiling(
        candidate["tile_m"], candidate["tile_n"], candidate["tile_k"], candidate["buffer_depth"]
    )
    sim = model.simulate(problem.shape, tiling, problem.machine, problem.element_bytes)
    from render.pipeline import pipeline_timeline_svg  # the worker's first picture loads render

    return pipeline_timeline_svg(
        sim, problem.machine, device=prepared.device, dtype=request.dtype, rank=rank
    )


async def optimize_svg_via_pool(
    service: Service,
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    prepared: PreparedRequest,
    candidate_rank: int,
) -> tuple[bytes, bool]:
    """The answer (cache, else a solve), then the timeline of its ranked candidate; returns
    the SVG and whether the answer drawn came from the cache."""
    answer, hit = await optimize_model_via_pool(service, request, profile, prepared)
    # by rank, not position: a candidate list's group shares one rank over several entries
    ranked = next((c for c in answer.candidates if c.rank == candidate_rank), None)
    if ranked is None:
        ranks = answer.candidates[-1].rank
        raise RequestedItemMissing(
            "candidate_rank",
            f"the shortlist has {ranks} ranks; ask for 1..{ranks} (or raise top_k)",
        )
    kwargs = {
        "request_json": request.model_dump(mode="json"),
        "prepared": prepared,
        "candidate": ranked.model_dump(mode="json"),
        "rank": candidate_rank,
    }
    return await _render_job(service, timeline_svg_job, kwargs, answer_was_computed=not hit), hit


def breakdown_svg_job(
    request_json: dict[str, Any], profile_json: dict[str, Any] | None, answer: dict[str, Any]
) -> bytes:
    """Worker side of the SVG answer of POST /predict-kernel: draw the answer's breakdown."""
    request = PredictKernelRequest.model_validate(request_json)
    figures = predict_convert.resolve_device(request, _profile(profile_json))
    terms = predict_convert.terms_of(answer, figures)
    svg: bytes = _render().breakdown_svg(answer, terms)
    return svg


def _breakdown_fields(body: bytes) -> dict[str, Any]:
    document = json.loads(body)
    return {k: v for k, v in document.items() if k in predict_convert.BREAKDOWN_FIELDS}


async def predict_svg_via_pool(
    service: Service, request: PredictKernelRequest, profile: DeviceProfile | None
) -> tuple[bytes, bool]:
    """The full answer (cache, else the analysis), then its superstep breakdown; returns the
    SVG and whether the answer drawn came from the cache. The picture shows every level-1
    superstep, so it draws the full answer whatever ``detail`` and paging the request gave."""
    full = request.model_copy(update={"detail": "full", "list_offset": 0, "list_limit": None})
    answer = await predict_via_pool(service, full, profile)
    # parsed off the event loop: a full answer lists every instruction
    body = answer.body
    fields = await asyncio.to_thread(lambda: _breakdown_fields(bytes(body)))
    kwargs = {
        "request_json": full.model_dump(mode="json"),
        "profile_json": _profile_json(profile),
        "answer": fields,
    }
    svg = await _render_job(service, breakdown_svg_job, kwargs, answer_was_computed=not answer.hit)
    return svg, answer.hit


def calibration_svg_job(
    measured: list[float], predicted: list[float], labels: list[str] | None, **options: str
) -> bytes:
    """Worker side of a calibration-fit picture (render.calibration_svg, ``options`` its
    keyword options: ``unit``, ``title``)."""
    try:
        svg: bytes = _render().calibration_svg(measured, predicted, labels, **options)
    except ValueError as exc:
        # render names the argument first: "predicted: 3 values for 4 measurements"
        field, _, reason = str(exc).partition(": ")
        raise RequestFieldError(field, reason) from None
    return svg


async def calibration_svg_via_pool(
    service: Service,
    measured: list[float],
    predicted: list[float],
    labels: list[str] | None = None,
    **options: str,
) -> bytes:
    """Draw measured vs predicted (+ residuals) in a worker; bad input is a 422 naming it.
    ``options``: render.calibration_svg's (``unit``, ``title``), its defaults where left out.

    For the SVG answer of POST /calibrate: ``svg_response(await calibration_svg_via_pool(
    service, measured, predicted, labels), hit=False)``.
    """
    kwargs = {
        "measured": list(measured),
        "predicted": list(predicted),
        "labels": list(labels) if labels is not None else None,
        **options,
    }
    return await _render_job(service, calibration_svg_job, kwargs, answer_was_computed=False)


# ---------------------------------------------------------------------------- calibration
# perfmodel.calibration (numpy, scipy) is imported by these jobs in the worker, on the first
# calibration: the service's own process never loads it (app/convert/calibration_core.py)


def calibrate_job(
    model: str,
    base_json: dict[str, Any],
    measurements_json: list[dict[str, Any]],
    fit: list[str] | None,
    folds: int,
    pipeline_model: str | None = None,
    warm_json: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Worker side of POST /calibrate and /recalibrate: fit ``model``'s figures of the base
    profile (with a value for every figure, see fit_ready) to the runs, in canonical order,
    under ``pipeline_model`` (GeMM-WS), from ``warm_json``'s figures when given (the profile a
    recalibration refits). The answer is small and never cached: a plain dict, validated by
    the parent."""
    from app.convert import calibration_core

    base = DeviceProfile.model_validate(base_json)
    warm = None if warm_json is None else DeviceProfile.model_validate(warm_json)
    answer = calibration_core.fit(
        model, base, measurements_json, fit, folds, pipeline_model, warm_from=warm
    )
    return answer.model_dump(mode="json")


def check_runs_job(model: str, base_json: dict[str, Any], measurements_json: list[Any]) -> None:
    """Worker side of appending runs: check each against the device, so that a run no fit
    could use is refused now (its error names it) rather than at recalibration."""
    from app.convert import calibration_core

    calibration_core.check_runs(model, DeviceProfile.model_validate(base_json), measurements_json)


async def calibrate_via_pool(
    service: Service,
    *,
    model: str,
    base: DeviceProfile,
    documents: list[dict[str, Any]],
    fit: list[str] | None,
    folds: int,
    time_limit_s: float,
    pipeline_model: str | None = None,
    warm_from: DeviceProfile | None = None,
) -> CalibrationFit:
    """The fit, in a worker (CPU-bound: least squares over every run, then k more fits)."""
    kwargs = {
        "model": model,
        "base_json": base.model_dump(mode="json"),
        "measurements_json": documents,
        "fit": fit,
        "folds": folds,
        "pipeline_model": pipeline_model,
        "warm_json": None if warm_from is None else warm_from.model_dump(mode="json"),
    }
    job = Job(CALIBRATE_KIND, calibrate_job, kwargs, time_limit_s)
    body = await run_job(service, job, pass_time_limit=False)
    return await asyncio.to_thread(CalibrationFit.model_validate, body)


async def check_runs_via_pool(
    service: Service, model: str, base: DeviceProfile, documents: list[dict[str, Any]]
) -> None:
    base_json = base.model_dump(mode="json")
    kwargs = {"model": model, "base_json": base_json, "measurements_json": documents}
    job = Job(CHECK_RUNS_KIND, check_runs_job, kwargs, service.settings.default_time_limit_s)
    await run_job(service, job, pass_time_limit=False)
