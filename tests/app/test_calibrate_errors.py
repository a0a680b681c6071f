"""Bad calibration input gets a 4xx problem+json naming the field, never a 500."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from device_profiles.loader import PROFILE_DIR
from tests.app.calibration_helpers import gemm_ws_runs, paper_launches
from tests.app.service_helpers import clean_environ

__all__ = ["clean_environ"]

RUNS = gemm_ws_runs()[:10]
KERNEL_RUN = {**paper_launches()[0], "measured_cycles": 5.0e5}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, log_level="WARNING", cache_path=None, max_time_limit_s=60)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _without_n_du(device: str) -> dict[str, Any]:
    """A shipped profile's file without its Many-BSP n_du (no calibration fits it)."""
    raw: dict[str, Any] = json.loads((PROFILE_DIR / f"{device}.json").read_text())
    del raw["many_bsp"]["n_du"]
    return raw


def body(**changes: Any) -> dict[str, Any]:
    document = {"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS}
    document.update(changes)
    return document


def with_run(index: int, **changes: Any) -> list[dict[str, Any]]:
    runs = copy.deepcopy(RUNS)
    runs[index].update(changes)
    return runs


def problem(response: Any, status: int, field: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    errors = response.json()["errors"]
    assert field in [e["field"] for e in errors], errors
    return "\n".join(e["reason"] for e in errors if e["field"] == field)


CASES = [
    # (id, request body, status, field, words the reason must hold)
    ("zero-time", body(measurements=with_run(1, measured_time_us=0)), 422,
     "measurements.1.measured_time_us", ["greater than 0"]),
    ("negative-time", body(measurements=with_run(4, measured_time_us=-3.5)), 422,
     "measurements.4.measured_time_us", []),
    ("time-as-string", body(measurements=with_run(2, measured_time_us="12.5")), 422,
     "measurements.2.measured_time_us", []),
    ("time-as-bool", body(measurements=with_run(2, measured_time_us=True)), 422,
     "measurements.2.measured_time_us", []),
    ("tile-as-string", body(measurements=with_run(0, tile_m="128")), 422,
     "measurements.0.tile_m", []),
    (
        "tiling-beyond-shared-memory",
        body(measurements=with_run(7, tile_m=256, tile_n=256, tile_k=128, buffer_depth=4)),
        422, "measurements.7", ["shared memory", "101376"],
    ),
    ("unknown-figure", body(fit=["t_init_us", "mu"]), 422, "fit", ["'mu'", "t_epilogue_us"]),
    ("figure-twice", body(fit=["t_init_us", "t_init_us"]), 422, "fit", ["once"]),
    ("many-bsp-run-in-gemm-ws", body(measurements=[*RUNS, KERNEL_RUN]), 422, "measurements.10",
     ["many-bsp"]),
    ("gemm-ws-run-in-many-bsp", body(model="many-bsp", base_device="gtx-760"), 422,
     "measurements.0", ["gemm-ws"]),
    ("unknown-model", body(model="roofline"), 422, "model", []),
    ("unknown-profile", body(base_device="rtx-9090"), 422, "base_device", ["rtx-a6000"]),
    ("no-base", body(base_device=None), 422, "base_device", []),
    (
        "two-bases",
        body(base_device_params={"sm_count": 1, "t_init_us": 0, "t_epilogue_us": 0,
                                 "load_startup_latency_us": 0,
                                 "load_throughput_elements_per_us": 1,
                                 "compute_throughput_macs_per_us": 1}),
        422, "base_device", [],
    ),
    # an inline base that lacks Many-BSP figures no calibration fits: named, with its field
    (
        "base-lacks-uncalibratable-figures",
        body(
            model="many-bsp",
            base_device=None,
            base_device_params=_without_n_du("p100"),
            measurements=[KERNEL_RUN] * 4,
        ),
        422, "base_device_params", ["many_bsp.n_du", "cite it"],
    ),
    ("one-fold", body(cross_validation_folds=1), 422, "cross_validation_folds", []),
    ("no-runs", body(measurements=[]), 422, "measurements", []),
    ("bad-name", body(name="My GPU"), 422, "name", []),
    ("time-limit-above-max", body(time_limit_s=100.0), 422, "time_limit_s", ["60"]),
    ("extra-field", body(measurements=with_run(3, meta={"host": "x"})), 422,
     "measurements.3.meta", []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_body", "status", "field", "words"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_calibration_names_the_field(
    client: TestClient, request_body: dict[str, Any], status: int, field: str, words: list[str]
) -> None:
    reason = problem(client.post("/calibrate", json=request_body), status, field)
    for word in words:
        assert word in reason


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_times_are_refused(client: TestClient, literal: str) -> None:
    text = json.dumps(body(measurements=with_run(5, measured_time_us=123.0)))
    text = text.replace("123.0", literal, 1)
    response = client.post("/calibrate", content=text, headers={"content-type": "application/json"})
    problem(response, 422, "measurements.5.measured_time_us")


def test_non_finite_cycles_are_refused(client: TestClient) -> None:
    text = json.dumps(
        {"model": "many-bsp", "measurements": [{**KERNEL_RUN, "measured_cycles": 7.0}]}
    )
    text = text.replace('"measured_cycles": 7.0', '"measured_cycles": NaN')
    response = client.post(
        "/devices/gtx-760/measurements", content=text, headers={"content-type": "application/json"}
    )
    problem(response, 422, "measurements.0.measured_cycles")


def test_appending_checks_runs_against_the_device(client: TestClient) -> None:
    before = client.get("/devices/gtx-760/measurements").json()["many_bsp"]
    bad_ptx = {**KERNEL_RUN, "ptx": KERNEL_RUN["ptx"].replace(".entry", ".entri", 1)}
    big_block = {**KERNEL_RUN, "launch": {"grid": [1, 1, 1], "block": [1024, 2, 1]}}
    for i, (bad, field) in enumerate([(bad_ptx, "ptx"), (big_block, "launch.block")]):
        runs = [KERNEL_RUN] * i + [bad]
        response = client.post(
            "/devices/gtx-760/measurements", json={"model": "many-bsp", "measurements": runs}
        )
        problem(response, 422, f"measurements.{i}.{field}")
    # a gemm-ws run on a many-bsp request, and the reverse
    response = client.post(
        "/devices/rtx-a6000/measurements", json={"model": "gemm-ws", "measurements": [KERNEL_RUN]}
    )
    problem(response, 422, "measurements.0")
    response = client.post(
        "/devices/rtx-a6000/measurements",
        json={"model": "gemm-ws", "measurements": with_run(0, tile_m=256, tile_n=256, tile_k=256)},
    )
    problem(response, 422, "measurements.0")
    # nothing refused was recorded
    assert client.get("/devices/gtx-760/measurements").json()["many_bsp"] == before


def test_recalibrate_body_is_checked(client: TestClient) -> None:
    for changes, field in [
        ({"fit": ["mu"], "model": "gemm-ws"}, "fit"),
        ({"cross_validation_folds": "5"}, "cross_validation_folds"),
        ({"model": "many-bsp"}, "model"),  # no Many-BSP runs recorded for the device
    ]:
        response = client.post("/devices/rtx-a6000/recalibrate", json=changes)
        problem(response, 422, field)


def test_too_many_runs_for_the_server() -> None:
    settings = Settings(workers=1, log_level="WARNING", max_calibration_measurements=8)
    with TestClient(create_app(settings)) as small:
        reason = problem(small.post("/calibrate", json=body()), 422, "measurements")
        assert "8" in reason


def test_runs_no_figures_predict_finitely_are_unfittable_naming_measurements(
    client: TestClient,
) -> None:
    """A run of 5e-324 us (schema-valid: > 0) makes every start's relative residual overflow:
    a problem type of its own (a property of the numbers together, no schema can state it),
    not a 500 and not a generic invalid request."""
    run = {"m": 1, "n": 1, "k": 1, "dtype": "fp16", "tile_m": 1, "tile_n": 2, "tile_k": 1}
    payload = {
        "model": "gemm-ws",
        "base_device_params": {
            "sm_count": 1,
            "t_init_us": 0,
            "t_epilogue_us": 0,
            "load_startup_latency_us": 0,
            "load_throughput_elements_per_us": 1,
            "compute_throughput_macs_per_us": 1,
        },
        "measurements": [{**run, "buffer_depth": 1, "measured_time_us": 5e-324}],
    }
    r = client.post("/calibrate", json=payload)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["type"].endswith("/unfittable-measurements")
    assert [e["field"] for e in problem["errors"]] == ["measurements"]
    # the same run at a time the figures can reach is fitted
    payload["measurements"][0]["measured_time_us"] = 5.0
    assert client.post("/calibrate", json=payload).status_code == 200
