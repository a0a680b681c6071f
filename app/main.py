"""ASGI application: ``app.main:app``, built by :func:`create_app` from :class:`Settings`.

The lifespan starts the solver worker pool and opens the result cache; everything the routes
share lives in ``app.state.service`` (see ``app/service.py``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import errors, middleware, openapi
from app import logging as kperf_logging
from app.cache import ResultCache
from app.metrics import Metrics
from app.pool import WorkerPool
from app.routes import batch, calibrate, devices, health, optimize, predict
from app.service import Service
from app.settings import Settings
from device_profiles import default_profiles

log = logging.getLogger("kperf.app")

#: imported by each worker before it reports ready, so no request pays for the import
WORKER_PRELOAD = ("solver", "perfmodel.manybsp", "app.jobs")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings if settings is not None else Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        kperf_logging.configure(settings.log_level, settings.log_json)
        service: Service = app.state.service
        service.profiles = default_profiles()
        service.cache.store  # noqa: B018 - open (or log and bypass) the SQLite file now
        await service.pool.start()
        log.info(
            "service started",
            extra={
                "workers": settings.workers,
                "queue_size": settings.queue_size,
                "cache_path": str(settings.cache_path) if settings.cache_path else None,
            },
        )
        try:
            yield
        finally:
            await service.pool.stop()
            service.cache.close()
            log.info("service stopped")

    app = FastAPI(
        title="kperf",
        version="0.1.0",
        description=(
            "Analytical GPU kernel performance service: GeMM-WS tiling optimizer (Z3) and "
            "Many-BSP PTX kernel predictor. Times are in microseconds (`_us`) or cycles "
            "(`_cycles`); sizes in bytes (`_bytes`)."
        ),
        lifespan=lifespan,
    )
    pool = WorkerPool(
        settings.workers,
        settings.queue_size,
        memory_limit_bytes=settings.worker_memory_limit_bytes,
        retry_after_s=settings.retry_after_s,
        startup_timeout_s=settings.worker_startup_timeout_s,
        preload=WORKER_PRELOAD,
        nice=settings.worker_nice,
        on_restart=lambda reason: metrics.worker_restarts.labels(reason).inc(),
        on_queue_depth=metrics.queue_depth.set,
    )
    cache = ResultCache(
        settings.cache_memory_items,
        settings.cache_path,
        on_error=lambda operation: metrics.cache_errors.labels(operation).inc(),
    )
    app.state.service = Service(settings=settings, metrics=metrics, pool=pool, cache=cache)
    app.state.settings = settings
    errors.install(app)
    openapi.install(app)
    middleware.install(app, metrics, settings.max_body_bytes)
    app.include_router(health.router)
    app.include_router(devices.router)
    app.include_router(optimize.router)
    app.include_router(batch.router)
    app.include_router(predict.router)
    app.include_router(calibrate.router)
    return app


app = create_app()
