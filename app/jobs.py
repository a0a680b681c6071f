"""Jobs run inside pool workers, and the async path a route takes to them.

Layering: routes call these jobs, jobs call the core (through ``app/convert``), never back.

A worker job receives the validated request as JSON, rebuilds the core problem, solves it and
returns the response already encoded (:class:`EncodedAnswer`): the response model is built and
validated in the worker, the pipe carries one bytes object, and the parent stores and sends
those bytes as they are, with no validation or serialisation on its event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import TypeAdapter

from app.convert import optimize as optimize_convert
from app.convert import predict as predict_convert
from app.schemas.optimize import OptimizeTilingRequest, OptimizeTilingResponse
from app.schemas.predict import PredictKernelRequest
from app.service import CachedAnswer, EncodedAnswer, Service, cached_solve, run_job
from device_profiles import get_profile
from perfmodel.manybsp import predict_kernel
from solver import optimize_tiling

OPTIMIZE_KIND = "optimize-tiling"
PREDICT_KIND = "predict-kernel"


_OPTIMIZE_JSON = TypeAdapter(OptimizeTilingResponse)


def optimize_job(request_json: dict[str, Any], time_limit_s: float) -> EncodedAnswer:
    """Worker side of POST /optimize-tiling: solve within ``time_limit_s``, return the body."""
    request = OptimizeTilingRequest.model_validate(request_json)
    device, problem = optimize_convert.to_problem(request)
    result = optimize_tiling(problem, top_k=request.top_k, time_limit_s=time_limit_s)
    answer = optimize_convert.to_response(request, device, problem, result)
    return EncodedAnswer(_OPTIMIZE_JSON.dump_json(answer), cacheable=answer.status == "optimal")


def canonical_optimize_request(request: OptimizeTilingRequest) -> dict[str, Any]:
    """The request with defaults filled, minus what does not change a complete answer.

    ``time_limit_s`` only decides whether the answer is complete; incomplete ("timeout")
    answers are never cached, so it stays out of the key.
    """
    return request.model_dump(mode="json", exclude={"time_limit_s"})


async def optimize_via_pool(
    service: Service,
    request: OptimizeTilingRequest,
    *,
    admitted: bool = False,
) -> CachedAnswer:
    """Cache, then the worker pool; the answer's body and whether it was a cache hit."""
    time_limit_s = service.resolve_time_limit(
        request.time_limit_s if "time_limit_s" in request.model_fields_set else None
    )
    profile = get_profile(request.device) if request.device is not None else None
    request_json = request.model_dump(mode="json")

    async def compute() -> EncodedAnswer:
        answer: EncodedAnswer = await run_job(
            service,
            OPTIMIZE_KIND,
            optimize_job,
            {"request_json": request_json},
            time_limit_s,
            admitted=admitted,
        )
        return answer

    return await cached_solve(
        service,
        kind=OPTIMIZE_KIND,
        canonical_request=canonical_optimize_request(request),
        profile=profile,
        compute=compute,
    )


async def optimize_model_via_pool(
    service: Service, request: OptimizeTilingRequest, *, admitted: bool = False
) -> tuple[OptimizeTilingResponse, bool]:
    """:func:`optimize_via_pool` as a response model (decoded off the event loop)."""
    answer = await optimize_via_pool(service, request, admitted=admitted)
    model = await asyncio.to_thread(OptimizeTilingResponse.model_validate_json, answer.body)
    return model, answer.hit


def predict_job(
    request_json: dict[str, Any], max_ptx_bytes: int, summary_above_bytes: int
) -> EncodedAnswer:
    """Worker side of POST /predict-kernel: PTX analysis + Many-BSP model, the body encoded
    with the lists the request asked for (``detail``, ``list_offset``, ``list_limit``)."""
    request = PredictKernelRequest.model_validate(request_json)
    core = predict_convert.to_core(request, max_ptx_bytes)
    result = predict_kernel(core)
    clock = core.clock_mhz if core.clock_mhz is not None else core.device.clock_mhz
    full = predict_convert.to_response(result, clock)
    # the prediction is a pure function of the request and the profile: always cacheable
    return EncodedAnswer(
        predict_convert.encode_view(full, request, summary_above_bytes), cacheable=True
    )


def canonical_predict_request(
    request_json: dict[str, Any], summary_above_bytes: int
) -> dict[str, Any]:
    """The request, plus the server's size limit when that limit decides the lists (auto)."""
    if request_json.get("detail") != "auto":
        return request_json
    return {**request_json, "summary_above_bytes": summary_above_bytes}


async def predict_via_pool(service: Service, request: PredictKernelRequest) -> CachedAnswer:
    """Cache, then a worker (the PTX analysis is CPU-bound and input-sized)."""
    profile = get_profile(request.device) if request.device is not None else None
    request_json = request.model_dump(mode="json")
    summary_above_bytes = service.settings.predict_summary_above_bytes

    async def compute() -> EncodedAnswer:
        answer: EncodedAnswer = await run_job(
            service,
            PREDICT_KIND,
            predict_job,
            {
                "request_json": request_json,
                "max_ptx_bytes": service.settings.max_ptx_bytes,
                "summary_above_bytes": summary_above_bytes,
            },
            service.settings.default_time_limit_s,
            pass_time_limit=False,
        )
        return answer

    return await cached_solve(
        service,
        kind=PREDICT_KIND,
        canonical_request=canonical_predict_request(request_json, summary_above_bytes),
        profile=profile,
        compute=compute,
    )
