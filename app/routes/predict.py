"""POST /predict-kernel: Many-BSP prediction of a PTX kernel's execution cycles."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from app.convert.predict import to_core
from app.jobs import predict_svg_via_pool, predict_via_pool, request_profile
from app.negotiation import (
    NOT_ACCEPTABLE_RESPONSE,
    SVG_RESPONSE,
    picture_requested,
    svg_response,
    vary_on_accept,
)
from app.routes.access import ReaderDep, read_access
from app.routes.json_body import OffLoopJSONRoute
from app.schemas.predict import PredictKernelRequest, PredictKernelResponse
from app.service import ServiceDep

router = APIRouter(
    tags=["predict"], route_class=OffLoopJSONRoute, dependencies=[Depends(read_access)]
)


@router.post(
    "/predict-kernel",
    response_model=PredictKernelResponse,
    responses={200: SVG_RESPONSE, 406: NOT_ACCEPTABLE_RESPONSE},
)
async def predict(
    request: PredictKernelRequest, service: ServiceDep, http_request: Request, principal: ReaderDep
) -> Response:
    """Predict a PTX kernel's execution cycles with the Many-BSP model.

    With `Accept: image/svg+xml` the answer is a picture: the level-1 supersteps as stacked
    comp/comm/ovh bars and the eq. (24)/(25) terms of the kernel total (whatever `detail`).
    """
    # size limit and device checked here (413/422 without taking a worker); the analysis
    # itself (to_core -> predict_kernel -> to_response) runs in a worker: app/jobs.py
    profile = await request_profile(service, request, principal)
    to_core(request, service.settings.max_ptx_bytes, profile)
    if picture_requested(http_request.headers.get("accept")):
        svg, hit = await predict_svg_via_pool(service, request, profile)
        return svg_response(svg, hit)
    answer = await predict_via_pool(service, request, profile)
    return vary_on_accept(answer.response())
