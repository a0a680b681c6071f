"""POST /optimize-tiling/batch: several problems solved concurrently in the worker pool."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request, Response
from pydantic import TypeAdapter

from app.auth import Principal
from app.convert.candidates import configurations_of, prepare
from app.errors import HANDLERS
from app.jobs import optimize_model_via_pool, request_profile
from app.routes.access import ReaderDep, reading_router
from app.schemas.batch import (
    BatchItem,
    ItemProblem,
    OptimizeTilingBatchRequest,
    OptimizeTilingBatchResponse,
)
from app.schemas.optimize import OptimizeTilingRequest
from app.service import RequestFieldError, Service, ServiceDep, json_bytes_response

router = reading_router("optimize", prefix="/optimize-tiling")
_BATCH_JSON = TypeAdapter(OptimizeTilingBatchResponse)


async def _as_problem(request: Request, index: int, exc: Exception) -> ItemProblem:
    """The item's error exactly as the single-problem route would map it, fields prefixed."""
    handler = next((h for cls, h in HANDLERS.items() if isinstance(exc, cls)), None)
    if handler is None:
        raise exc  # a bug: let the middleware turn it into a 500
    response = await handler(request, exc)
    body = json.loads(bytes(response.body))
    for entry in body.get("errors", []):
        entry["field"] = f"problems.{index}.{entry['field']}"
        entry.pop("rejected", None)
    return ItemProblem.model_validate(body)


async def _solve_one(
    service: Service,
    request: Request,
    index: int,
    problem: OptimizeTilingRequest,
    slots: asyncio.Semaphore,
    principal: Principal,
) -> BatchItem:
    try:
        # fail fast on bad devices/search spaces, no worker needed
        profile = await request_profile(service, problem, principal)
        prepared = prepare(problem, profile)
        service.check_search_space(configurations_of(prepared.problem))
        async with slots:
            answer, hit = await optimize_model_via_pool(
                service, problem, profile, prepared, admitted=True
            )
    except Exception as exc:  # noqa: BLE001 - each item carries its own error
        return BatchItem(index=index, status="error", error=await _as_problem(request, index, exc))
    return BatchItem(index=index, status="ok", cache="hit" if hit else "miss", result=answer)


@router.post("/batch", response_model=OptimizeTilingBatchResponse)
async def optimize_batch(
    body: OptimizeTilingBatchRequest, request: Request, service: ServiceDep, principal: ReaderDep
) -> Response:
    """Solve up to max_batch_items problems concurrently; answers in request order."""
    limit = service.settings.max_batch_items
    if len(body.problems) > limit:
        raise RequestFieldError(
            "problems", f"at most {limit} problems per batch, got {len(body.problems)}; split it"
        )
    # the schema's maximum of an item's time_limit_s (app/openapi.py) refuses the whole batch,
    # as a schema-invalid item does, rather than giving that item an error
    for index, item in enumerate(body.problems):
        service.resolve_time_limit(item.time_limit_s, f"problems.{index}.time_limit_s")
    # one queue slot admits the whole batch; its items then share at most `workers` workers
    service.pool.admit()
    slots = asyncio.Semaphore(service.settings.workers)
    items = await asyncio.gather(
        *(_solve_one(service, request, i, p, slots, principal) for i, p in enumerate(body.problems))
    )
    answer = OptimizeTilingBatchResponse(items=list(items))
    # encoded off the event loop: 32 answers with timelines can be megabytes of JSON
    encoded = await asyncio.to_thread(_BATCH_JSON.dump_json, answer)
    return json_bytes_response(encoded, {})
