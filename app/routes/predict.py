"""POST /predict-kernel: Many-BSP prediction of a PTX kernel's execution cycles."""

from __future__ import annotations

from fastapi import Response

from app.convert.predict import to_core
from app.jobs import predict_svg_via_pool, predict_via_pool, request_profile
from app.negotiation import PICTURE_RESPONSES, picture_requested, svg_response, vary_on_accept
from app.routes.access import ReadCall, reading_router
from app.schemas.predict import PredictKernelRequest, PredictKernelResponse

router = reading_router("predict")


@router.post("/predict-kernel", response_model=PredictKernelResponse, responses=PICTURE_RESPONSES)
async def predict(request: PredictKernelRequest, call: ReadCall) -> Response:
    """Predict a PTX kernel's execution cycles with the Many-BSP model.

    With `Accept: image/svg+xml` the answer is a picture: the level-1 supersteps as stacked
    comp/comm/ovh bars and the eq. (24)/(25) terms of the kernel total (whatever `detail`).
    """
    # size limit and device checked here (413/422 without taking a worker); the analysis
    # itself (to_core -> predict_kernel -> to_response) runs in a worker: app/jobs.py
    service = call.service
    profile = await request_profile(service, request, call.principal)
    to_core(request, service.settings.max_ptx_bytes, profile)
    if picture_requested(call.accept):
        svg, hit = await predict_svg_via_pool(service, request, profile)
        return svg_response(svg, hit)
    answer = await predict_via_pool(service, request, profile)
    return vary_on_accept(answer.response())
