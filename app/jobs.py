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

from app.convert import calibrate as calibrate_convert
from app.convert import optimize as optimize_convert
from app.convert import predict as predict_convert
from app.schemas.calibrate import CalibrationFit
from app.schemas.optimize import OptimizeTilingRequest, OptimizeTilingResponse
from app.schemas.predict import PredictKernelRequest, PredictKernelResponse
from app.service import Service, cached_solve, run_job
from device_profiles import DeviceProfile
from perfmodel.calibration import fit_gemm_ws, fit_many_bsp, predict_many_bsp_cycles
from perfmodel.errors import ModelInputError
from perfmodel.manybsp import predict_kernel
from solver import optimize_tiling

OPTIMIZE_KIND = "optimize-tiling"
PREDICT_KIND = "predict-kernel"
CALIBRATE_KIND = "calibrate"
CHECK_RUNS_KIND = "check-measurements"


def _profile(profile_json: dict[str, Any] | None) -> DeviceProfile | None:
    return None if profile_json is None else DeviceProfile.model_validate(profile_json)


def optimize_job(
    request_json: dict[str, Any], profile_json: dict[str, Any] | None, time_limit_s: float
) -> dict[str, Any]:
    """Worker side of POST /optimize-tiling: solve within ``time_limit_s``, return the body.
    ``profile_json`` is the profile ``device`` resolved to in the parent (None: inline)."""
    request = OptimizeTilingRequest.model_validate(request_json)
    device, problem = optimize_convert.to_problem(request, _profile(profile_json))
    result = optimize_tiling(problem, top_k=request.top_k, time_limit_s=time_limit_s)
    return optimize_convert.to_response(request, device, problem, result).model_dump(mode="json")


def canonical_optimize_request(request: OptimizeTilingRequest) -> dict[str, Any]:
    """The request with defaults filled, minus what does not change a complete answer.

    ``time_limit_s`` only decides whether the answer is complete; incomplete ("timeout")
    answers are never cached, so it stays out of the key.
    """
    return request.model_dump(mode="json", exclude={"time_limit_s"})


async def request_profile(
    service: Service, request: OptimizeTilingRequest | PredictKernelRequest
) -> DeviceProfile | None:
    """The profile ``request.device`` names; None for inline device_params (with both given,
    the conversion refuses the request)."""
    if request.device is None or request.device_params is not None:
        return None
    return await service.resolve_profile(request.device)


async def optimize_via_pool(
    service: Service,
    request: OptimizeTilingRequest,
    profile: DeviceProfile | None,
    response: Response | None,
    *,
    admitted: bool = False,
) -> tuple[OptimizeTilingResponse, bool]:
    """Cache, then the worker pool; returns the answer and whether it was a cache hit.
    ``profile``: what ``request.device`` resolved to (:func:`request_profile`)."""
    time_limit_s = service.resolve_time_limit(
        request.time_limit_s if "time_limit_s" in request.model_fields_set else None
    )
    request_json = request.model_dump(mode="json")
    profile_json = None if profile is None else profile.model_dump(mode="json")

    async def compute() -> tuple[OptimizeTilingResponse, bool]:
        body = await run_job(
            service,
            OPTIMIZE_KIND,
            optimize_job,
            {"request_json": request_json, "profile_json": profile_json},
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


def predict_job(
    request_json: dict[str, Any], profile_json: dict[str, Any] | None, max_ptx_bytes: int
) -> dict[str, Any]:
    """Worker side of POST /predict-kernel: PTX analysis + Many-BSP model, body as JSON."""
    request = PredictKernelRequest.model_validate(request_json)
    core = predict_convert.to_core(request, max_ptx_bytes, _profile(profile_json))
    result = predict_kernel(core)
    clock = core.clock_mhz if core.clock_mhz is not None else core.device.clock_mhz
    return predict_convert.to_response(result, clock).model_dump(mode="json")


async def predict_via_pool(
    service: Service,
    request: PredictKernelRequest,
    profile: DeviceProfile | None,
    response: Response | None,
) -> PredictKernelResponse:
    """Cache, then a worker (the PTX analysis is CPU-bound and input-sized)."""
    request_json = request.model_dump(mode="json")
    profile_json = None if profile is None else profile.model_dump(mode="json")

    async def compute() -> tuple[PredictKernelResponse, bool]:
        body = await run_job(
            service,
            PREDICT_KIND,
            predict_job,
            {
                "request_json": request_json,
                "profile_json": profile_json,
                "max_ptx_bytes": service.settings.max_ptx_bytes,
            },
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


def calibrate_job(
    model: str,
    base_json: dict[str, Any],
    measurements_json: list[dict[str, Any]],
    fit: list[str] | None,
    folds: int,
) -> dict[str, Any]:
    """Worker side of POST /calibrate and /recalibrate: fit ``model``'s figures of the base
    profile (with a value for every figure, see fit_ready) to the runs, in canonical order."""
    base = DeviceProfile.model_validate(base_json)
    if model == "gemm-ws":
        machine, gemm_runs = calibrate_convert.gemm_ws_core(base, measurements_json)
        result = fit_gemm_ws(machine, gemm_runs, fit=fit, folds=folds)
    else:
        device, kernel_runs = calibrate_convert.many_bsp_core(base, measurements_json)
        result = fit_many_bsp(device, kernel_runs, fit=fit, folds=folds)
    return calibrate_convert.to_fit(result).model_dump(mode="json")


def check_many_bsp_runs_job(base_json: dict[str, Any], measurements_json: list[Any]) -> None:
    """Worker side of appending Many-BSP runs: analyse each on the device, so that a run no
    fit could use is refused now (its error names it) rather than at recalibration."""
    base = DeviceProfile.model_validate(base_json)
    device, runs = calibrate_convert.many_bsp_core(base, measurements_json)
    for i, run in enumerate(runs):
        try:
            predict_many_bsp_cycles(device, run.request)
        except ModelInputError as exc:
            raise ModelInputError(f"measurements.{i}.{exc.field}", exc.reason) from None


async def calibrate_via_pool(
    service: Service,
    *,
    model: str,
    base: DeviceProfile,
    documents: list[dict[str, Any]],
    fit: list[str] | None,
    folds: int,
    time_limit_s: float,
) -> CalibrationFit:
    """The fit, in a worker (CPU-bound: least squares over every run, then k more fits)."""
    body = await run_job(
        service,
        CALIBRATE_KIND,
        calibrate_job,
        {
            "model": model,
            "base_json": base.model_dump(mode="json"),
            "measurements_json": documents,
            "fit": fit,
            "folds": folds,
        },
        time_limit_s,
        pass_time_limit=False,
    )
    return CalibrationFit.model_validate(body)


async def check_many_bsp_runs_via_pool(
    service: Service, base: DeviceProfile, documents: list[dict[str, Any]]
) -> None:
    await run_job(
        service,
        CHECK_RUNS_KIND,
        check_many_bsp_runs_job,
        {"base_json": base.model_dump(mode="json"), "measurements_json": documents},
        service.settings.default_time_limit_s,
        pass_time_limit=False,
    )
