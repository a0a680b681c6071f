"""Typed Python client of the kperf HTTP API (the CLI's only way to talk to the service).

``KperfClient(url)`` talks to a running server; ``KperfClient()`` builds the application in
this process (its worker pool included) and talks to it through ``httpx.ASGITransport``, so the
same code paths, limits and error bodies apply either way. Only that in-process mode imports the
server (``app``, installed by ``pip install 'kperf[server]'``), inside ``__aenter__``; answers
are read into the client's own views (:mod:`kperf_client.models`)::

    async with KperfClient() as client:
        answer = await client.optimize({"m": 4096, "n": 4096, "k": 4096, "device": "rtx-a6000"})
        print(answer.response.best.predicted_time_us, answer.cache)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import httpx
from pydantic import BaseModel

from kperf_client.models import (
    CalibrateResponse,
    DeviceDetail,
    DeviceList,
    MeasurementRecord,
    MeasurementsAdded,
    OptimizeTilingBatchResponse,
    OptimizeTilingResponse,
    TuningTableResponse,
)

if TYPE_CHECKING:  # the in-process mode's settings; never imported at run time from here
    from app.settings import Settings

#: the ASGI interface (asgiref's spec), spelled out so the client needs no server package
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]
#: a request body: a mapping, or any pydantic model (only the fields set on it are sent)
Body = BaseModel | Mapping[str, Any]

IN_PROCESS_URL = "http://kperf.in-process"
SVG_MEDIA_TYPE = "image/svg+xml"


class ServerNotInstalled(RuntimeError):
    """The server is needed (in-process mode, ``kperf serve``) but only the user side is
    installed: ``pip install 'kperf[server]'``, or talk to a running service by its URL."""

    def __init__(self, purpose: str, missing: str | None) -> None:
        self.missing = missing
        super().__init__(
            f"{purpose} needs the server, which is not installed (no module {missing!r}): "
            "pip install 'kperf[server]', or give the URL of a running service"
        )


@contextlib.contextmanager
def server_imports(purpose: str) -> Iterator[None]:
    """Around the lazy imports of the server: a missing server module becomes
    :class:`ServerNotInstalled`, saying what to install."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise ServerNotInstalled(purpose, exc.name) from exc


class KperfError(Exception):
    """The service answered with an error; ``problem`` is its problem+json body."""

    def __init__(self, status: int, problem: dict[str, Any], request_id: str | None) -> None:
        self.status = status
        self.problem = problem
        self.request_id = request_id
        detail = problem.get("detail") or problem.get("title") or "error"
        super().__init__(f"HTTP {status}: {detail}")

    @property
    def field_errors(self) -> list[tuple[str, str]]:
        return [(e.get("field", "?"), e.get("reason", "")) for e in self.problem.get("errors", [])]

    @property
    def retry_after_s(self) -> float | None:
        value = self.problem.get("_retry_after")
        return float(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class OptimizeAnswer:
    response: OptimizeTilingResponse
    cache: str | None  # "hit" | "miss" from X-Cache
    request_id: str | None


class _Lifespan:
    """Drive an ASGI app's lifespan protocol (startup on enter, shutdown on exit)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _receive(self) -> Message:
        return await self._to_app.get()

    async def _send(self, message: Message) -> None:
        await self._from_app.put(message)

    async def _expect(self, wanted: str) -> None:
        message = await self._from_app.get()
        if message["type"] != wanted:
            raise RuntimeError(f"application {wanted[: -len('.complete')]} failed: {message}")

    async def __aenter__(self) -> Self:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.ensure_future(self.app(scope, self._receive, self._send))
        await self._to_app.put({"type": "lifespan.startup"})
        await self._expect("lifespan.startup.complete")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await self._expect("lifespan.shutdown.complete")
        if self._task is not None:
            await self._task


class KperfClient:
    """Async client; use as ``async with KperfClient(url) as client``."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        settings: Settings | Mapping[str, Any] | None = None,
        timeout_s: float = 180.0,
        request_id: str | None = None,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url
        #: in-process mode only: an ``app.settings.Settings``, or a mapping of its fields
        #: bearer token sent with every request (a server with KPERF_TOKENS_FILE wants one)
        self.token = token
        self.settings = settings
        self.timeout_s = timeout_s
        self.request_id = request_id
        self._http: httpx.AsyncClient | None = None
        #: the in-process application (None when talking to a URL)
        self.app: ASGIApp | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        headers = {"X-Request-ID": self.request_id} if self.request_id else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.base_url is None:
            # only the in-process mode needs the server (the kperf[server] install)
            with server_imports("the in-process service (no URL)"):
                from app.main import create_app
                from app.settings import Settings

            settings = self.settings
            if not isinstance(settings, Settings):
                settings = Settings(**(settings or {}))
            app = create_app(settings)
            self.app = app
            await self._stack.enter_async_context(_Lifespan(app))
            transport: httpx.AsyncBaseTransport = httpx.ASGITransport(app=app)
            url = IN_PROCESS_URL
        else:
            transport = httpx.AsyncHTTPTransport()
            url = self.base_url
        self._http = await self._stack.enter_async_context(
            httpx.AsyncClient(
                transport=transport, base_url=url, timeout=self.timeout_s, headers=headers
            )
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()
        self._http = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("use the client inside 'async with KperfClient(...)'")
        return self._http

    async def _call(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        accept: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        headers = {"Accept": accept} if accept is not None else None
        response = await self.http.request(method, path, json=json, headers=headers, params=params)
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"detail": response.text}
            if not isinstance(problem, dict):
                problem = {"detail": str(problem)}
            if "retry-after" in response.headers:
                problem["_retry_after"] = response.headers["retry-after"]
            raise KperfError(response.status_code, problem, response.headers.get("x-request-id"))
        return response

    # ------------------------------------------------------------------ endpoints

    async def healthz(self) -> dict[str, Any]:
        body: dict[str, Any] = (await self._call("GET", "/healthz")).json()
        return body

    async def readyz(self) -> dict[str, Any]:
        body: dict[str, Any] = (await self._call("GET", "/readyz")).json()
        return body

    async def devices(self) -> DeviceList:
        return DeviceList.model_validate((await self._call("GET", "/devices")).json())

    async def device(self, device_id: str) -> DeviceDetail:
        response = await self._call("GET", f"/devices/{device_id}")
        return DeviceDetail.model_validate(response.json())

    async def optimize(self, request: Body) -> OptimizeAnswer:
        body = _request_json(request)
        response = await self._call("POST", "/optimize-tiling", body)
        return OptimizeAnswer(
            OptimizeTilingResponse.model_validate(response.json()),
            response.headers.get("x-cache"),
            response.headers.get("x-request-id"),
        )

    async def optimize_batch(self, problems: Sequence[Body]) -> OptimizeTilingBatchResponse:
        body = {"problems": [_request_json(p) for p in problems]}
        response = await self._call("POST", "/optimize-tiling/batch", body)
        return OptimizeTilingBatchResponse.model_validate(response.json())

    async def predict(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """POST /predict-kernel; the body as the service documents it in its OpenAPI."""
        body: dict[str, Any] = (await self._call("POST", "/predict-kernel", dict(request))).json()
        return body

    async def optimize_svg(self, request: Body, candidate_rank: int = 1) -> bytes:
        """POST /optimize-tiling as a picture: the timeline of the candidate at that rank."""
        response = await self._call(
            "POST",
            "/optimize-tiling",
            _request_json(request),
            accept=SVG_MEDIA_TYPE,
            params={"candidate_rank": candidate_rank},
        )
        return response.content

    async def predict_svg(self, request: Mapping[str, Any]) -> bytes:
        """POST /predict-kernel as a picture: the superstep breakdown."""
        response = await self._call("POST", "/predict-kernel", dict(request), accept=SVG_MEDIA_TYPE)
        return response.content

    async def tuning_table(self, request: Body) -> TuningTableResponse:
        """POST /tuning-table: a per-M table of kernel configurations for one (N, K)."""
        response = await self._call("POST", "/tuning-table", _request_json(request))
        return TuningTableResponse.model_validate(response.json())

    async def tuning_table_svg(self, request: Body) -> bytes:
        """POST /tuning-table as a picture: time over M, each M's optimum, the loss band."""
        response = await self._call(
            "POST", "/tuning-table", _request_json(request), accept=SVG_MEDIA_TYPE
        )
        return response.content

    async def calibrate(self, request: Body) -> CalibrateResponse:
        """POST /calibrate: a new calibrated profile; its id is ``answer.device``."""
        response = await self._call("POST", "/calibrate", _request_json(request))
        return CalibrateResponse.model_validate(response.json())

    async def add_measurements(
        self, device: str, model: str, measurements: Sequence[Body]
    ) -> MeasurementsAdded:
        """POST /devices/{device}/measurements: append measured runs of ``model``."""
        body = {"model": model, "measurements": [_request_json(m) for m in measurements]}
        response = await self._call("POST", f"/devices/{device}/measurements", body)
        return MeasurementsAdded.model_validate(response.json())

    async def measurements(self, device: str) -> MeasurementRecord:
        """GET /devices/{device}/measurements: the runs recorded for the device."""
        response = await self._call("GET", f"/devices/{device}/measurements")
        return MeasurementRecord.model_validate(response.json())

    async def recalibrate(self, device: str, request: Body | None = None) -> CalibrateResponse:
        """POST /devices/{device}/recalibrate: refit from every recorded run."""
        body = None if request is None else _request_json(request)
        response = await self._call("POST", f"/devices/{device}/recalibrate", body)
        return CalibrateResponse.model_validate(response.json())


def _request_json(request: Body) -> dict[str, Any]:
    if isinstance(request, BaseModel):
        # only what the caller set: unset fields take the server's defaults
        return request.model_dump(mode="json", exclude_unset=True)
    return dict(request)
