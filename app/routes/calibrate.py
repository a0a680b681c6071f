"""POST /calibrate: fit a model's figures to measured runs, answered with a new device id."""

from __future__ import annotations

from fastapi import APIRouter

from app.calibration import calibrate_request
from app.schemas.calibrate import CalibrateRequest, CalibrateResponse
from app.service import ServiceDep

router = APIRouter(tags=["calibration"])


@router.post(
    "/calibrate",
    response_model=CalibrateResponse,
    responses={409: {"description": "name already names another profile"}},
)
async def calibrate(request: CalibrateRequest, service: ServiceDep) -> CalibrateResponse:
    """Fit a base profile's figures to measured runs; the result is a stored device profile."""
    # checks, then the fit in a worker, then the store: app/calibration.py
    return await calibrate_request(service, request)
