"""Jobs run inside pool workers, and the async path a route takes to them.

Layering: routes call these jobs, jobs call the core (through ``app/convert``), never back.

A worker job receives the validated request as JSON, rebuilds the core problem, solves it and
returns the response as a JSON document: the pipe then carries a few kilobytes instead of every
candidate's per-stage events, and the parent stores exactly what it sends.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Response

from app.convert import optimize as optimize_convert
from app.convert import predict as predict_convert
from app.schemas.optimize import OptimizeTilingRequest, OptimizeTilingResponse
from app.schemas.predict import PredictKernelRequest, PredictKernelResponse
from app.service import Service, cached_solve, run_job
from device_profiles import get_profile
from perfmodel.manybsp import predict_kernel
from solver import optimize_tiling

OPTIMIZE_KIND = "optimize-tiling"
PREDICT_KIND = "predict-kernel"


def optimize_job(request_json: dict[str, Any], time_limit_s: float) -> dict[str, Any]:
    """Worker side of POST /optimize-tiling: solve within ``time_limit_s``, return the body."""
    request = OptimizeTilingRequest.model_validate(request_json)
    device, problem = optimize_convert.to_problem(request)
    result = optimize_tiling(problem, top_k=request.top_k, time_limit_s=time_limit_s)
    return optimize_convert.to_response(request, device, problem, result).model_dump(mode="json")


def canonical_optimize_request(request: OptimizeTilingRequest) -> dict[str, Any]:
    """The request with defaults filled, minus what does not change a complete answer.

    ``time_limit_s`` only decides whether the answer is complete; incomplete ("timeout")
    answers are never cached, so it stays out of the key.
    """
    return request.model_dump(mode="json", exclude={"time_limit_s"})


async def optimize_via_pool(
    service: Service,
    request: OptimizeTilingRequest,
    response: Response | None,
    *,
    admitted: bool = False,
) -> tuple[OptimizeTilingResponse, bool]:
    """Cache, then the worker pool; returns the answer and whether it was a cache hit."""
    time_limit_s = service.resolve_time_limit(
        request.time_limit_s if "time_limit_s" in request.model_fields_set else None
    )
    profile = get_profile(request.device) if request.device is not None else None
    request_json = request.model_dump(mode="json")

    async def compute() -> tuple[OptimizeTilingResponse, bool]:
        body = await run_job(
            service,
            OPTIMIZE_KIND,
            optimize_job,
            {"request_json": request_json},
            time_limit_s,
            admitted=admitted,
        )
        # validated off the event loop: a long timeline is megabytes of JSON
        answer = await asyncio.to_thread(OptimizeTilingResponse.model_validate, body)
        return answer, answer.status == "optimal"

    return await cached_solve(
        service,
        response,
        kind=OPTIMIZE_KIND,
        canonical_request=canonical_optimize_request(request),
        profile=profile,
        model=OptimizeTilingResponse,
        compute=compute,
    )


def predict_job(request_json: dict[str, Any], max_ptx_bytes: int) -> dict[str, Any]:
    """Worker side of POST /predict-kernel: PTX analysis + Many-BSP model, body as JSON."""
    request = PredictKernelRequest.model_validate(request_json)
    core = predict_convert.to_core(request, max_ptx_bytes)
    result = predict_kernel(core)
    clock = core.clock_mhz if core.clock_mhz is not None else core.device.clock_mhz
    return predict_convert.to_response(result, clock).model_dump(mode="json")


async def predict_via_pool(
    service: Service, request: PredictKernelRequest, response: Response | None
) -> PredictKernelResponse:
    """Cache, then a worker (the PTX analysis is CPU-bound and input-sized)."""
    profile = get_profile(request.device) if request.device is not None else None
    request_json = request.model_dump(mode="json")

    async def compute() -> tuple[PredictKernelResponse, bool]:
        body = await run_job(
            service,
            PREDICT_KIND,
            predict_job,
            {"request_json": request_json, "max_ptx_bytes": service.settings.max_ptx_bytes},
            service.settings.default_time_limit_s,
            pass_time_limit=False,
        )
        # the prediction is a pure function of the request and the profile: always cacheable
        answer = await asyncio.to_thread(PredictKernelResponse.model_validate, body)
        return answer, True

    answer, _ = await cached_solve(
        service,
        response,
        kind=PREDICT_KIND,
        canonical_request=request_json,
        profile=profile,
        model=PredictKernelResponse,
        compute=compute,
    )
    return answer
