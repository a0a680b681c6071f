"""ASGI application: ``app.main:app``, built by :func:`create_app` from :class:`Settings`.

The lifespan starts the solver worker pool and reaches the shared store (``KPERF_STORE_URL``);
everything the routes share lives in ``app.state.service`` (see ``app/service.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI

from app import docs_ui, errors, middleware, openapi, security_headers
from app import logging as kperf_logging
from app.auth import TokenTable
from app.cache import MemoryLRU, ResultCache
from app.expiry import IdleExpiry
from app.inline import WARM_UP_REQUEST, InlineRunner
from app.jobs import warm_up_job
from app.metrics import Metrics
from app.pool import WorkerPool
from app.routes import batch, calibrate, devices, health, optimize, page, predict, tuning_table
from app.service import Service
from app.settings import Settings
from app.store import Store, StoreUnavailable, make_store
from device_profiles import default_profiles

log = logging.getLogger("kperf.app")

#: where authentication may stay off (the default): only this machine reaches the port
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")

#: imported by each worker before it reports ready, so no request pays for the import
#: (the exact scorer brings numpy: ~100 ms a cold worker would spend inside a solve's budget)
WORKER_PRELOAD = ("solver", "perfmodel.manybsp", "perfmodel.gemm_ws_scoring", "app.jobs")


async def _probe_store(store: Store) -> None:
    """Reach the store once at start-up; an unreachable one is logged (by the store) and the
    service starts degraded, answering from its own cache and solver."""
    try:
        await asyncio.to_thread(store.ping)
    except StoreUnavailable:
        pass


#: seconds between attempts to migrate a store that was unreachable at start-up
MIGRATE_RETRY_S = 5.0


async def _migrate(service: Service, *, retry: bool) -> bool:
    """Bring the store to the current layout (``ProfileStore.migrate``); while it is
    unreachable, False (``retry``: try again every MIGRATE_RETRY_S until it answers)."""
    while True:
        try:
            await asyncio.to_thread(service.profile_store.migrate)
            return True
        except StoreUnavailable:
            if not retry:
                return False
            await asyncio.sleep(MIGRATE_RETRY_S)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings if settings is not None else Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        kperf_logging.configure(settings.log_level, settings.log_json)
        service: Service = app.state.service
        service.profiles = default_profiles()
        await _probe_store(service.store)  # open the file / reach Redis now, or log and go on
        await service.pool.start()
        if service.inline is not None:
            # numpy and this thread's Z3 session loaded before the first request needs them
            service.inline.warm(partial(warm_up_job, WARM_UP_REQUEST))
        if service.tokens is None and settings.host not in LOOPBACK_HOSTS:
            log.warning(
                "authentication is off (KPERF_TOKENS_FILE unset): anyone who reaches the port "
                "may calibrate, post runs and delete; see README 'Run it for a team'"
            )
        log.info(
            "service started",
            extra={
                "workers": settings.workers,
                "queue_size": settings.queue_size,
                "store": service.store.name,
                "store_ok": service.store.health().ok,
            },
        )
        background: list[asyncio.Task[object]] = []
        # before the first request when the store answers: names resolve in the new layout
        if not await _migrate(service, retry=False):
            background.append(asyncio.create_task(_migrate(service, retry=True)))
        if service.expiry is not None:
            background.append(asyncio.create_task(service.expiry.run()))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await service.pool.stop()
            if service.inline is not None:
                await service.inline.stop()
            await asyncio.to_thread(service.store.close)
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
        # a body with no Content-Type is JSON (app/routes/json_body.py): FastAPI's default
        # would hand the endpoint raw bytes, refused as "not a valid dictionary"
        strict_content_type=False,
        # served with local assets by docs_ui (no CDN: air-gapped clusters)
        docs_url=None,
        redoc_url=None,
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
    # the shared store is built here but opened (or reached) only by the lifespan
    store = make_store(
        settings.effective_store_url,
        timeout_s=settings.store_timeout_s,
        on_error=lambda operation: metrics.store_errors.labels(operation).inc(),
        on_decode_failure=lambda kind, reason: metrics.store_decode_failures.labels(
            kind, reason
        ).inc(),
    )
    memory = MemoryLRU(
        settings.cache_memory_bytes, settings.cache_max_entry_bytes, settings.cache_memory_items
    )
    store_ttl_s = settings.cache_store_ttl_s or None  # 0: never expires
    cache = ResultCache.in_front_of(memory, store, store_ttl_s=store_ttl_s)
    tokens = (
        TokenTable.load(
            settings.tokens_file, reads_required=settings.auth_reads, reserved=default_profiles()
        )
        if settings.tokens_file is not None
        else None
    )
    inline = (
        InlineRunner(min_job_time_limit_s=pool.min_job_time_limit_s)
        if settings.inline_max_configurations > 0
        else None
    )
    app.state.service = Service(
        settings=settings,
        metrics=metrics,
        pool=pool,
        cache=cache,
        store=store,
        tokens=tokens,
        inline=inline,
    )
    if settings.profile_idle_expiry_s > 0:
        service = app.state.service
        service.expiry = IdleExpiry(
            lambda: service.profile_store,
            settings.profile_idle_expiry_s,
            lambda kind: metrics.profiles_expired.labels(kind).inc(),
        )
    app.state.settings = settings
    errors.install(app)
    openapi.install(app)
    middleware.install(app, metrics, settings.max_body_bytes)
    # outermost: every answer, 413s and 500s included, carries the security headers
    app.add_middleware(security_headers.SecurityHeadersMiddleware)
    docs_ui.install(app)
    app.include_router(health.router)
    app.include_router(devices.router)
    app.include_router(optimize.router)
    app.include_router(batch.router)
    app.include_router(predict.router)
    app.include_router(calibrate.router)
    app.include_router(tuning_table.router)
    app.include_router(page.router)
    return app


app = create_app()
