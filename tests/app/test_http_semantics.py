"""HTTP semantics an outside probe found broken: HEAD on GET routes, a body without a
Content-Type, encoded slashes in paths, integers past the parser's limit, and batch items
whose time limit the schema forbids."""

from __future__ import annotations

import json
import re
import sys

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from app.main import create_app
from tests.app.service_helpers import clean_environ, live_server, metric_value, problem

__all__ = ["clean_environ", "live_server"]

#: a value for each path parameter of a GET route that names something that exists
PATH_SAMPLES = {"device_id": "h100", "name": "favicon.png"}


def _get_paths() -> list[str]:
    """Every GET route of the app, its parameters filled in from :data:`PATH_SAMPLES`."""
    paths = []
    for context in iter_route_contexts(create_app().routes):
        if "GET" not in (getattr(context, "methods", None) or ()) or context.path is None:
            continue
        params = re.findall(r"{(\w+)}", context.path)
        missing = [p for p in params if p not in PATH_SAMPLES]
        assert not missing, f"{context.path}: add a sample for {missing} to PATH_SAMPLES"
        paths.append(re.sub(r"{(\w+)}", lambda m: PATH_SAMPLES[m.group(1)], context.path))
    return paths


def test_head_answers_every_get_route(live_server: str) -> None:
    paths = _get_paths()
    assert {"/healthz", "/readyz", "/", "/docs", "/devices", "/devices/h100"} <= set(paths)
    with httpx.Client(base_url=live_server, timeout=30) as client:
        for path in paths:
            got = client.get(path)
            head = client.head(path)
            assert got.status_code == 200, (path, got.text[:300])
            assert head.status_code == 200, (path, head.status_code, head.headers)
            assert head.content == b""
            assert head.headers["content-type"] == got.headers["content-type"], path
            if path not in ("/readyz", "/metrics"):  # answers that change between two calls
                assert head.headers["content-length"] == got.headers["content-length"], path
        # a POST-only route is still no HEAD route, and says what it serves
        refused = client.head("/optimize-tiling")
        assert refused.status_code == 405
        assert refused.headers["allow"] == "POST"
        metrics = client.get("/metrics").text
    assert metric_value(metrics, "kperf_http_requests_total", method="HEAD", route="/healthz") >= 1


def test_body_without_content_type_is_json(live_server: str) -> None:
    body = json.dumps(problem()).encode()
    # httpx adds no Content-Type to raw bytes content
    response = httpx.post(f"{live_server}/optimize-tiling", content=body, timeout=60)
    assert "content-type" not in response.request.headers
    assert response.status_code == 200, response.text
    assert response.json()["best"]["tile_m"] > 0


@pytest.mark.parametrize(
    "path",
    [
        "/devices/h100%2Fmeasurements",
        "/devices/h100%2fmeasurements",
        "/devices/h100%2F",
        "/healthz%2F",
    ],
)
def test_encoded_slash_is_not_found(live_server: str, path: str) -> None:
    response = httpx.get(f"{live_server}{path}", timeout=30)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["errors"][0]["field"] == "path"
    # the same id unencoded is served: the guard refuses only the encoded slash
    assert httpx.get(f"{live_server}/devices/h100/measurements", timeout=30).status_code == 200


def test_integer_past_the_parser_limit_is_422(live_server: str) -> None:
    digits = sys.get_int_max_str_digits() + 700
    body = '{"m": ' + "7" * digits + ', "n": 1024, "k": 1024, "device": "rtx-a6000"}'
    response = httpx.post(
        f"{live_server}/optimize-tiling",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "body"
    assert "digits" in response.json()["errors"][0]["reason"]


def test_batch_item_time_limit_above_the_schema_maximum_is_422(live_server: str) -> None:
    schema = httpx.get(f"{live_server}/openapi.json", timeout=30).json()
    item = schema["components"]["schemas"]["OptimizeTilingRequest"]["properties"]["time_limit_s"]
    over = item["maximum"] + 1
    body = {"problems": [problem(), problem(time_limit_s=over)]}
    response = httpx.post(f"{live_server}/optimize-tiling/batch", json=body, timeout=60)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "problems.1.time_limit_s"
    # at the maximum the item is solved
    body = {"problems": [problem(time_limit_s=item["maximum"])]}
    response = httpx.post(f"{live_server}/optimize-tiling/batch", json=body, timeout=60)
    assert response.status_code == 200
    assert response.json()["items"][0]["status"] == "ok"


def test_a_dtype_the_device_lacks_is_its_own_problem_type(live_server: str) -> None:
    """Schema-valid, refused by the profile's content: a type of its own (README, API notes),
    not the generic invalid-request a schema violation gets."""
    response = httpx.post(f"{live_server}/optimize-tiling", json=problem(dtype="fp8"), timeout=60)
    assert response.status_code == 422, response.text
    assert response.json()["type"].endswith("/dtype-not-served-by-device")
    assert response.json()["errors"][0]["field"] == "dtype"
