"""POST /tuning-table: per-M kernel configurations in the files serving engines read."""

from __future__ import annotations

from fastapi import Response

from app.negotiation import (
    JSON_MEDIA_TYPE,
    PICTURE_RESPONSES,
    picture_requested,
    svg_response,
    vary_on_accept,
)
from app.routes.access import ReadCall, reading_router
from app.schemas.tuning_table import TuningTableRequest, TuningTableResponse
from app.table_jobs import tuning_table_via_pool

router = reading_router("optimize")


@router.post("/tuning-table", response_model=TuningTableResponse, responses=PICTURE_RESPONSES)
async def tuning_table(request: TuningTableRequest, call: ReadCall) -> Response:
    """A per-M table of Triton GEMM configurations for one (N, K) on a device, in vLLM's or
    SGLang's file format: each key's Z3-certified optimum (or the best choice of at most
    `max_distinct_configs`), its predicted time, interval and probability of being fastest,
    and a bound on what the engine's nearest-key lookup loses for any M between the keys.

    With `Accept: image/svg+xml`: predicted time over M of the table's entries, each M's
    optimum and the loss band.
    """
    if picture_requested(call.accept):
        svg = await tuning_table_via_pool(call.service, request, call.principal, svg=True)
        return svg_response(svg, False)
    body = await tuning_table_via_pool(call.service, request, call.principal)
    return vary_on_accept(Response(body, media_type=JSON_MEDIA_TYPE))
