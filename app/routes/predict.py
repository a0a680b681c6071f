"""POST /predict-kernel: Many-BSP prediction of a PTX kernel's execution cycles."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.convert.predict import to_core
from app.jobs import predict_via_pool
from app.schemas.predict import PredictKernelRequest, PredictKernelResponse
from app.service import ServiceDep

router = APIRouter(tags=["predict"])


@router.post("/predict-kernel", response_model=PredictKernelResponse)
async def predict(request: PredictKernelRequest, service: ServiceDep) -> Response:
    """Predict a PTX kernel's execution cycles with the Many-BSP model."""
    # size limit and device checked here (413/422 without taking a worker); the analysis
    # itself (to_core -> predict_kernel -> to_response) runs in a worker: app/jobs.py
    to_core(request, service.settings.max_ptx_bytes)
    answer = await predict_via_pool(service, request)
    return answer.response()
