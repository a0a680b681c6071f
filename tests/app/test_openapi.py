"""The OpenAPI document: documented error answers and units on every response number."""

from __future__ import annotations

from typing import Any

import pytest

from app.main import create_app
from app.settings import Settings

#: a name ending in one of these carries its unit (the developers' rule: units in the name or
#: in the schema description)
UNIT_SUFFIXES = ("_us", "_ms", "_s", "_cycles", "_bytes", "_mhz")
RESPONSES = (
    "OptimizeTilingResponse",
    "PredictKernelResponse",
    "OptimizeTilingBatchResponse",
    "CalibrateResponse",
    "MeasurementsAdded",
    "MeasurementRecord",
)


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    doc: dict[str, Any] = create_app(Settings(workers=1, cache_path=None)).openapi()
    return doc


def _reachable(schemas: dict[str, Any], name: str, seen: set[str]) -> None:
    if name in seen:
        return
    seen.add(name)
    text = repr(schemas[name])
    for other in schemas:
        if f"'#/components/schemas/{other}'" in text:
            _reachable(schemas, other, seen)


def test_every_numeric_response_field_states_its_unit(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    seen: set[str] = set()
    for name in RESPONSES:
        _reachable(schemas, name, seen)
    undocumented = []
    for name in sorted(seen):
        for field, spec in schemas[name].get("properties", {}).items():
            numeric = "'integer'" in repr(spec) or "'number'" in repr(spec)
            described = "description" in spec or schemas[name].get("description")
            if numeric and not described and not field.lower().endswith(UNIT_SUFFIXES):
                undocumented.append(f"{name}.{field}")
    assert undocumented == []


@pytest.mark.parametrize("path", ["/optimize-tiling", "/optimize-tiling/batch", "/predict-kernel"])
def test_undecodable_body_answer_is_documented(document: dict[str, Any], path: str) -> None:
    # a body FastAPI cannot decode is answered 400 problem+json (tests/app/test_optimize_api.py)
    responses = document["paths"][path]["post"]["responses"]
    assert "application/problem+json" in responses["400"]["content"]


@pytest.mark.parametrize("path", ["/calibrate", "/devices/{device_id}/recalibrate"])
def test_calibration_answers_are_documented(document: dict[str, Any], path: str) -> None:
    # a taken name is 409; the fit runs in a worker (503 when busy, 504 past its time limit)
    responses = document["paths"][path]["post"]["responses"]
    for code in ("409", "422", "503", "504"):
        assert "application/problem+json" in responses[code]["content"], code
