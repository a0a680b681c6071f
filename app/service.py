"""The running service's shared parts, and the one path every solve takes.

Routes get the :class:`Service` through the ``ServiceDep`` dependency and call
:func:`cached_solve` + :func:`run_job`: cache lookup (``X-Cache: hit|miss``), back-pressure and
deadline in the worker pool, metrics. Answers travel as encoded JSON bytes from the worker to
the client and the cache (:class:`EncodedAnswer`, :class:`CachedAnswer`). The core
(``solver/``, ``perfmodel/``) is called only inside worker processes, through module-level
functions.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import pickle
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Protocol, SupportsIndex

from fastapi import Depends, Request, Response
from fastapi.responses import StreamingResponse

from app.auth import Principal, TokenTable
from app.cache import ResultCache, cache_key
from app.logging import request_started_var
from app.metrics import Metrics
from app.pool import (
    PoolClosed,
    PoolSaturated,
    WorkerCrashed,
    WorkerMemoryExceeded,
    WorkerPool,
    WorkerTimeout,
)
from app.profile_store import Limits, ProfileStore
from app.settings import Settings
from app.singleflight import SingleFlight
from app.store import MemoryStore, Store
from device_profiles import DeviceProfile, default_profiles
from perfmodel.errors import ModelInputError
from solver.errors import SolverTimeout

if TYPE_CHECKING:
    from app.expiry import IdleExpiry

CACHE_HEADER = "X-Cache"
#: time kept back from the request's bound to write the answer (a 504 included)
ANSWER_MARGIN_S = 0.06


def _package_version() -> str:
    try:
        return importlib.metadata.version("kperf")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "0+unknown"


#: part of every cache key: a new release never answers from an older model's results
MODEL_VERSION = _package_version()


class RequestFieldError(ModelInputError):
    """A request field the service's own limits refuse (422, naming the field)."""


class RequestStateConflict(RequestFieldError):
    """A well-formed request the target's current state cannot serve (409, naming the field):
    e.g. recalibrating a device that has no measured runs yet."""


class RequestedItemMissing(RequestFieldError):
    """A well-formed request naming an item the answer does not have (404, naming the field):
    e.g. a ``candidate_rank`` beyond the shortlist's length."""


class SmallSolves(Protocol):
    """What the service uses of the runner of small solves in its own process (app/inline.py's
    ``InlineRunner``, which imports this module: the service names only this contract)."""

    #: jobs answered in the service's own process so far
    jobs_run: int

    def warm(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` (imports, a first solve) in the runner's thread now, in the background."""

    async def stop(self) -> None:
        """Wait for the job in progress, then release the thread."""

    async def run(
        self, service: Service, job: Job, *, admitted: bool = False
    ) -> EncodedAnswer | None:
        """``job``'s answer, computed in the service's own process within the request's bound;
        None: the runner is busy or too little time is left (the pool takes the job)."""


@dataclass
class Service:
    settings: Settings
    metrics: Metrics
    pool: WorkerPool
    cache: ResultCache
    profiles: dict[str, DeviceProfile] = field(default_factory=dict)
    #: shared with other replicas when KPERF_STORE_URL names one; in-process by default
    store: Store = field(default_factory=MemoryStore)
    #: bearer tokens (app/auth.py); None: authentication off
    tokens: TokenTable | None = None
    #: small solves in the service's own thread (app/inline.py); None: every solve in the pool
    inline: SmallSolves | None = None
    #: idle calibrated profiles and drafts expire (app/expiry.py); None: they never do
    expiry: IdleExpiry | None = None
    #: identical concurrent misses solve once (app/singleflight.py); built from the cache
    flights: SingleFlight = field(init=False)

    def __post_init__(self) -> None:
        self.flights = SingleFlight(
            self.cache,
            lock_ttl_s=self.settings.singleflight_lock_ttl_s,
            on_outcome=lambda outcome: self.metrics.singleflight.labels(outcome).inc(),
        )

    def resolve_time_limit(
        self, requested_s: float | None, field_name: str = "time_limit_s"
    ) -> float:
        """The request's limit, or the default; above the configured maximum is a 422."""
        if requested_s is None:
            return self.settings.default_time_limit_s
        if requested_s > self.settings.max_time_limit_s:
            raise RequestFieldError(
                field_name,
                f"must be at most {self.settings.max_time_limit_s} s (the server's maximum), "
                f"got {requested_s}",
            )
        return requested_s

    @property
    def profile_store(self) -> ProfileStore:
        """Shipped and calibrated profiles, aliases and measured runs (app/profile_store.py)."""
        limits = Limits(
            runs_per_device=self.settings.max_calibration_measurements,
            profiles_per_tenant=self.settings.max_profiles_per_tenant,
            bytes_per_tenant=self.settings.max_bytes_per_tenant,
        )
        owner_only = self.tokens is not None and self.tokens.reads_required
        return ProfileStore(
            self.store,
            self.profiles or default_profiles(),
            limits,
            reads="owner" if owner_only else "open",
        )

    async def resolve_profile(
        self, device_id: str, viewer: Principal, field: str = "device"
    ) -> DeviceProfile:
        """The profile a shipped id, a calibrated id ``viewer`` may read or one of its
        tenant's names names; UnknownDevice (naming ``field`` and the shipped ids) otherwise.
        Jobs get the profile itself: workers never look profiles up."""
        shipped = (self.profiles or default_profiles()).get(device_id)
        if shipped is not None:
            return shipped
        profile = await asyncio.to_thread(self.profile_store.resolve, device_id, viewer, field)
        await self.touch(profile.id)
        return profile

    async def touch(self, record_id: str) -> None:
        """Note a use of a calibrated profile or draft record, when idle profiles expire
        (app/expiry.py); at most one store write per record per refresh interval."""
        if self.expiry is not None:
            await self.expiry.touch(record_id)

    def check_search_space(self, candidates: int) -> None:
        """Refuse spaces too large to even enumerate within a time limit (422)."""
        limit = self.settings.max_search_space_candidates
        if candidates > limit:
            raise RequestFieldError(
                "search_space",
                f"{candidates} candidate tilings (the product of the candidates per dimension) "
                f"exceeds this server's limit of {limit}; narrow the ranges or lists",
            )


def get_service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


def profile_digest(profile: DeviceProfile) -> str:
    """Content digest of a device profile: any edited figure changes every cache key."""
    return profile.content_sha256()[:16]


def versions_for(profile: DeviceProfile | None) -> dict[str, str]:
    """What besides the request decides an answer: the model release and the profile's content
    (a calibrated profile resolved by id gets its own digest, so recalibrating changes the key).
    """
    versions = {"model": MODEL_VERSION}
    if profile is not None:
        versions["profile"] = f"{profile.id}@{profile_digest(profile)}"
    return versions


def _outcome_label(exc: BaseException) -> str:
    """The ``outcome`` label of a job that raised ``exc`` (see ``kperf_solve_duration_seconds``)."""
    if isinstance(exc, WorkerTimeout | SolverTimeout):
        return "timeout"
    if isinstance(exc, WorkerMemoryExceeded):
        return "memory"
    if isinstance(exc, WorkerCrashed):
        return "crash"
    return "error"


def _answer_label(value: Any) -> str:
    """``partial`` for a best-so-far answer: only a solve that ran out of time is uncacheable."""
    if isinstance(value, EncodedAnswer) and not value.cacheable:
        return "partial"
    return "ok"


def spent_of_request(admitted: bool) -> tuple[float, float]:
    """(seconds since the request arrived, margin kept to write the answer); both 0 for a
    batch item (``admitted``: it counts from its own dispatch) or outside a request."""
    started = request_started_var.get()
    if started is None or admitted:
        return 0.0, 0.0
    return time.perf_counter() - started, ANSWER_MARGIN_S


@dataclass(frozen=True, slots=True)
class Job:
    """One call of a worker function, ``fn(**kwargs)``, timed under ``kind`` (metrics) and
    bounded by the client's ``time_limit_s``."""

    kind: str
    fn: Callable[..., Any]
    kwargs: dict[str, Any]
    time_limit_s: float


async def run_job(
    service: Service, job: Job, *, pass_time_limit: bool = True, admitted: bool = False
) -> Any:
    """Run the job in the pool within limit + 20 % + 100 ms; record solve time.

    The bound counts from the request's arrival (reading, validating and the cache lookup
    included), less a margin for writing the answer; batch items (``admitted``) count from
    their own dispatch instead. Every 504 names the client's ``time_limit_s``, not what was
    left of it when the job started.
    """
    time_limit_s = job.time_limit_s
    hard_deadline_s = service.settings.hard_deadline_s(time_limit_s)
    elapsed_s, margin_s = spent_of_request(admitted)
    called = time.perf_counter()
    try:
        outcome = await service.pool.run(
            job.fn,
            job.kwargs,
            time_limit_s=time_limit_s,
            hard_deadline_s=hard_deadline_s,
            pass_time_limit=pass_time_limit,
            admitted=admitted,
            elapsed_s=elapsed_s,
            margin_s=margin_s,
        )
    except PoolSaturated:
        service.metrics.rejected.labels("queue_full").inc()
        raise
    except PoolClosed:
        raise
    except Exception as exc:
        if isinstance(exc, WorkerTimeout) and not exc.dispatched:
            service.metrics.rejected.labels("deadline").inc()
        record_job_outcome(service, job.kind, time.perf_counter() - called, error=exc)
        if isinstance(exc, SolverTimeout):
            # the solver names the limit it was given (what queueing left); the client's is
            # the one to report
            raise SolverTimeout(time_limit_s) from None
        raise
    record_job_outcome(service, job.kind, outcome.solve_time_s, value=outcome.value)
    return outcome.value


def record_job_outcome(
    service: Service,
    kind: str,
    seconds: float,
    *,
    value: Any = None,
    error: BaseException | None = None,
) -> None:
    """Record a job's solve time by outcome, and the certificate mismatches its answer
    counted (a pool job's, and one that ran in the service's own thread: app/inline.py)."""
    if error is not None:
        service.metrics.solve_time.labels(kind, _outcome_label(error)).observe(seconds)
        return
    service.metrics.solve_time.labels(kind, _answer_label(value)).observe(seconds)
    if isinstance(value, EncodedAnswer) and value.certificate_mismatches:
        service.metrics.certificate_mismatches.inc(value.certificate_mismatches)


#: worker answers with a body above this are sent out of band (see ``EncodedAnswer``)
OUT_OF_BAND_ABOVE_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class EncodedAnswer:
    """A worker's answer: the JSON body exactly as it will be sent, and whether it may be
    cached (a "timeout" answer depends on the machine's speed; only complete ones are)."""

    body: bytes
    cacheable: bool
    #: Z3 refuted the exact scorer's best (solver/optimize.py): counted in the parent's metrics
    certificate_mismatches: int = 0

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # protocol 5 (the worker pool, app/pool.py): a large body travels out of band, as
        # itself, not copied into the pickle and out again (and is read off the event loop);
        # a small one costs less in the pickle than a message of its own
        large = len(self.body) > OUT_OF_BAND_ABOVE_BYTES
        body = pickle.PickleBuffer(self.body) if large and int(protocol) >= 5 else self.body
        return (EncodedAnswer, (body, self.cacheable, self.certificate_mismatches))


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """The body to send and whether it came from the cache."""

    body: bytes | memoryview
    hit: bool
    #: what must stay alive while the body is sent (the cache's shared copy of a large body)
    holder: object = None

    def response(self) -> Response:
        """The HTTP answer: these bytes as they are, with ``X-Cache``."""
        headers = {CACHE_HEADER: "hit" if self.hit else "miss"}
        return json_bytes_response(self.body, headers, holder=self.holder)


#: bodies above this are sent in chunks of this size, so the connection's write buffer never
#: holds a second copy of a large answer (the bytes are shared with the cache)
STREAM_CHUNK_BYTES = 256 * 1024


def json_bytes_response(
    body: bytes | memoryview, headers: dict[str, str], *, holder: object = None
) -> Response:
    """An ``application/json`` response of already-encoded ``body`` (nothing re-serialised);
    ``holder`` is kept alive until the last chunk is sent."""
    if len(body) <= STREAM_CHUNK_BYTES:
        return Response(body, media_type="application/json", headers=headers)

    async def chunks() -> AsyncIterator[bytes | memoryview]:
        keep = holder  # noqa: F841 - referenced by the generator until it finishes
        for start in range(0, len(body), STREAM_CHUNK_BYTES):
            yield body[start : start + STREAM_CHUNK_BYTES]

    return StreamingResponse(
        chunks(),
        media_type="application/json",
        headers={**headers, "content-length": str(len(body))},
    )


async def cached_solve(
    service: Service,
    *,
    kind: str,
    canonical_request: dict[str, Any],
    profile: DeviceProfile | None,
    compute: Callable[[], Awaitable[EncodedAnswer]],
    wait_limit_s: float,
) -> CachedAnswer:
    """Answer from the cache, else ``compute()`` once for every identical concurrent request
    (single-flight, across replicas sharing the store: ``app/singleflight.py``) and store its
    body when it is cacheable.

    Hits are the stored bytes, sent as they are: nothing is validated or serialised again.
    ``X-Cache: hit`` also answers a request that waited for an identical one's solve: hit means
    this request caused no solve. A request waits for another's solve at most
    ``wait_limit_s``, then solves by itself. The key (canonical JSON of a request that may hold
    megabytes of PTX) is hashed off the event loop, and so are the store's reads and writes.
    """
    key = await asyncio.to_thread(lambda: cache_key(kind, canonical_request, versions_for(profile)))
    stored = await service.cache.get(key)
    if stored is not None:
        service.metrics.cache.labels("hit").inc()
        return CachedAnswer(stored.data, hit=True, holder=stored)
    service.metrics.cache.labels("miss").inc()
    flown = await service.flights.solve(key, compute, wait_limit_s=wait_limit_s)
    return CachedAnswer(flown.body, hit=not flown.computed, holder=flown.holder)
