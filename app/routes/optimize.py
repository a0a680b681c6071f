"""POST /optimize-tiling: the GeMM-WS tiling with the smallest predicted time."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response

from app.convert.candidates import configurations_of, prepare
from app.jobs import (
    optimize_svg_via_pool,
    optimize_via_pool,
    request_profile,
)
from app.negotiation import PICTURE_RESPONSES, picture_requested, svg_response, vary_on_accept
from app.routes.access import ReadCall, reading_router
from app.schemas.optimize import MAX_TOP_K, OptimizeTilingRequest, OptimizeTilingResponse

router = reading_router("optimize")

CandidateRank = Annotated[
    int,
    Query(
        ge=1,
        le=MAX_TOP_K,
        description="SVG answer only: draw the timeline of this shortlist rank (1 = best; at "
        "most the number of candidates returned); ignored for JSON",
    ),
]


@router.post("/optimize-tiling", response_model=OptimizeTilingResponse, responses=PICTURE_RESPONSES)
async def optimize(
    request: OptimizeTilingRequest, call: ReadCall, candidate_rank: CandidateRank = 1
) -> Response:
    """Proven-optimal GeMM-WS tiling and a ranked shortlist for a GEMM on a device.

    With `Accept: image/svg+xml` the answer is the pipeline timeline of the candidate at
    `candidate_rank` (for any one tiling, give a search space of one value per dimension),
    drawn under the answer's pipeline model (async-copy: copies issued, in flight, arrived).
    """
    # bad device or search space: answer 4xx without taking a worker
    service = call.service
    profile = await request_profile(service, request, call.principal)
    prepared = prepare(request, profile)  # the pipeline model is chosen here, once
    service.check_search_space(configurations_of(prepared.problem))
    if picture_requested(call.accept):
        svg, hit = await optimize_svg_via_pool(service, request, profile, prepared, candidate_rank)
        return svg_response(svg, hit)
    # the solve itself (optimize_tiling + to_response) runs in a worker process, behind the
    # result cache and the bounded queue: app/jobs.py; the body is sent as encoded there
    answer = await optimize_via_pool(service, request, profile, prepared)
    return vary_on_accept(answer.response())
