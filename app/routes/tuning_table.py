"""POST /tuning-table: per-M kernel configurations in the files serving engines read."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from app.negotiation import (
    JSON_MEDIA_TYPE,
    NOT_ACCEPTABLE_RESPONSE,
    SVG_RESPONSE,
    picture_requested,
    svg_response,
    vary_on_accept,
)
from app.routes.access import ReaderDep, read_access
from app.routes.json_body import OffLoopJSONRoute
from app.schemas.tuning_table import TuningTableRequest, TuningTableResponse
from app.service import ServiceDep
from app.table_jobs import tuning_table_via_pool

router = APIRouter(
    tags=["optimize"], route_class=OffLoopJSONRoute, dependencies=[Depends(read_access)]
)


@router.post(
    "/tuning-table",
    response_model=TuningTableResponse,
    responses={200: SVG_RESPONSE, 406: NOT_ACCEPTABLE_RESPONSE},
)
async def tuning_table(
    request: TuningTableRequest, service: ServiceDep, http_request: Request, principal: ReaderDep
) -> Response:
    """A per-M table of Triton GEMM configurations for one (N, K) on a device, in vLLM's or
    SGLang's file format: each key's Z3-certified optimum (or the best choice of at most
    `max_distinct_configs`), its predicted time, interval and probability of being fastest,
    and a bound on what the engine's nearest-key lookup loses for any M between the keys.

    With `Accept: image/svg+xml`: predicted time over M of the table's entries, each M's
    optimum and the loss band.
    """
    if picture_requested(http_request.headers.get("accept")):
        svg = await tuning_table_via_pool(service, request, principal, svg=True)
        return svg_response(svg, False)
    body = await tuning_table_via_pool(service, request, principal)
    return vary_on_accept(Response(body, media_type=JSON_MEDIA_TYPE))
