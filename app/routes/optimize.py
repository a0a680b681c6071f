"""POST /optimize-tiling: the GeMM-WS tiling with the smallest predicted time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from app.convert.candidates import configurations_of, prepare
from app.jobs import (
    optimize_svg_via_pool,
    optimize_via_pool,
    request_profile,
)
from app.negotiation import (
    NOT_ACCEPTABLE_RESPONSE,
    SVG_RESPONSE,
    picture_requested,
    svg_response,
    vary_on_accept,
)
from app.routes.access import ReaderDep, read_access
from app.routes.json_body import OffLoopJSONRoute
from app.schemas.optimize import MAX_TOP_K, OptimizeTilingRequest, OptimizeTilingResponse
from app.service import ServiceDep

router = APIRouter(
    tags=["optimize"], route_class=OffLoopJSONRoute, dependencies=[Depends(read_access)]
)

CandidateRank = Annotated[
    int,
    Query(
        ge=1,
        le=MAX_TOP_K,
        description="SVG answer only: draw the timeline of this shortlist rank (1 = best; at "
        "most the number of candidates returned); ignored for JSON",
    ),
]


@router.post(
    "/optimize-tiling",
    response_model=OptimizeTilingResponse,
    responses={200: SVG_RESPONSE, 406: NOT_ACCEPTABLE_RESPONSE},
)
async def optimize(
    request: OptimizeTilingRequest,
    service: ServiceDep,
    http_request: Request,
    principal: ReaderDep,
    candidate_rank: CandidateRank = 1,
) -> Response:
    """Proven-optimal GeMM-WS tiling and a ranked shortlist for a GEMM on a device.

    With `Accept: image/svg+xml` the answer is the pipeline timeline of the candidate at
    `candidate_rank` (for any one tiling, give a search space of one value per dimension),
    drawn under the answer's pipeline model (async-copy: copies issued, in flight, arrived).
    """
    # bad device or search space: answer 4xx without taking a worker
    profile = await request_profile(service, request, principal)
    prepared = prepare(request, profile)  # the pipeline model is chosen here, once
    service.check_search_space(configurations_of(prepared.problem))
    if picture_requested(http_request.headers.get("accept")):
        svg, hit = await optimize_svg_via_pool(service, request, profile, prepared, candidate_rank)
        return svg_response(svg, hit)
    # the solve itself (optimize_tiling + to_response) runs in a worker process, behind the
    # result cache and the bounded queue: app/jobs.py; the body is sent as encoded there
    answer = await optimize_via_pool(service, request, profile, prepared)
    return vary_on_accept(answer.response())
