"""Map domain errors and validation failures to RFC 9457 problem+json responses.

Every error body has ``type``, ``title``, ``status``, ``detail`` and ``errors``: a list of
``{"field": dotted.path, "reason": text}`` naming what was wrong. Handlers are registered
once, here; a test checks every domain error class has one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.auth import Forbidden, Unauthorized
from app.convert.optimize import DtypeNotServed
from app.convert.predict import PTXTooLarge
from app.negotiation import JSONNotAcceptable, PicturesUnavailable
from app.pool import (
    PoolClosed,
    PoolSaturated,
    WorkerCrashed,
    WorkerMemoryExceeded,
    WorkerTimeout,
)
from app.profile_store import DeviceGone, NameTaken, StoredProfileUnavailable, UnknownRun
from app.schemas.devices import calibrate_hint
from app.service import RequestedItemMissing, RequestFieldError, RequestStateConflict
from app.store import CapExceeded, StoreUnavailable
from app.store.resilient import without_address
from device_profiles import ModelNotServed, UnknownDevice, is_calibratable
from device_profiles.schema import INCONSISTENT_LENGTHS
from perfmodel.errors import (
    ConfiglessRunsRefused,
    ModelInputError,
    PTXSyntaxError,
    UnfittableMeasurements,
)
from solver.errors import (
    CertificateMismatch,
    InfeasibleSearchSpace,
    InvalidSearchSpace,
    SolverTimeout,
    UnknownDeviceName,
)

PROBLEM_JSON = "application/problem+json"


def problem_response(
    status: int,
    title: str,
    detail: str,
    errors: Sequence[dict[str, Any]] = (),
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {
        "type": f"https://kperf.dev/problems/{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "errors": list(errors),
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field_path(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _validation_entry(error: dict[str, Any]) -> dict[str, Any]:
    loc = error.get("loc", ())
    if error.get("type") == "json_invalid":
        # loc is ("body", character offset): name the body and say where parsing failed.
        where = loc[1] if len(loc) > 1 else "?"
        reason = error.get("ctx", {}).get("error", "invalid JSON")
        return {"field": "body", "reason": f"malformed JSON at character {where}: {reason}"}
    return {"field": _field_path(loc), "reason": str(error.get("msg", "invalid"))}


#: validation errors of rules no JSON schema can state, and the problem title they get (a
#: client that validated its body against the OpenAPI document learns the body is
#: well-formed but inconsistent)
_CONTENT_RULE_TITLES = {INCONSISTENT_LENGTHS: "Inconsistent lengths"}


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    raw = exc.errors()
    errors = [_validation_entry(e) for e in raw]
    detail = "; ".join(f"{e['field']}: {e['reason']}" for e in errors) or "invalid request"
    titles = {_CONTENT_RULE_TITLES.get(str(e.get("type")), "Invalid request") for e in raw}
    # a content-rule title only when every error is that rule's
    title = titles.pop() if len(titles) == 1 else "Invalid request"
    return problem_response(422, title, detail, errors)


#: what a framework HTTP error is about: the URL path (404), the method (405), else the body
#: (400: a body FastAPI cannot decode, e.g. invalid UTF-8 or JSON nested too deeply)
_HTTP_ERROR_FIELD = {404: "path", 405: "method"}


def _allowed_methods(request: Request, fallback: str) -> str:
    """Every method the API serves at this path (RFC 9110 §15.5.6: a 405 lists them all).

    Starlette names only the methods of the first route whose path matched, so a path served
    by two routes (GET and POST /devices/{id}/measurements) answered ``Allow: GET``. The
    OpenAPI document lists every operation of the matched path template.
    """
    template = getattr(request.scope.get("route"), "path", None)
    operations = request.app.openapi().get("paths", {}).get(template) if template else None
    if not operations:
        return fallback
    methods = {method.upper() for method in operations}
    if "GET" in methods:
        methods.add("HEAD")  # Starlette answers HEAD wherever it answers GET
    return ", ".join(sorted(methods))


async def _http_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    field = _HTTP_ERROR_FIELD.get(exc.status_code, "body")
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:
        allowed = _allowed_methods(request, headers.get("Allow", ""))
        headers["Allow"] = allowed
        return field_error(
            405, "HTTP error", field, f"method not allowed here; allowed: {allowed}", headers
        )
    return field_error(exc.status_code, "HTTP error", field, str(exc.detail), headers or None)


class BodyTooLarge(StarletteHTTPException):
    """A request body found over ``KPERF_MAX_BODY_BYTES`` while it streamed in (no declared
    Content-Length). An HTTP error, so FastAPI's body reading passes it on unchanged."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(413, body_limit_reason(limit_bytes), headers={"connection": "close"})


def body_limit_reason(limit_bytes: int) -> str:
    return (
        f"request body exceeds the limit of {limit_bytes} bytes; send a smaller body "
        "(operators: KPERF_MAX_BODY_BYTES)"
    )


class BodyDecodeError(StarletteHTTPException):
    """A request body refused before validation (``app/routes/json_body.py``): a media type
    that is not JSON (415), a charset other than UTF-8 (415), bytes that are not UTF-8 (400),
    malformed JSON (422, with line and column) or a key given twice in one object (422, naming
    the key). An HTTP error, so FastAPI's body reading passes it on unchanged."""

    def __init__(self, status: int, field: str, reason: str) -> None:
        super().__init__(status, reason)
        self.field = field
        self.reason = reason


async def _body_decode_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BodyDecodeError)
    title = {415: "Unsupported media type", 400: "Bad request"}.get(
        exc.status_code, "Invalid request"
    )
    return field_error(exc.status_code, title, exc.field, exc.reason)


async def _body_too_large_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BodyTooLarge)
    return field_error(413, "Content too large", "body", str(exc.detail), dict(exc.headers or {}))


async def _unknown_device_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnknownDevice)
    # a device named by the URL (/devices/{device_id}...) is a missing resource; one named in
    # a body, a bad field
    in_path = request.method == "GET" or "device_id" in request.path_params
    return problem_response(
        404 if in_path else 422,
        "Unknown device",
        str(exc),
        [{"field": exc.field, "reason": str(exc)}],
    )


async def _model_not_served_handler(request: Request, exc: Exception) -> JSONResponse:
    """Names each missing figure, and the calibration call for those a run can fit (the same
    listing as GET /devices/{id} under needs_calibration)."""
    assert isinstance(exc, ModelNotServed)
    fit = [m.rsplit(".", 1)[-1] for m in exc.missing if is_calibratable(exc.model, m)]
    detail = str(exc)
    if fit:
        detail += "; calibrate them from measured runs: " + calibrate_hint(
            exc.model, exc.device_id, fit
        )
    if len(fit) < len(exc.missing):
        detail += "; the others no calibration fits: they must be cited in the device profile"
    errors = []
    for m in exc.missing:
        fits = is_calibratable(exc.model, m)
        how = "POST /calibrate fits it" if fits else "no calibration fits it: cite it"
        errors.append(
            {"field": exc.field, "reason": f"missing figure: {m} ({how})", "calibratable": fits}
        )
    return problem_response(422, "Model not served by device", detail, errors)


async def _invalid_space_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidSearchSpace)
    # exc.field is relative to search_space ("tile_m"), or "search_space" for the whole space
    # (a candidate list's errors name their own field, "candidates...")
    # ("solver" when the request's solver cannot search the space it asks for)
    relative = exc.field not in ("search_space", "solver") and not exc.field.startswith(
        ("candidates", "search_space.")
    )
    field = f"search_space.{exc.field}" if relative else exc.field
    return field_error(422, "Invalid search space", field, exc.reason)


async def _infeasible_space_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InfeasibleSearchSpace)
    entry = {"field": exc.field, "reason": exc.reason, "rejected": exc.rejected}
    return problem_response(422, "Infeasible search space", exc.reason, [entry])


async def _unauthorized_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Unauthorized)
    return field_error(
        401, "Unauthorized", "authorization", str(exc), headers={"WWW-Authenticate": "Bearer"}
    )


async def _cap_handler(request: Request, exc: Exception) -> JSONResponse:
    """A store cap refused the whole write (nothing stored): 409 with the true total."""
    assert isinstance(exc, CapExceeded)
    field, what = _CAPPED.get(exc.counter.split(":", 1)[0], ("body", "stored"))
    reason = (
        f"{exc.adding} more would make {exc.total + exc.adding} {what}, above this server's "
        f"cap of {exc.cap}; {exc.total} are stored now (DELETE some to make room)"
    )
    return problem_response(
        409,
        "Cap exceeded",
        f"{field}: {reason}",
        [{"field": field, "reason": reason, "cap": exc.cap, "total": exc.total}],
    )


#: counter kind (app/profile_store.py) -> (field named, what it counts)
_CAPPED = {
    "runs": ("measurements", "measured runs for this device"),
    "profiles": ("device", "calibrated profiles for this tenant"),
    "bytes": ("body", "stored bytes for this tenant"),
}


async def _store_unavailable_handler(request: Request, exc: Exception) -> JSONResponse:
    """The shared store (calibrated profiles, measured runs) cannot be reached: 503, retry
    later, naming the body, or the device field a stored profile was looked up by. The
    backend's text names its address (redis-py: "connecting to redis:6379"): clients get the
    reason without it."""
    if isinstance(exc, StoredProfileUnavailable):
        field, reason = exc.field, exc.reason
    else:
        field, reason = "body", str(exc)
    headers = {"Retry-After": "1"}
    return field_error(503, "Store unavailable", field, without_address(reason), headers=headers)


async def _ptx_syntax_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PTXSyntaxError)
    entry = {"field": "ptx", "reason": exc.message, "line": exc.line, "column": exc.column}
    return problem_response(422, "Invalid PTX", exc.reason, [entry])


async def _pool_saturated_handler(request: Request, exc: Exception) -> JSONResponse:
    # 503 + Retry-After: back-pressure, the client should retry
    assert isinstance(exc, PoolSaturated)
    return field_error(
        503, "Service busy", "body", str(exc), headers={"Retry-After": str(exc.retry_after_s)}
    )


#: errors that name their own field and reason: class -> (status, title)
_FIELD_ERRORS: dict[type[Exception], tuple[int, str]] = {
    ModelInputError: (422, "Invalid request"),
    RequestFieldError: (422, "Invalid request"),
    UnfittableMeasurements: (422, "Unfittable measurements"),  # a type of its own
    DtypeNotServed: (422, "Dtype not served by device"),  # likewise
    ConfiglessRunsRefused: (422, "Configless runs refused"),  # likewise
    # a rule on the server's data (which GPUs it knows by name), as an unknown device is
    UnknownDeviceName: (422, "Unknown device name"),
    RequestStateConflict: (409, "Conflict with the resource's state"),
    RequestedItemMissing: (404, "Not found"),
    UnknownRun: (404, "Not found"),
    DeviceGone: (404, "Unknown device"),
    NameTaken: (409, "Name taken"),
    Forbidden: (403, "Forbidden"),
}


async def _field_handler(request: Request, exc: Exception) -> JSONResponse:
    """Errors that carry their own ``field`` and ``reason``: the answer of the most specific
    class :data:`_FIELD_ERRORS` lists."""
    status, title = next(_FIELD_ERRORS[c] for c in type(exc).__mro__ if c in _FIELD_ERRORS)
    field, reason = getattr(exc, "field"), getattr(exc, "reason")  # noqa: B009
    return field_error(status, title, field, reason)


#: errors whose answer is fixed: class -> (status, title, field named, extra headers)
_FIXED: dict[type[Exception], tuple[int, str, str, dict[str, str] | None]] = {
    SolverTimeout: (504, "Solver timeout", "time_limit_s", None),
    WorkerTimeout: (504, "Solve timed out", "time_limit_s", None),
    PTXTooLarge: (413, "Content too large", "ptx", None),
    # Accept: image/svg+xml on a server installed without the pictures extra
    PicturesUnavailable: (406, "Not acceptable", "accept", None),
    # Accept: image/svg+xml (or any list without JSON) on a JSON-only route
    JSONNotAcceptable: (406, "Not acceptable", "accept", None),
    PoolClosed: (503, "Service unavailable", "body", {"Retry-After": "1"}),
    # the request needs more memory than this server's per-worker cap: a 4xx like the other
    # size limits (a retry would fail the same way)
    WorkerMemoryExceeded: (422, "Memory limit exceeded", "body", None),
    # this request killed its worker twice (it is retried once on a fresh worker, since the
    # first death may not be its fault): a server bug; the pool replaced both workers
    WorkerCrashed: (500, "Worker crashed", "body", None),
    # strict mode only (tests): the scorer and the Z3 encoding disagree, a server bug
    CertificateMismatch: (500, "Certificate mismatch", "body", None),
}


async def _fixed_handler(request: Request, exc: Exception) -> JSONResponse:
    status, title, field, headers = next(v for k, v in _FIXED.items() if isinstance(exc, k))
    return field_error(status, title, field, str(exc), headers=headers)


Handler = Callable[[Request, Exception], Any]

#: domain error class -> handler. Routers may add their own entries via ``register``.
HANDLERS: dict[type[Exception], Handler] = {
    RequestValidationError: _validation_handler,
    StarletteHTTPException: _http_handler,
    BodyTooLarge: _body_too_large_handler,
    BodyDecodeError: _body_decode_handler,
    UnknownDevice: _unknown_device_handler,
    ModelNotServed: _model_not_served_handler,
    InvalidSearchSpace: _invalid_space_handler,
    InfeasibleSearchSpace: _infeasible_space_handler,
    PTXSyntaxError: _ptx_syntax_handler,  # more specific than ModelInputError: line/column
    Unauthorized: _unauthorized_handler,
    CapExceeded: _cap_handler,
    StoreUnavailable: _store_unavailable_handler,
    # service limits (app/pool.py, app/service.py)
    PoolSaturated: _pool_saturated_handler,
    **dict.fromkeys(_FIELD_ERRORS, _field_handler),
    **dict.fromkeys(_FIXED, _fixed_handler),
}


def field_error(
    status: int, title: str, field: str, reason: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """A problem response naming one offending field."""
    return problem_response(
        status, title, f"{field}: {reason}", [{"field": field, "reason": reason}], headers
    )


def install(app: FastAPI) -> None:
    for exc_class, handler in HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
