"""POST /calibrate and /devices/{id}/recalibrate under a GeMM-WS pipeline model.

Runs are timed by the async-copy event simulator
(perfmodel.pipelines.async_copy.recurrences.simulate_async) on a hidden device, with the SM
limits the rtx-a6000 profile cites; the oracle is that hidden device, never the fit's closed
form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.schemas.devices import drop_read_only_keys
from app.settings import Settings
from device_profiles import DeviceProfile
from device_profiles.pipeline import default_pipeline_model
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.pipelines.async_copy.recurrences import simulate_async
from tests.app.calibration_helpers import SHAPES, TILINGS, TRUE_GEMM, gemm_ws_runs
from tests.app.service_helpers import clean_environ
from tests.app.test_calibrate_errors import problem

__all__ = ["clean_environ"]

#: the hidden GPU, with latencies large enough to matter under async-copy
TRUE_ASYNC = dataclasses.replace(
    TRUE_GEMM, load_startup_latency_us=1.5, compute_startup_latency_us=0.2
)
#: rtx-a6000's hardware section (CC 8.6: 16 CTAs, 100 KB, 64 K registers, 1536 threads per SM)
A6000_SM = SmLimits(16, 102400, 65536, 1536)
FIGURES = (
    "load_throughput_elements_per_us",
    "compute_throughput_macs_per_us",
    "load_startup_latency_us",
    "compute_startup_latency_us",
    "t_init_us",
    "t_epilogue_us",
)


def _async_time_us(machine: GemmWsMachine, run: dict[str, Any]) -> float:
    shape = GemmShape(run["m"], run["n"], run["k"])
    tiling = Tiling(run["tile_m"], run["tile_n"], run["tile_k"], run["buffer_depth"])
    limits = dataclasses.replace(A6000_SM, threads_per_cta=run.get("threads_per_cta"))
    return simulate_async(shape, tiling, machine, limits, 2).overall_time_ns / 1000


def _async_runs(threads: int | None = None) -> list[dict[str, Any]]:
    runs = []
    for m, n, k in SHAPES:
        for a, b, c, d in TILINGS:
            run: dict[str, Any] = {
                "m": m, "n": n, "k": k, "dtype": "fp16", "tile_m": a, "tile_n": b,
                "tile_k": c, "buffer_depth": d,
            }  # fmt: skip
            if threads is not None:
                run["threads_per_cta"] = threads
            run["measured_time_us"] = _async_time_us(TRUE_ASYNC, run)
            runs.append(run)
    return runs


RUNS = _async_runs()


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, log_level="WARNING", cache_path=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _calibrate(client: TestClient, **body: Any) -> dict[str, Any]:
    # no cross-validation and a generous budget: the machine running the tests is shared
    payload = {"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS,
               "cross_validation_folds": 0, "time_limit_s": 60.0, **body}  # fmt: skip
    response = client.post("/calibrate", json=payload)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def _machine(answer: dict[str, Any]) -> GemmWsMachine:
    values = {f["name"]: f["value"] for f in answer["fitted"]}
    return dataclasses.replace(TRUE_ASYNC, **values)


def test_async_copy_fit_recovers_the_hidden_device_and_the_profile_records_it(
    client: TestClient,
) -> None:
    answer = _calibrate(client, pipeline_model="async-copy")
    assert answer["pipeline_model"] == "async-copy"
    assert "async-copy" in answer["method"]
    fitted = {f["name"]: f for f in answer["fitted"]}
    assert set(fitted) == set(FIGURES)
    for name in ("load_throughput_elements_per_us", "compute_throughput_macs_per_us"):
        assert fitted[name]["identifiable"], name
    for name, f in fitted.items():
        if f["identifiable"]:
            assert f["value"] == pytest.approx(getattr(TRUE_ASYNC, name), rel=0.02), name
    assert answer["training_error"]["max_abs_pct"] <= 0.5
    # runs it never saw (other shapes), simulated on the fitted figures vs the hidden device
    machine = _machine(answer)
    for m, n, k in ((3072, 1536, 2048), (768, 4096, 1024)):
        for a, b, c, d in TILINGS:
            run = {"m": m, "n": n, "k": k, "tile_m": a, "tile_n": b, "tile_k": c,
                   "buffer_depth": d}  # fmt: skip
            truth = _async_time_us(TRUE_ASYNC, run)
            assert _async_time_us(machine, run) == pytest.approx(truth, rel=0.01)
    profile = client.get(f"/devices/{answer['device']}").json()
    assert profile["calibration"]["pipeline_model"] == "async-copy"
    # answers on the calibrated profile default to the model it was fitted under
    stored = DeviceProfile.model_validate(drop_read_only_keys(profile))
    assert default_pipeline_model(stored) == "async-copy"


def test_the_same_runs_under_paper_make_another_profile_that_fits_them_worse(
    client: TestClient,
) -> None:
    own = _calibrate(client, pipeline_model="async-copy")
    paper = _calibrate(client, pipeline_model="paper")
    assert paper["pipeline_model"] == "paper"
    assert paper["device"] != own["device"]
    assert own["training_error"]["mean_abs_pct"] < paper["training_error"]["mean_abs_pct"]
    profile = client.get(f"/devices/{paper['device']}").json()
    assert profile["calibration"]["pipeline_model"] == "paper"


def test_paper_runs_fitted_as_before_when_the_profile_defaults_to_paper(
    client: TestClient,
) -> None:
    runs = gemm_ws_runs()
    # rtx-a6000's figures are published: its default is paper, and so is the fit's
    default = _calibrate(client, measurements=runs)
    explicit = _calibrate(client, measurements=runs, pipeline_model="paper")
    assert default["pipeline_model"] == "paper"
    assert default["device"] == explicit["device"]
    assert default["fitted"] == explicit["fitted"]
    assert default["training_error"]["max_abs_pct"] <= 6.0  # 2 % noise, as before


def test_null_follows_the_base_profiles_default(client: TestClient) -> None:
    # a100: estimated GeMM-WS figures of compute capability 8.0 -> async-copy
    answer = _calibrate(client, base_device="a100", measurements=RUNS[:12], pipeline_model=None)
    assert answer["pipeline_model"] == "async-copy"
    # inline device_params: paper
    params = {"sm_count": 84, "t_init_us": 1.68, "t_epilogue_us": 1.543,
              "load_startup_latency_us": 0.77, "compute_startup_latency_us": 0.0,
              "load_throughput_elements_per_us": 152.96,
              "compute_throughput_macs_per_us": 24610.0}  # fmt: skip
    inline = client.post(
        "/calibrate",
        json={"model": "gemm-ws", "base_device_params": params, "measurements": RUNS[:6],
              "time_limit_s": 60.0},
    )  # fmt: skip
    assert inline.status_code == 200, inline.text
    assert inline.json()["pipeline_model"] == "paper"


def test_recalibration_keeps_the_devices_pipeline_model_unless_told(client: TestClient) -> None:
    answer = _calibrate(client, pipeline_model="async-copy")
    device = answer["device"]
    budget = {"cross_validation_folds": 0, "time_limit_s": 60.0}
    again = client.post(f"/devices/{device}/recalibrate", json=budget)
    assert again.status_code == 200, again.text
    assert again.json()["pipeline_model"] == "async-copy"
    other = client.post(
        f"/devices/{device}/recalibrate", json={**budget, "pipeline_model": "paper"}
    )
    assert other.status_code == 200, other.text
    assert other.json()["pipeline_model"] == "paper"
    stored = client.get(f"/devices/{other.json()['device']}").json()
    assert stored["calibration"]["pipeline_model"] == "paper"


def test_runs_may_carry_threads_per_cta_which_limit_ctas_per_sm(client: TestClient) -> None:
    # 768 threads: 2 CTAs per SM at most (1536 threads per SM), whatever the shared memory
    runs = _async_runs(threads=768)
    answer = _calibrate(client, measurements=runs, pipeline_model="async-copy")
    assert answer["training_error"]["max_abs_pct"] <= 0.5
    without = [{k: v for k, v in r.items() if k != "threads_per_cta"} for r in runs]
    other = _calibrate(client, measurements=without, pipeline_model="async-copy")
    assert other["measurements_digest"] != answer["measurements_digest"]
    assert other["training_error"]["max_abs_pct"] > answer["training_error"]["max_abs_pct"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"pipeline_model": "async"}, "pipeline_model"),
        ({"pipeline_model": 1}, "pipeline_model"),
        ({"measurements": [{**RUNS[0], "threads_per_cta": 0}]}, "measurements.0.threads_per_cta"),
        (
            {"measurements": [{**RUNS[0], "registers_per_thread": 256}]},
            "measurements.0.registers_per_thread",
        ),
    ],
)
def test_bad_pipeline_fields_are_422_naming_them(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    payload = {"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS, **body}
    problem(client.post("/calibrate", json=payload), 422, field)


def test_a_pipeline_model_for_a_many_bsp_fit_is_422_naming_it(client: TestClient) -> None:
    payload = {
        "model": "many-bsp",
        "base_device": "gtx-760",
        "pipeline_model": "paper",
        "measurements": [
            {"ptx": ".version 7.0", "kernel": "k", "launch": {}, "measured_cycles": 1}
        ],
    }
    problem(client.post("/calibrate", json=payload), 422, "pipeline_model")
    bad = client.post("/devices/rtx-a6000/recalibrate", json={"pipeline_model": "tma"})
    problem(bad, 422, "pipeline_model")
