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

from device_profiles import UnknownDevice

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


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"field": _field_path(e.get("loc", ())), "reason": str(e.get("msg", "invalid"))}
        for e in exc.errors()
    ]
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


Handler = Callable[[Request, Exception], Any]

#: domain error class -> handler. Routers may add their own entries via ``register``.
HANDLERS: dict[type[Exception], Handler] = {
    RequestValidationError: _validation_handler,
    StarletteHTTPException: _http_handler,
    UnknownDevice: _unknown_device_handler,
}


def field_error(status: int, title: str, field: str, reason: str) -> JSONResponse:
    """A problem response naming one offending field."""
    return problem_response(status, title, f"{field}: {reason}", [{"field": field, "reason": reason}])


def install(app: FastAPI) -> None:
    for exc_class, handler in HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
