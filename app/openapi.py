"""OpenAPI document: every operation lists the problem+json error answers it can give.

FastAPI documents only 200 and its own 422 shape; the service answers errors as RFC 9457
problem+json (``app/errors.py``), plus 413/503/504 from its limits. Documenting them keeps the
schema honest, which the schema fuzzing test (tests/app/test_fuzz_schema.py) relies on.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from app.errors import PROBLEM_JSON


class FieldProblem(BaseModel):
    field: str = Field(description="dotted path of the offending input, or 'body'")
    reason: str = Field(description="what is wrong and how to fix it")


class Problem(BaseModel):
    """RFC 9457 problem details with the offending fields."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldProblem]


_ERRORS_ANY: dict[str, str] = {
    "404": "unknown resource (e.g. device id)",
    "422": "invalid request: the errors name each offending field",
    "500": "a bug: report the X-Request-ID",
}
_ERRORS_WITH_BODY: dict[str, str] = {
    "400": "body that cannot be decoded (not UTF-8, or JSON nested too deeply)",
    "413": "request body larger than the server's limit",
}
_ERRORS_SOLVING: dict[str, str] = {
    "503": "all workers busy and the queue full (see Retry-After), or the pool is starting",
    "504": "no answer within time_limit_s + 20% + 100 ms",
}
#: what a route that looks a device up adds (app/profile_store.py, StoredProfileUnavailable)
_STORE_DOWN = (
    "the device named is no shipped profile and the shared store of calibrated profiles and "
    "names is unavailable: retry (see Retry-After), or name a shipped profile"
)
_SOLVING_PATHS = (
    "/optimize-tiling",
    "/optimize-tiling/batch",
    "/predict-kernel",
    "/calibrate",
    "/devices/{device_id}/measurements",
    "/devices/{device_id}/recalibrate",
    "/tuning-table",
)


#: operations no token is ever asked for
_OPEN_PATHS = ("/healthz", "/readyz", "/metrics")
#: operations that store or delete (a write token), as (method, path); the others only ask
_WRITES = {
    ("post", "/calibrate"),
    ("post", "/devices/{device_id}/measurements"),
    ("post", "/devices/{device_id}/recalibrate"),
    ("delete", "/devices/{device_id}"),
    ("delete", "/devices/{device_id}/measurements/batches/{batch}"),
    ("delete", "/devices/{device_id}/measurements/runs/{digest}"),
}
_UNAUTHORIZED = "no token, or one this server does not know, where the server requires tokens"


def _state_security(document: dict[str, Any], settings: Any) -> None:
    """With a tokens file the document says which operations need a bearer token (writes
    always; reads under KPERF_AUTH_READS), so a client, and schema fuzzing, see what the
    server enforces."""
    if settings is None or settings.tokens_file is None:
        return
    document["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "a token of the server's KPERF_TOKENS_FILE (README, 'Run it for a "
            "team')",
        }
    }
    for path, operations in document.get("paths", {}).items():
        if path in _OPEN_PATHS:
            continue
        for method, operation in operations.items():
            required = (method, path) in _WRITES or settings.auth_reads
            # an empty requirement: the operation also answers without a token
            operation["security"] = [{"bearer": []}] if required else [{}, {"bearer": []}]


def _state_configured_limits(schemas: dict[str, Any], settings: Any) -> None:
    """The schema states this server's configured limits (KPERF_MAX_BATCH_ITEMS,
    KPERF_MAX_TIME_LIMIT_S), not the ceilings the settings may be raised to: an input the
    document allows is then one the server accepts (schemathesis found them apart)."""
    if settings is None:
        return
    batch = schemas.get("OptimizeTilingBatchRequest", {}).get("properties", {}).get("problems")
    if batch is not None:
        batch["maxItems"] = settings.max_batch_items
    for schema in schemas.values():
        limit = schema.get("properties", {}).get("time_limit_s")
        if limit is not None and "maximum" in limit:
            limit["maximum"] = settings.max_time_limit_s


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        problem_schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in problem_schema.pop("$defs", {}).items():
            schemas[name] = definition
        schemas["Problem"] = problem_schema
        problem_ref = {"$ref": "#/components/schemas/Problem"}
        for path, operations in document.get("paths", {}).items():
            for method, operation in operations.items():
                extra = dict(_ERRORS_ANY)
                if method in ("post", "put", "patch"):
                    extra.update(_ERRORS_WITH_BODY)
                if path in _SOLVING_PATHS or path == "/readyz":
                    extra.update(_ERRORS_SOLVING if path != "/readyz" else {})
                if path not in _OPEN_PATHS:
                    extra.setdefault("401", _UNAUTHORIZED)
                if path in _SOLVING_PATHS or path.startswith("/devices/{device_id}"):
                    busy = extra.get("503")
                    extra["503"] = _STORE_DOWN if busy is None else f"{busy}; or {_STORE_DOWN}"
                responses = operation.setdefault("responses", {})
                # error answers a route declares itself (e.g. 409) are problem+json too
                for code, declared in responses.items():
                    if code[0] in "45" and "content" not in declared:
                        extra.setdefault(code, declared.get("description", "error"))
                for code, description in extra.items():
                    existing = responses.get(code, {})
                    if code == "503" and "content" in existing:
                        continue  # /readyz documents its own 503 body
                    responses[code] = {
                        "description": existing.get("description", description),
                        "content": {PROBLEM_JSON: {"schema": problem_ref}},
                    }
        _state_configured_limits(schemas, getattr(app.state, "settings", None))
        _state_security(document, getattr(app.state, "settings", None))
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]
