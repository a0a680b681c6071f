"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from app.service import Service, ServiceDep
from app.store import Store, StoreUnavailable

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"


class ReadinessChecks(BaseModel):
    profiles_loaded: bool = Field(description="at least one device profile validated at start-up")
    z3_usable: bool = Field(description="Z3 imports and decides a trivial formula")
    pool_alive: bool = Field(
        description="at least one solver worker is loaded and alive (dead ones are replaced "
        "at once; see workers_starting)"
    )


class WorkerInfo(BaseModel):
    pid: int | None = Field(
        description="process id of the worker, only with KPERF_READYZ_WORKER_PIDS=true (else null)"
    )
    state: Literal["starting", "idle", "busy"]


class StoreReadiness(BaseModel):
    """The shared store: a degraded store does not make the service unready (it answers from
    its own cache and solver, and reconnects by itself)."""

    backend: str = Field(description="memory, sqlite or redis (KPERF_STORE_URL)")
    status: Literal["ok", "degraded: store"]
    reason: str | None = Field(description="the last store error while degraded")


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    checks: ReadinessChecks
    workers_alive: int = Field(description="loaded solver worker processes (idle or busy)")
    workers_idle: int = Field(description="worker processes waiting for a job")
    workers_busy: int = Field(description="worker processes running a job")
    workers_starting: int = Field(description="replacement workers still loading")
    queue_depth: int = Field(description="requests waiting for a free worker")
    workers: list[WorkerInfo] = Field(description="every solver worker process")
    store: StoreReadiness = Field(
        description="the shared store (result cache, calibrated profiles, measurements): "
        "'degraded: store' with the reason after an error (a corrupt SQLite file, Redis "
        "unreachable), never making the service unready"
    )


def _z3_usable() -> bool:
    try:
        import z3

        x = z3.Int("x")
        solver = z3.Solver()
        solver.set("timeout", 1000)
        solver.add(x > 1, x < 3)
        return bool(solver.check() == z3.sat)
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False


#: /readyz's own threads: its checks never queue behind store calls in the default pool (a
#: frozen Redis held them there for 1.7-2.4 s), and at most this many run at once
_READY_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kperf-readyz")
#: how long /readyz waits for the store's round trip before answering with its last state
READY_STORE_WAIT_S = 0.02
#: a Z3 check that passed is trusted this long: a probe every few seconds need not solve
#: (and wait for a thread) each time to learn what cannot change in a running process
Z3_CHECK_VALID_S = 10.0
_z3_ok_until = 0.0
#: the one store round trip in flight for /readyz, if any: a slow store is pinged once, not
#: once per probe
_ping: asyncio.Future[None] | None = None


def _ping_store(store: Store) -> None:
    try:
        store.ping()
    except StoreUnavailable:
        pass  # counted and logged by the store; its health() reports it


async def _z3_readiness() -> bool:
    global _z3_ok_until
    if time.monotonic() < _z3_ok_until:
        return True
    usable = await asyncio.get_running_loop().run_in_executor(_READY_EXECUTOR, _z3_usable)
    if usable:
        _z3_ok_until = time.monotonic() + Z3_CHECK_VALID_S
    return usable


async def _store_readiness(service: Service) -> StoreReadiness:
    """One round trip to the store (through its circuit breaker: a store known to be down is
    not called again before its back-off ends), waited for at most READY_STORE_WAIT_S; then
    the store's state as last observed."""
    global _ping
    loop = asyncio.get_running_loop()
    if _ping is None or _ping.done() or _ping.get_loop() is not loop:
        _ping = loop.run_in_executor(_READY_EXECUTOR, _ping_store, service.store)
    await asyncio.wait({_ping}, timeout=READY_STORE_WAIT_S)
    health = service.store.health()
    return StoreReadiness(
        backend=health.backend,
        status="ok" if health.ok else "degraded: store",
        reason=health.reason,
    )


@router.get("/healthz", response_model=Liveness)
async def healthz() -> Liveness:
    """Liveness: the event loop answers (no dependency is checked)."""
    return Liveness()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "a dependency is not ready"}},
)
async def readyz(service: ServiceDep) -> JSONResponse:
    """Readiness: profiles loaded, Z3 usable, worker pool alive; the store's state besides."""
    pool = service.pool
    checks = ReadinessChecks(
        profiles_loaded=bool(service.profiles),
        z3_usable=await _z3_readiness(),
        pool_alive=pool.running and pool.alive_workers > 0,
    )
    ready = checks.profiles_loaded and checks.z3_usable and checks.pool_alive
    body = Readiness(
        status="ready" if ready else "not ready",
        checks=checks,
        workers_alive=pool.alive_workers,
        workers_idle=pool.idle_workers,
        workers_busy=pool.busy_workers,
        workers_starting=pool.starting_workers,
        queue_depth=pool.waiting,
        workers=[
            WorkerInfo.model_validate(
                {"pid": pid if service.settings.readyz_worker_pids else None, "state": state}
            )
            for pid, state in pool.worker_states()
        ],
        store=await _store_readiness(service),
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
async def metrics(service: ServiceDep) -> Response:
    """Prometheus metrics of this process."""
    service.metrics.queue_depth.set(service.pool.waiting)
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
