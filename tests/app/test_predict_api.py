"""POST /predict-kernel over HTTP: the published example end to end, and every bad input
answered 4xx problem+json naming the problem (never a 500)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.convert.predict import MAX_PTX_BYTES, PTXTooLarge, to_core
from app.main import create_app
from app.schemas.predict import PredictKernelRequest
from app.settings import Settings

PAPER = Path(__file__).resolve().parents[1] / "fixtures" / "ptx" / "paper"
KNN = (PAPER / "knn.ptx").read_text()
MM = (PAPER / "mm.ptx").read_text()
PROBLEM = "application/problem+json"


def _settings(**over: Any) -> Settings:
    return Settings(workers=1, cache_path=None, cache_memory_items=0, **over)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(_settings())) as test_client:
        yield test_client


def knn_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ptx": KNN,
        "device": "gtx-760",
        "launch": {"grid": [168, 1, 1], "block": [256, 1, 1]},
        "resources": {"registers_per_thread": 9, "shared_bytes_per_block": 0},
        "memory_transactions": {"42": 2, "44": 2, "49": 2},
    }
    body.update(over)
    return body


def test_knn_on_gtx_760_matches_the_published_prediction(client: TestClient) -> None:
    r = client.post("/predict-kernel", json=knn_body(clock_mhz=1000))
    assert r.status_code == 200, r.text
    body = r.json()
    # many-bsp-supplementary.txt §3: kernel_exec_cycle = 6802, rho = 8, tau = 2
    assert body["predicted_cycles"] == pytest.approx(6802, rel=0.05)
    assert (body["rho"], body["tau"], body["equation"]) == (8, 2, "24")
    assert body["predicted_time_us"] == pytest.approx(body["predicted_cycles"] / 1000)
    assert [s["comm_cycles"] for s in body["level1_supersteps"]] == [0, 1528]
    lines = KNN.splitlines()
    assert all(row["opcode"] in lines[row["line"] - 1] for row in body["instructions"])
    names = "parallel_comp block_bar_ovh block_comm COMP warps_need nonoverlapped"
    names += " block_exec_cycle comp novlp rho K tau mu"
    for name in names.split():
        assert name in body


def test_loop_trip_counts_scale_the_loop_superstep(client: TestClient) -> None:
    body = {
        "ptx": MM,
        "device": "940mx",
        "launch": {"grid": [20, 10, 1], "block": [32, 32, 1]},
        "resources": {"registers_per_thread": 22, "shared_bytes_per_block": 2048},
    }
    ten = client.post("/predict-kernel", json={**body, "loop_trip_counts": {"BB1_2": 10}})
    twenty = client.post("/predict-kernel", json={**body, "loop_trip_counts": {"BB1_2": 20}})
    assert ten.status_code == twenty.status_code == 200
    loop10 = ten.json()["level1_supersteps"][1]
    loop20 = twenty.json()["level1_supersteps"][1]
    assert (loop10["iterations"], loop20["iterations"]) == (10, 20)
    extra = twenty.json()["parallel_comp"] - ten.json()["parallel_comp"]
    assert extra == pytest.approx(10 * loop10["comp_cycles"])


def _problem(r: Any, status: int, field: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert any(e["field"] == field for e in body["errors"]), body
    return body


def test_not_ptx_is_422_with_line_and_column(client: TestClient) -> None:
    r = client.post("/predict-kernel", json=knn_body(ptx="just some text\n"))
    err = _problem(r, 422, "ptx")["errors"][0]
    assert (err["line"], err["column"]) == (1, 1)


def test_syntax_error_deep_in_the_module_points_at_it(client: TestClient) -> None:
    lines = KNN.splitlines()
    at = next(i for i, t in enumerate(lines) if "sqrt.rn.f32" in t)
    lines[at] = "\tsqrt.rn.f32 %f9, %f8, ;"
    err = _problem(client.post("/predict-kernel", json=knn_body(ptx="\n".join(lines))), 422, "ptx")
    assert err["errors"][0]["line"] == at + 1


def test_unknown_entry_is_422(client: TestClient) -> None:
    body = _problem(client.post("/predict-kernel", json=knn_body(kernel="nope")), 422, "kernel")
    assert "euclid" in body["detail"]


def test_ptx_over_the_configured_limit_is_413() -> None:
    limit = len(KNN.encode()) - 1
    with TestClient(create_app(_settings(max_ptx_bytes=limit))) as small:
        body = _problem(small.post("/predict-kernel", json=knn_body()), 413, "ptx")
    assert str(limit) in body["detail"]


def test_core_default_ptx_limit() -> None:
    request = PredictKernelRequest.model_validate(knn_body(ptx="x" * (MAX_PTX_BYTES + 1)))
    with pytest.raises(PTXTooLarge):
        to_core(request)


def test_block_larger_than_the_device_allows_is_422(client: TestClient) -> None:
    launch = {"grid": [1, 1, 1], "block": [32, 32, 2]}
    _problem(client.post("/predict-kernel", json=knn_body(launch=launch)), 422, "launch.block")


@pytest.mark.parametrize("grid", [[0, 1, 1], [1, 0, 1], [4, 4, 0]])
def test_empty_grid_is_422(client: TestClient, grid: list[int]) -> None:
    launch = {"grid": grid, "block": [256, 1, 1]}
    axis = grid.index(0)
    _problem(
        client.post("/predict-kernel", json=knn_body(launch=launch)), 422, f"launch.grid.{axis}"
    )


def test_negative_trip_count_is_422(client: TestClient) -> None:
    r = client.post("/predict-kernel", json={**knn_body(ptx=MM), "loop_trip_counts": {"BB1_2": -3}})
    _problem(r, 422, "loop_trip_counts.BB1_2")


def test_every_shipped_profile_predicts_a_paper_kernel_with_estimated_provenance(
    client: TestClient,
) -> None:
    """A paper kernel answers on every shipped profile out of the box; the report's
    own devices say published, the rest estimated."""
    for device in client.get("/devices").json()["devices"]:
        r = client.post("/predict-kernel", json=knn_body(device=device["id"]))
        assert r.status_code == 200, (device["id"], r.text)
        answer = r.json()
        assert answer["predicted_cycles"] > 0
        kind = answer["profile_provenance"]["kind"]
        assert kind == ("published" if device["id"] in ("gtx-760", "940mx") else "estimated")
        low, high = answer["predicted_cycles_interval"]
        assert low <= answer["predicted_cycles"] <= high


def test_unknown_device_is_422(client: TestClient) -> None:
    _problem(client.post("/predict-kernel", json=knn_body(device="gtx-9999")), 422, "device")


def test_registers_required_without_ptxas(monkeypatch: pytest.MonkeyPatch) -> None:
    # workers inherit the environment: with an empty PATH, ptxas is absent for them too
    monkeypatch.setenv("PATH", "/nonexistent")
    with TestClient(create_app(_settings())) as no_ptxas:
        r = no_ptxas.post("/predict-kernel", json=knn_body(resources={}))
    _problem(r, 422, "resources.registers_per_thread")


@pytest.mark.nvcc
def test_registers_from_ptxas_when_on_path(client: TestClient) -> None:
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas not on PATH")
    r = client.post("/predict-kernel", json=knn_body(resources={}))
    assert r.status_code == 200, r.text
    assert r.json()["registers_source"].startswith("ptxas -v")


def test_inline_device_params(client: TestClient) -> None:
    profile = client.get("/devices/940mx").json()
    r = client.post("/predict-kernel", json=knn_body(device=None, device_params=profile))
    assert r.status_code == 200, r.text
    assert r.json()["predicted_cycles"] == pytest.approx(13311, rel=0.05)  # §6


def test_inline_calibrated_profile_with_its_iso_8601_timestamp(client: TestClient) -> None:
    # a calibrated profile's GET body carries calibration.created_at as the ISO 8601 string
    # its schema documents (format date-time); sent back inline it must be read as one
    profile = client.get("/devices/940mx").json()
    profile["calibration"] = {
        "base_device": "940mx",
        "base_digest": "0" * 64,
        "root_device": "940mx",
        "model": "many-bsp",
        "fitted": ["many_bsp.mu"],
        "measurement_count": 3,
        "measurements_digest": "0" * 64,
        "created_at": "2026-11-25T10:00:00Z",
        "training_error": {"mean_abs_pct": 1.0, "max_abs_pct": 2.0},
        "method": "MAP",
    }
    named = client.post("/predict-kernel", json=knn_body(device="940mx")).json()
    r = client.post("/predict-kernel", json=knn_body(device=None, device_params=profile))
    assert r.status_code == 200, r.text
    assert r.json()["predicted_cycles"] == named["predicted_cycles"]
    # lengths that must agree: a rule no schema keyword states, a problem type of its own
    profile["calibration"]["posterior"] = {"figures": [], "mean_log": [0.0], "covariance_log": []}
    r = client.post("/predict-kernel", json=knn_body(device=None, device_params=profile))
    assert r.status_code == 422
    assert r.json()["type"].endswith("/inconsistent-lengths")
    assert "calibration.posterior" in r.json()["errors"][0]["reason"]
    del profile["calibration"]["posterior"]
    profile["calibration"]["created_at"] = "yesterday"
    r = client.post("/predict-kernel", json=knn_body(device=None, device_params=profile))
    assert r.status_code == 422
    assert "created_at" in r.text


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=300))
def test_arbitrary_text_never_500s(client: TestClient, text: str) -> None:
    r = client.post("/predict-kernel", json=knn_body(ptx=text or "x"))
    assert r.status_code in (200, 422), r.text
    assert r.status_code == 200 or r.headers["content-type"].startswith(PROBLEM)


def _mm_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ptx": MM,
        "device": "940mx",
        "launch": {"grid": [20, 10, 1], "block": [32, 32, 1]},
        "resources": {"registers_per_thread": 22, "shared_bytes_per_block": 2048},
    }
    body.update(over)
    return body


# Inputs that drive the prediction past the range of a double: each was a 500 (OverflowError)
# or a 200 with null in a required number field (inf serialised as null).
OVERFLOWING = [
    # eq. (10): trip count x comp cycles exceeds 1.8e308
    (_mm_body(loop_trip_counts={"BB1_2": 10**308}), "body"),
    # a trip count that does not even convert to a float
    (_mm_body(loop_trip_counts={"BB1_2": 10**400}), "body"),
    # eq. (22): n_b / (n_sm * rho) with n_b = 1e600
    (_mm_body(launch={"grid": [10**200] * 3, "block": [32, 32, 1]}), "body"),
    # finite cycles over a subnormal clock: an infinite time in microseconds
    (_mm_body(clock_mhz=1e-320), "clock_mhz"),
]


@pytest.mark.parametrize(("body", "field"), OVERFLOWING)
def test_overflowing_prediction_is_422_not_500(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    body = _problem(client.post("/predict-kernel", json=body), 422, field)
    assert "overflow" in body["detail"]


def test_subnormal_device_figure_is_422_not_null_cycles(client: TestClient) -> None:
    # mu = 1e-320 divides eq. (24) into infinity, which JSON carried as "predicted_cycles": null
    profile = client.get("/devices/940mx").json()
    profile["many_bsp"]["mu"]["value"] = 1e-320
    r = client.post("/predict-kernel", json=_mm_body(device=None, device_params=profile))
    _problem(r, 422, "body")


def test_infinite_clock_is_422(client: TestClient) -> None:
    # Python's JSON reader accepts the non-standard literal Infinity (a time of 0 us before)
    raw = json.dumps(_mm_body(clock_mhz=float("inf")), allow_nan=True)
    r = client.post("/predict-kernel", content=raw, headers={"content-type": "application/json"})
    _problem(r, 422, "clock_mhz")


KERNEL_ARGS_PTX = (
    Path(__file__).resolve().parents[1] / "fixtures" / "ptx" / "nvcc" / "kernel_args.sm_80.ptx"
).read_text()


def _strided_sum_body(**args: Any) -> dict[str, Any]:
    return {
        "ptx": KERNEL_ARGS_PTX,
        "kernel": "strided_sum",
        "device": "a100",
        "launch": {"grid": [4, 1, 1], "block": [32, 1, 1]},
        "resources": {"registers_per_thread": 24, "shared_bytes_per_block": 0},
        "kernel_args": args,
    }


def test_kernel_args_bound_the_loops(client: TestClient) -> None:
    unbounded = client.post("/predict-kernel", json=_strided_sum_body())
    assert unbounded.status_code == 200, unbounded.text
    assert any("kernel_args.strided_sum_param_2" in w for w in unbounded.json()["warnings"])
    r = client.post(
        "/predict-kernel",
        json=_strided_sum_body(strided_sum_param_2=400, strided_sum_param_3=1),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert not [w for w in body["warnings"] if "trip count unknown" in w]
    # 400 iterations unrolled by 4: the main loop's superstep runs 100 times
    assert 100 in [s["iterations"] for s in body["level1_supersteps"]]
    assert body["predicted_cycles"] >= body["throughput_floor_cycles"] > 0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"n": 3}, "kernel_args.n"),
        ({"strided_sum_param_2": "3"}, "kernel_args.strided_sum_param_2"),
        ({"strided_sum_param_2": 2.5}, "kernel_args.strided_sum_param_2"),
    ],
)
def test_bad_kernel_args_are_422_naming_the_field(
    client: TestClient, args: dict[str, Any], field: str
) -> None:
    r = client.post("/predict-kernel", json=_strided_sum_body(**args))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    assert field in r.text
