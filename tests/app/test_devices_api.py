"""GET /devices and GET /devices/{id}: per-model status and the needs-calibration listing, the
422 that points at the same call, and Many-BSP answering for today's GPUs once the listed
figures are filled (an sm_90a kernel on the h100)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from device_profiles import get_profile
from perfmodel.calibration.many_bsp import fittable_figures
from perfmodel.manybsp.device import device_from_profile
from tests.device_profiles.test_todays_gpus import FITTED as FITTED_BY_MODEL

NVCC_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "ptx" / "nvcc"
PROBLEM = "application/problem+json"

#: what POST /calibrate fits for Many-BSP
FITTED = {"mu", "block_launch_overhead_cycles", "warp_launch_overhead_cycles"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, cache_path=None, cache_memory_items=0)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.mark.parametrize("device", ["v100", "a100", "h100"])
def test_detail_lists_exactly_the_figures_to_calibrate(client: TestClient, device: str) -> None:
    """Today's GPUs serve both models out of the box on cited estimates; the
    figures a calibration fits are listed as estimates, each with its prior, and the call."""
    r = client.get(f"/devices/{device}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["hardware"]["sm_count"]["source"]  # the profile, with sources, as before
    many_bsp = body["needs_calibration"]["many-bsp"]
    # the throughput floor's efficiency only where a floor reads it (sector profiles)
    floor = body["many_bsp"].get("sector_bytes") is not None
    fitted = FITTED | ({"throughput_efficiency"} if floor else set())
    assert many_bsp["status"] == "uncalibrated-estimates"
    assert {f["figure"] for f in many_bsp["figures"]} == {f"many_bsp.{n}" for n in fitted}
    assert all(f["calibratable"] and f["state"] == "estimate" for f in many_bsp["figures"])
    assert all(f["reason"] for f in many_bsp["figures"])
    assert many_bsp["missing"] == []
    for name in fitted:
        prior = body["many_bsp"][name]["prior"]
        assert prior["median"] == body["many_bsp"][name]["value"] and prior["source"]
    call = many_bsp["calibrate"]
    assert (call["method"], call["path"]) == ("POST", "/calibrate")
    assert call["body"]["model"] == "many-bsp" and call["body"]["base_device"] == device
    assert set(call["body"]["fit"]) == fitted
    # the listed figures are what the fit takes by default on this device, so the command
    # needs no --fit (without it the server fits perfmodel's default for the device)
    default = fittable_figures(device_from_profile(get_profile(device)).device)
    assert set(call["body"]["fit"]) == set(default)
    assert call["cli"] == f"kperf calibrate runs.jsonl --model many-bsp --device {device}"
    # GeMM-WS: estimates derived from public figures, all six listed for calibration
    gemm_ws = body["needs_calibration"]["gemm-ws"]
    assert gemm_ws["status"] == "uncalibrated-estimates" and len(gemm_ws["figures"]) == 6
    assert gemm_ws["calibrate"]["cli"].endswith(f"--model gemm-ws --device {device}")


def test_published_figures_list_nothing_to_calibrate(client: TestClient) -> None:
    body = client.get("/devices/gtx-760").json()
    many_bsp = body["needs_calibration"]["many-bsp"]
    assert many_bsp == {
        "status": "served",
        "figures": [],
        "missing": [],
        "estimates": [],
        "calibrate": None,
    }
    assert body["needs_calibration"]["gemm-ws"]["status"] == "uncalibrated-estimates"
    assert client.get("/devices/rtx-a6000").json()["needs_calibration"]["gemm-ws"] == {
        "status": "served",
        "figures": [],
        "missing": [],
        "estimates": [],
        "calibrate": None,
    }


def test_borrowed_figures_no_calibration_fits_are_listed_as_estimates(client: TestClient) -> None:
    many_bsp = client.get("/devices/p100").json()["needs_calibration"]["many-bsp"]
    assert many_bsp["status"] == "uncalibrated-estimates" and many_bsp["missing"] == []
    borrowed = {f["figure"] for f in many_bsp["estimates"]}
    assert {"many_bsp.mem_lat_cycles", "many_bsp.issue_cycle"} <= borrowed
    assert not any(f["calibratable"] for f in many_bsp["estimates"])
    assert {f["figure"] for f in many_bsp["figures"]} == {f"many_bsp.{n}" for n in FITTED}


def test_estimates_are_flagged(client: TestClient) -> None:
    many_bsp = client.get("/devices/h100").json()["needs_calibration"]["many-bsp"]
    figures = [f["figure"] for f in many_bsp["estimates"]]
    # the required figure first, then the optional sm_90 rows the profile flags as estimates
    assert figures[0] == "many_bsp.bar_sync_overhead"
    assert figures[1:] and all(f.startswith("many_bsp.instruction_classes.") for f in figures[1:])
    assert all(f["state"] == "estimate" for f in many_bsp["estimates"])
    assert "estimate" in many_bsp["estimates"][0]["reason"]


def test_listing_gives_each_models_status(client: TestClient) -> None:
    devices = {d["id"]: d for d in client.get("/devices").json()["devices"]}
    assert {"v100", "a100", "h100"} <= set(devices)
    for device in ("v100", "a100", "h100"):
        assert devices[device]["model_status"] == {
            "gemm-ws": "uncalibrated-estimates",
            "many-bsp": "uncalibrated-estimates",
        }
        assert devices[device]["models"] == ["gemm-ws", "many-bsp"]
    assert devices["gtx-760"]["model_status"]["many-bsp"] == "served"
    assert devices["p100"]["model_status"]["many-bsp"] == "uncalibrated-estimates"
    assert devices["rtx-a6000"]["model_status"]["gemm-ws"] == "served"
    assert devices["rtx-a6000"]["models"] == ["gemm-ws", "many-bsp"]


ALL_PROFILES = ["a100", "h100", "v100", "p100", "gtx-1070", "gtx-760", "940mx", "rtx-a6000"]
GEMM_WS_FITTED = set(FITTED_BY_MODEL["gemm-ws"])


@pytest.mark.parametrize("device", ALL_PROFILES)
def test_detail_gives_every_figure_its_value_status_and_prior(
    client: TestClient, device: str
) -> None:
    body = client.get(f"/devices/{device}").json()
    for model, prefix, fitted in (
        ("many-bsp", "many_bsp", FITTED),
        ("gemm-ws", "gemm_ws", GEMM_WS_FITTED),
    ):
        listed = {f["figure"]: f for f in body["figures"][model]}
        for name in fitted:  # every calibratable figure has a cited prior
            f = listed[f"{prefix}.{name}"]
            assert f["prior"]["median"] > 0 and f["prior"]["sigma_log"] > 0
            assert len(f["prior"]["source"]) > 10
        for path, f in listed.items():  # the file's own value and flag, as the profile shows
            section = body[prefix][path.removeprefix(f"{prefix}.")]
            assert f["value"] == section["value"]
            assert f["status"] == ("estimated" if section.get("estimate") else "published")
    assert {f["figure"]: f for f in body["figures"]["many-bsp"]}["many_bsp.warp_size"][
        "prior"
    ] is None  # not calibratable: no prior


@pytest.mark.parametrize(
    ("device", "gemm_ws", "many_bsp"),
    [
        # §4.2 measured the A6000's GeMM-WS figures; the report fitted the GTX 760's Many-BSP
        ("rtx-a6000", "published", "estimated"),
        ("gtx-760", "estimated", "published"),
        ("h100", "estimated", "estimated"),
    ],
)
def test_detail_says_each_models_provenance_as_its_answers_do(
    client: TestClient, device: str, gemm_ws: str, many_bsp: str
) -> None:
    origins = client.get(f"/devices/{device}").json()["profile_provenance"]
    assert {m: o["kind"] for m, o in origins.items()} == {
        "gemm-ws": gemm_ws,
        "many-bsp": many_bsp,
    }
    answer = client.post("/optimize-tiling", json={"m": 256, "n": 256, "k": 256, "device": device})
    assert answer.status_code == 200, answer.text
    assert answer.json()["profile_provenance"] == origins["gemm-ws"]


def _predict_body(ptx: str, kernel: str, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ptx": ptx,
        "kernel": kernel,
        "device": "h100",
        "launch": {"grid": [64, 1, 1], "block": [256, 1, 1]},
        "resources": {"registers_per_thread": 8, "shared_bytes_per_block": 512},
    }
    body.update(over)
    return body


WS_SCALE = (NVCC_DIR / "ws_scale.sm_90a.ptx").read_text()


def _without(client: TestClient, device: str, *names: str) -> dict[str, Any]:
    """GET /devices/{id} with Many-BSP figures removed, to post back as an inline profile."""
    profile: dict[str, Any] = client.get(f"/devices/{device}").json()
    for name in names:
        profile["many_bsp"].pop(name)
    return profile


def test_422_names_the_figures_and_the_calibrate_call(client: TestClient) -> None:
    body = _predict_body(WS_SCALE, "ws_scale", device=None)
    body["device_params"] = _without(client, "h100", *FITTED)
    r = client.post("/predict-kernel", json=body)
    assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM)
    answer = r.json()
    reasons = {e["reason"].split(" (")[0] for e in answer["errors"]}
    assert reasons == {f"missing figure: many_bsp.{n}" for n in FITTED}
    assert all(e["calibratable"] for e in answer["errors"])
    assert "POST /calibrate" in answer["detail"]


def test_422_separates_figures_that_must_be_cited(client: TestClient) -> None:
    body = _predict_body(WS_SCALE, "ws_scale", device=None)
    body["device_params"] = _without(client, "p100", "mem_lat_cycles", "mu")
    r = client.post("/predict-kernel", json=body)
    assert r.status_code == 422
    by_figure = {e["reason"].split(" (")[0]: e["calibratable"] for e in r.json()["errors"]}
    assert by_figure["missing figure: many_bsp.mem_lat_cycles"] is False
    assert by_figure["missing figure: many_bsp.mu"] is True
    assert "cited" in r.json()["detail"]


def _calibrated(client: TestClient, device: str) -> dict[str, Any]:
    """GET /devices/{id} with the listed figures filled as a calibration run would fill them
    (plausible values, just to exercise the path), posted back as an inline profile."""
    profile: dict[str, Any] = client.get(f"/devices/{device}").json()
    fit = profile["needs_calibration"]["many-bsp"]["calibrate"]["body"]["fit"]
    plausible = {
        "mu": 2.0,
        "block_launch_overhead_cycles": 450,
        "warp_launch_overhead_cycles": 10,
        "throughput_efficiency": 0.9,
    }
    for name in fit:
        profile["many_bsp"][name] = {"value": plausible[name], "source": "test: plausible value"}
    return profile


@pytest.mark.parametrize(
    ("fixture", "kernel", "launch", "resources"),
    [
        # compiled here: nvcc -ptx -arch=sm_90a ws_scale.cu (tests/fixtures/ptx/nvcc)
        (
            "ws_scale.sm_90a.ptx",
            "ws_scale",
            {"grid": [64, 1, 1], "block": [256, 1, 1]},
            {"registers_per_thread": 8, "shared_bytes_per_block": 512},
        ),
        (
            "matmul_tiled.sm_90.ptx",
            "matmul_fixed",
            {"grid": [64, 64, 1], "block": [16, 16, 1]},
            {"registers_per_thread": 22, "shared_bytes_per_block": 2048},
        ),
    ],
)
@pytest.mark.parametrize("device", ["v100", "a100", "h100"])
def test_once_calibrated_many_bsp_answers(
    client: TestClient,
    device: str,
    fixture: str,
    kernel: str,
    launch: dict[str, Any],
    resources: dict[str, Any],
) -> None:
    ptx = (NVCC_DIR / fixture).read_text()
    body = _predict_body(ptx, kernel, device=None, launch=launch, resources=resources)
    body["device_params"] = _calibrated(client, device)
    r = client.post("/predict-kernel", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["device"] == device and answer["predicted_cycles"] > 0
    assert answer["mu"] == 2.0
    assert answer["l_b"] >= 1  # both kernels synchronise with bar.sync
    assert answer["predicted_time_us"] == pytest.approx(
        answer["predicted_cycles"] / answer["clock_mhz"]
    )


@pytest.mark.nvcc
def test_sm_90a_kernel_compiled_now_predicts_on_h100(client: TestClient, tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    out = tmp_path / "ws_scale.ptx"
    subprocess.run(
        [nvcc, "-ptx", "-arch=sm_90a", "-o", str(out), str(NVCC_DIR / "ws_scale.cu")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    ptx = out.read_text()
    assert ".target sm_90a" in ptx and "setmaxnreg" in ptx
    body = _predict_body(ptx, "ws_scale", device=None)
    body["device_params"] = _calibrated(client, "h100")
    r = client.post("/predict-kernel", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["predicted_cycles"] > 0
