"""POST /calibrate: fit a model's figures to measured runs, answered with a new device id."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from app.calibration import calibrate_request, calibration_response
from app.negotiation import NOT_ACCEPTABLE_RESPONSE, SVG_RESPONSE, picture_requested
from app.routes.access import WriterDep
from app.routes.json_body import OffLoopJSONRoute
from app.schemas.calibrate import CalibrateRequest, CalibrateResponse
from app.service import ServiceDep

router = APIRouter(tags=["calibration"], route_class=OffLoopJSONRoute)

#: the answers of the calibrating routes besides the JSON one
CALIBRATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        **SVG_RESPONSE,
        "description": "the answer as JSON, or with `Accept: image/svg+xml` the fit drawn "
        "(measured against predicted per run, and the residuals); `Location` names the profile",
    },
    406: NOT_ACCEPTABLE_RESPONSE,
    401: {"description": "no token, or an unknown one, while the server requires tokens"},
    403: {"description": "the token may only read"},
    409: {
        "description": "name already names another profile, or a cap (profiles or bytes per "
        "tenant, runs per device) would be passed: nothing stored; or (recalibrate) the device "
        "has no measured runs yet"
    },
}


@router.post("/calibrate", response_model=CalibrateResponse, responses=CALIBRATE_RESPONSES)
async def calibrate(
    request: CalibrateRequest, service: ServiceDep, http_request: Request, principal: WriterDep
) -> Response:
    """Fit a base profile's figures to measured runs; the result is a stored device profile.

    With `Accept: image/svg+xml` the answer is the fit drawn; the profile is stored either way.
    """
    picture = picture_requested(http_request.headers.get("accept"))  # a 406 before any fit
    # checks, then the fit in a worker, then the store: app/calibration.py
    answer = await calibrate_request(service, principal, request)
    return await calibration_response(service, answer, picture)
