"""POST /optimize-tiling: the GeMM-WS tiling with the smallest predicted time."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.convert.optimize import to_problem
from app.jobs import optimize_via_pool
from app.schemas.optimize import OptimizeTilingRequest, OptimizeTilingResponse
from app.service import ServiceDep

router = APIRouter(tags=["optimize"])


@router.post("/optimize-tiling", response_model=OptimizeTilingResponse)
async def optimize(request: OptimizeTilingRequest, service: ServiceDep) -> Response:
    """Proven-optimal GeMM-WS tiling and a ranked shortlist for a GEMM on a device."""
    # bad device or search space: answer 4xx without taking a worker
    service.check_search_space(to_problem(request)[1].space.size)
    # the solve itself (optimize_tiling + to_response) runs in a worker process, behind the
    # result cache and the bounded queue: app/jobs.py; the body is sent as encoded there
    answer = await optimize_via_pool(service, request)
    return answer.response()
