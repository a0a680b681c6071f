"""POST /calibrate: fit a model's figures to measured runs, answered with a new device id."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.calibration import calibrate_request
from app.jobs import calibration_svg_via_pool
from app.negotiation import (
    NOT_ACCEPTABLE_RESPONSE,
    SVG_RESPONSE,
    picture_requested,
    svg_response,
    vary_on_accept,
)
from app.schemas.calibrate import CalibrateRequest, CalibrateResponse
from app.service import ServiceDep

router = APIRouter(tags=["calibration"])


@router.post(
    "/calibrate",
    response_model=CalibrateResponse,
    responses={
        200: SVG_RESPONSE,
        406: NOT_ACCEPTABLE_RESPONSE,
        409: {"description": "name already names another profile"},
    },
)
async def calibrate(
    request: CalibrateRequest, service: ServiceDep, http_request: Request
) -> Response:
    """Fit a base profile's figures to measured runs; the result is a stored device profile.

    With `Accept: image/svg+xml` the answer is the fit as a picture: measured vs predicted
    with the identity line, and the residuals (the profile is stored all the same).
    """
    wants_svg = picture_requested(http_request.headers.get("accept"))
    # checks, then the fit in a worker, then the store: app/calibration.py
    answer = await calibrate_request(service, request)
    if wants_svg:
        residuals = sorted(answer.residuals, key=lambda r: r.index)
        svg = await calibration_svg_via_pool(
            service,
            [r.measured for r in residuals],
            [r.predicted for r in residuals],
            [f"run {r.index}" for r in residuals],
        )
        return svg_response(svg, hit=False)
    return vary_on_accept(Response(answer.model_dump_json(), media_type="application/json"))
