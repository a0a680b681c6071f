"""ASGI application: ``app.main:app``."""

from __future__ import annotations

from fastapi import FastAPI

from app import errors
from app.routes import devices, optimize

app = FastAPI(
    title="kperf",
    version="0.1.0",
    description=(
        "Analytical GPU kernel performance service: GeMM-WS tiling optimizer (Z3) and "
        "Many-BSP PTX kernel predictor. Times are in microseconds (`_us`) or cycles "
        "(`_cycles`); sizes in bytes (`_bytes`)."
    ),
)
errors.install(app)
app.include_router(devices.router)
app.include_router(optimize.router)
