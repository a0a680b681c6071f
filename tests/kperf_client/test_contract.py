"""The client's answer views against the server's OpenAPI document: drift fails here.

kperf_client.models declares the fields the user side reads, independently of the server's
schemas. For every field of every view this checks, against the schema the server publishes
for the route the client reads it from: the field exists (by its JSON name), its JSON type is
one the client accepts (every branch of a union, null included), and a field the client
requires is one the server always sends.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

import kperf_client.models as views
from app.main import create_app
from app.settings import Settings
from kperf_client.models import Answer

#: (method, path) the client reads each view from (kperf_client.client.KperfClient)
ROUTES: list[tuple[str, str, type[Answer]]] = [
    ("get", "/devices", views.DeviceList),
    ("get", "/devices/{device_id}", views.DeviceDetail),
    ("post", "/optimize-tiling", views.OptimizeTilingResponse),
    ("post", "/optimize-tiling/batch", views.OptimizeTilingBatchResponse),
    ("post", "/calibrate", views.CalibrateResponse),
    ("post", "/devices/{device_id}/recalibrate", views.CalibrateResponse),
    ("post", "/devices/{device_id}/measurements", views.MeasurementsAdded),
    ("get", "/devices/{device_id}/measurements", views.MeasurementRecord),
    ("post", "/tuning-table", views.TuningTableResponse),
]

#: JSON types each Python type of a view accepts (pydantic reads a JSON integer as a float)
JSON_TYPES: dict[Any, set[str]] = {
    int: {"integer"},
    float: {"number", "integer"},
    str: {"string"},
    bool: {"boolean"},
}


class Contract:
    """Walks a view and a JSON schema side by side, collecting every disagreement."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.visited: set[type[BaseModel]] = set()

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = self.document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        if len(schema.get("allOf", [])) == 1:
            return self.resolve(schema["allOf"][0])
        return schema

    def branches(self, schema: dict[str, Any]) -> list[dict[str, Any]]:
        """The alternative shapes a value may take (anyOf / oneOf flattened)."""
        schema = self.resolve(schema)
        alternatives = schema.get("anyOf") or schema.get("oneOf")
        # beside an object's own properties, anyOf only constrains them (which may be null
        # together, say): the shape is the object's
        if alternatives is None or "properties" in schema:
            return [schema]
        return [b for alternative in alternatives for b in self.branches(alternative)]

    def check(self, annotation: Any, schema: dict[str, Any], where: str) -> list[str]:
        union = get_origin(annotation) in (Union, types.UnionType)
        options = [a for a in get_args(annotation) if a is not type(None)] if union else []
        accepts_null = union and len(options) < len(get_args(annotation))
        options = options or [annotation]
        problems = []
        for branch in self.branches(schema):
            if branch.get("type") == "null":
                if not accepts_null:
                    problems.append(f"{where}: the server may send null, the client refuses it")
                continue
            # whatever the server may send, one of the client's types must read it
            tries: list[list[str]] = [self.check_one(o, branch, where) for o in options]
            if all(tries):
                fewest: list[str] = min(tries, key=len)
                problems.extend(fewest)
        return problems

    def check_one(self, annotation: Any, schema: dict[str, Any], where: str) -> list[str]:
        origin, args = get_origin(annotation), get_args(annotation)
        kind = schema.get("type")
        if annotation is Any:
            return []
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            if kind != "object" or "properties" not in schema:
                return [f"{where}: the server sends {kind or 'anything'}, not an object"]
            return self.check_model(annotation, schema, where)
        if origin is list:
            if kind != "array":
                return [f"{where}: the server sends {kind or 'anything'}, not an array"]
            return self.check(args[0], schema.get("items", {}), f"{where}[]")
        if origin is dict:
            if kind != "object":
                return [f"{where}: the server sends {kind or 'anything'}, not an object"]
            values = [(f"{where}.{k}", s) for k, s in schema.get("properties", {}).items()]
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                values.append((f"{where}.*", extra))
            if not values:
                return [f"{where}: the server does not say what the object's values are"]
            return [p for at, value in values for p in self.check(args[1], value, at)]
        wanted = JSON_TYPES.get(annotation)
        if wanted is None:
            return [f"{where}: the contract cannot check the client's type {annotation!r}"]
        if kind not in wanted:
            return [f"{where}: the server sends {kind or 'anything'}, the client reads {wanted}"]
        return []

    def check_model(self, model: type[BaseModel], schema: dict[str, Any], where: str) -> list[str]:
        self.visited.add(model)
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        problems = []
        for name, field in model.model_fields.items():
            key = field.alias or name
            at = f"{where}.{key}"
            if key not in properties:
                problems.append(f"{at}: not in the server's schema")
                continue
            if field.is_required() and key not in required:
                problems.append(f"{at}: the client requires it, the server may leave it out")
            problems += self.check(field.annotation, properties[key], at)
        return problems


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    openapi: dict[str, Any] = create_app(Settings(workers=1, cache_path=None)).openapi()
    return openapi


def response_schema(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    schema: dict[str, Any] = document["paths"][path][method]["responses"]["200"]["content"][
        "application/json"
    ]["schema"]
    return schema


@pytest.mark.parametrize(("method", "path", "view"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_client_view_matches_the_servers_answer(
    document: dict[str, Any], method: str, path: str, view: type[Answer]
) -> None:
    contract = Contract(document)
    schema = response_schema(document, method, path)
    assert contract.check(view, schema, view.__name__) == []


def test_every_view_is_checked(document: dict[str, Any]) -> None:
    """A view the routes above never reach would escape the contract."""
    contract = Contract(document)
    for method, path, view in ROUTES:
        contract.check(view, response_schema(document, method, path), view.__name__)
    declared = {
        cls
        for _, cls in inspect.getmembers(views, inspect.isclass)
        if issubclass(cls, Answer) and cls is not Answer and cls.__module__ == views.__name__
    }
    assert sorted(c.__name__ for c in declared - contract.visited) == []


class _Drifted(Answer):
    renamed: int
    count: int
    label: str
    note: str
    figures: dict[str, float]
    fine: float | None = None


def test_the_contract_catches_drift() -> None:
    """The checker itself: each kind of drift is reported, naming the field."""
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": "number"},  # the client reads an integer
            "label": {"type": "string"},  # not required: the client requires it
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},  # null refused
            "figures": {"type": "object", "properties": {"a": {"type": "string"}}},
            "fine": {"type": "integer"},
        },
        "required": ["count", "note", "figures"],
    }
    problems = Contract({"components": {"schemas": {}}}).check(_Drifted, schema, "X")
    assert [p.split(":")[0] for p in problems] == [
        "X.renamed",
        "X.count",
        "X.label",
        "X.note",
        "X.figures.a",
    ]
