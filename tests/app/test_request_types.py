"""Strict request types: a JSON boolean or string where a number belongs is a 422 naming the
field, never coerced (``{"m": true, "n": true, "k": true}`` was solved as 1x1x1)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.schemas.base import RequestModel
from app.schemas.batch import OptimizeTilingBatchRequest
from app.schemas.optimize import OptimizeTilingRequest
from app.schemas.predict import PredictKernelRequest
from device_profiles import get_profile
from kperf_client.client import KperfClient
from tests.app.service_helpers import clean_environ, in_app, problem
from tests.paper_cases import paper_case, paper_http_body

__all__ = ["clean_environ"]

INLINE_DEVICE = {
    "sm_count": 84,
    "t_init_us": 3.0,
    "t_epilogue_us": 1.0,
    "load_startup_latency_us": 0.5,
    "load_throughput_elements_per_us": 400000.0,
    "compute_throughput_macs_per_us": 40000000.0,
}


def predict_body(**changes: Any) -> dict[str, Any]:
    body = paper_http_body(paper_case("hotspot-gtx-760"))
    body.update(changes)
    return body


def inline_profile(**hardware_value: Any) -> dict[str, Any]:
    profile = get_profile("gtx-760").model_dump(mode="json")
    for name, value in hardware_value.items():
        profile["hardware"][name]["value"] = value
    return profile


#: (route, body, the field the 422 must name); one case per kind of coercion pydantic's lax
#: mode would have made
CASES: list[tuple[str, dict[str, Any], str]] = [
    # the examples: booleans and numeric strings for integers
    ("/optimize-tiling", {**problem(), "m": True, "n": True, "k": True}, "m"),
    ("/optimize-tiling", problem(m="1024"), "m"),
    # an integer field refuses a float, even an integral one
    ("/optimize-tiling", problem(n=1024.0), "n"),
    ("/optimize-tiling", problem(top_k=False), "top_k"),
    # floats refuse booleans and strings (an integer is still a float)
    ("/optimize-tiling", problem(time_limit_s=True), "time_limit_s"),
    ("/optimize-tiling", problem(time_limit_s="2.5"), "time_limit_s"),
    # a boolean field refuses 1 and "true"
    ("/optimize-tiling", problem(include_timeline=1), "include_timeline"),
    ("/optimize-tiling", problem(include_timeline="true"), "include_timeline"),
    # nested models inherit the strict base
    (
        "/optimize-tiling",
        problem(search_space={"tile_m": {"min": "16", "max": 64}}),
        "search_space.tile_m.*.min",  # the union branch's name sits in between
    ),
    (
        "/optimize-tiling",
        problem(search_space={"enforce_shared_memory": "false"}),
        "search_space.enforce_shared_memory",
    ),
    (
        "/optimize-tiling",
        {"m": 64, "n": 64, "k": 64, "device_params": {**INLINE_DEVICE, "sm_count": "84"}},
        "device_params.sm_count",
    ),
    ("/optimize-tiling/batch", {"problems": [problem(), problem(k=True)]}, "problems.1.k"),
    ("/predict-kernel", predict_body(launch={"grid": [True, 1, 1], "block": [64, 1, 1]}), ""),
    ("/predict-kernel", predict_body(clock_mhz="1000"), "clock_mhz"),
    (
        "/predict-kernel",
        predict_body(resources={"registers_per_thread": "32", "shared_bytes_per_block": 0}),
        "resources.registers_per_thread",
    ),
    ("/predict-kernel", predict_body(memory_transactions={"42": True}), "memory_transactions.42"),
    ("/predict-kernel", predict_body(loop_trip_counts={"$L1": "10"}), "loop_trip_counts.$L1"),
    # the inline device profile is held to the same types as the rest of the request
    (
        "/predict-kernel",
        {**predict_body(device=None), "device_params": inline_profile(sm_count="6")},
        "device_params",
    ),
]


def test_numbers_of_the_wrong_json_type_are_422_naming_the_field() -> None:
    async def scenario(client: KperfClient) -> list[tuple[int, list[str], str]]:
        results = []
        for path, body, _ in CASES:
            response = await client.http.post(path, json=body)
            fields = [e["field"] for e in response.json().get("errors", [])]
            results.append((response.status_code, fields, response.text))
        return results

    results = in_app(scenario)
    for (path, _, field), (status, fields, text) in zip(CASES, results, strict=True):
        assert status == 422, (path, field, text)
        if field.endswith(".min"):
            head, _, tail = field.partition(".*")
            assert any(f.startswith(head) and f.endswith(tail) for f in fields), (path, fields)
        elif field:
            assert field in fields, (path, field, fields)
        else:
            assert fields and fields[0].startswith("launch.grid"), (path, fields)


def test_what_strict_mode_still_accepts() -> None:
    async def scenario(client: KperfClient) -> list[int]:
        bodies = [
            ("/optimize-tiling", problem(time_limit_s=5)),  # an integer where a float belongs
            ("/optimize-tiling", {"m": 64, "n": 64, "k": 64, "device_params": INLINE_DEVICE}),
            # JSON object keys are strings: the line numbers of memory_transactions stay keys
            ("/predict-kernel", predict_body()),
            ("/predict-kernel", {**predict_body(device=None), "device_params": inline_profile()}),
        ]
        return [(await client.http.post(path, json=body)).status_code for path, body in bodies]

    assert in_app(scenario) == [200, 200, 200, 200]


@pytest.mark.parametrize(
    "model", [OptimizeTilingRequest, OptimizeTilingBatchRequest, PredictKernelRequest]
)
def test_every_request_schema_derives_from_the_strict_base(model: type[RequestModel]) -> None:
    assert issubclass(model, RequestModel)
    assert model.model_config.get("strict") is True
    assert model.model_config.get("extra") == "forbid"


def test_the_worker_revalidates_a_dumped_request_in_strict_mode() -> None:
    # jobs receive request.model_dump(mode="json") and validate it again in the worker
    body = predict_body()
    request = PredictKernelRequest.model_validate(copy.deepcopy(body))
    again = PredictKernelRequest.model_validate(request.model_dump(mode="json"))
    assert again == request
    optimize = OptimizeTilingRequest.model_validate(
        problem(search_space={"tile_m": {"min": 16, "max": 64, "multiple_of": 16}})
    )
    assert OptimizeTilingRequest.model_validate(optimize.model_dump(mode="json")) == optimize
