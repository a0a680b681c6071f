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

from app.pool import (
    PoolClosed,
    PoolSaturated,
    WorkerCrashed,
    WorkerMemoryExceeded,
    WorkerTimeout,
)
from app.routes.predict import PTXTooLarge
from app.service import RequestFieldError
from device_profiles import ModelNotServed, UnknownDevice
from perfmodel.errors import ModelInputError, PTXSyntaxError
from solver.errors import InfeasibleSearchSpace, InvalidSearchSpace, SolverTimeout

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


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [_validation_entry(e) for e in exc.errors()]
    detail = "; ".join(f"{e['field']}: {e['reason']}" for e in errors) or "invalid request"
    return problem_response(422, "Invalid request", detail, errors)


async def _http_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return problem_response(
        exc.status_code, "HTTP error", str(exc.detail), headers=getattr(exc, "headers", None)
    )


async def _unknown_device_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnknownDevice)
    return problem_response(
        404 if request.method == "GET" else 422,
        "Unknown device",
        str(exc),
        [{"field": "device", "reason": str(exc)}],
    )


async def _model_not_served_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ModelNotServed)
    return problem_response(
        422,
        "Model not served by device",
        str(exc),
        [{"field": "device", "reason": f"missing figure: {m}"} for m in exc.missing],
    )


async def _invalid_space_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidSearchSpace)
    # exc.field is relative to search_space ("tile_m"), or "search_space" for the whole space
    field = exc.field if exc.field == "search_space" else f"search_space.{exc.field}"
    return field_error(422, "Invalid search space", field, exc.reason)


async def _infeasible_space_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InfeasibleSearchSpace)
    return problem_response(
        422,
        "Infeasible search space",
        exc.reason,
        [{"field": "search_space", "reason": exc.reason, "rejected": exc.rejected}],
    )


async def _solver_timeout_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SolverTimeout)
    return field_error(504, "Solver timeout", "time_limit_s", str(exc))


async def _model_input_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ModelInputError)
    return field_error(422, "Invalid model input", exc.field, exc.reason)


async def _ptx_syntax_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PTXSyntaxError)
    return problem_response(
        422,
        "Invalid PTX",
        exc.reason,
        [{"field": "ptx", "reason": exc.message, "line": exc.line, "column": exc.column}],
    )


async def _ptx_too_large_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PTXTooLarge)
    return field_error(413, "Content too large", "ptx", str(exc))


async def _pool_saturated_handler(request: Request, exc: Exception) -> JSONResponse:
    # 503 + Retry-After: back-pressure, the client should retry (issue 4, item 2)
    assert isinstance(exc, PoolSaturated)
    return problem_response(
        503,
        "Service busy",
        str(exc),
        [{"field": "body", "reason": str(exc)}],
        headers={"Retry-After": str(exc.retry_after_s)},
    )


async def _pool_closed_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PoolClosed)
    return problem_response(
        503,
        "Service unavailable",
        str(exc),
        [{"field": "body", "reason": str(exc)}],
        headers={"Retry-After": "1"},
    )


async def _worker_timeout_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, WorkerTimeout)
    return problem_response(
        504, "Solve timed out", str(exc), [{"field": "time_limit_s", "reason": str(exc)}]
    )


async def _worker_memory_handler(request: Request, exc: Exception) -> JSONResponse:
    # the request asked for more than this server's per-worker memory allows: a 4xx naming
    # the body, like the other size limits (a retry would fail the same way)
    assert isinstance(exc, WorkerMemoryExceeded)
    return problem_response(
        422, "Memory limit exceeded", str(exc), [{"field": "body", "reason": str(exc)}]
    )


async def _worker_crashed_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, WorkerCrashed)
    return problem_response(
        500, "Worker crashed", str(exc), [{"field": "body", "reason": str(exc)}]
    )


async def _request_field_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestFieldError)
    return field_error(422, "Invalid request", exc.field, exc.reason)


Handler = Callable[[Request, Exception], Any]

#: domain error class -> handler. Routers may add their own entries via ``register``.
HANDLERS: dict[type[Exception], Handler] = {
    RequestValidationError: _validation_handler,
    StarletteHTTPException: _http_handler,
    UnknownDevice: _unknown_device_handler,
    ModelNotServed: _model_not_served_handler,
    InvalidSearchSpace: _invalid_space_handler,
    InfeasibleSearchSpace: _infeasible_space_handler,
    SolverTimeout: _solver_timeout_handler,
    ModelInputError: _model_input_handler,
    PTXSyntaxError: _ptx_syntax_handler,  # more specific than ModelInputError: line/column
    PTXTooLarge: _ptx_too_large_handler,
    # service limits (app/pool.py, app/service.py)
    PoolSaturated: _pool_saturated_handler,
    PoolClosed: _pool_closed_handler,
    WorkerTimeout: _worker_timeout_handler,
    WorkerMemoryExceeded: _worker_memory_handler,
    WorkerCrashed: _worker_crashed_handler,
    RequestFieldError: _request_field_handler,
}


def field_error(status: int, title: str, field: str, reason: str) -> JSONResponse:
    """A problem response naming one offending field."""
    return problem_response(
        status, title, f"{field}: {reason}", [{"field": field, "reason": reason}]
    )


def install(app: FastAPI) -> None:
    for exc_class, handler in HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
