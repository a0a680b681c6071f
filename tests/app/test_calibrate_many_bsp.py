"""Many-BSP calibration over HTTP: profiles that lack mu and the launch overheads (the figures
only a measurement gives) become usable by /predict-kernel once calibrated.

Acceptance (calibration, with the profiles of today's GPUs): ``GET /devices/{id}`` for v100, a100
and h100 lists exactly the figures that need calibration; after ``/calibrate`` with measured
runs, ``/predict-kernel`` answers for them, an ``sm_90a`` kernel compiled with nvcc included.

The runs are timed on hidden "true" figures: the device's own profile with a hidden mu and
launch overheads put in by hand, predicted by the core (perfmodel.calibration), noise-free.
Oracles are independent of the HTTP layer: the expected listing is computed from the raw
profile files and the core's list of fitted figures; held-out launches (a grid no run used, an
sm_90a kernel no run used) are predicted by the core on the hidden truth.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from device_profiles import default_profiles
from device_profiles.loader import PROFILE_DIR
from perfmodel.calibration import MANY_BSP_FIGURES, predict_many_bsp_cycles
from perfmodel.manybsp import DeviceFigures
from tests.app.calibration_helpers import (
    TRUE_MANY_BSP,
    core_request,
    many_bsp_runs,
    paper_launches,
    true_many_bsp_figures,
)
from tests.app.service_helpers import clean_environ
from tests.nvcc_entries import NVCC_DIR, REGISTERS_PER_THREAD, entries

__all__ = ["clean_environ"]

TODAY = ("v100", "a100", "h100")
#: a warp-specialized sm_90a kernel (setmaxnreg, two warp groups) and its source
WS_SCALE_PTX = NVCC_DIR / "ws_scale.sm_90a.ptx"
WS_SCALE_CU = NVCC_DIR / "ws_scale.cu"
#: a CUTLASS warp-specialized GEMM, sm_90a, held out of every calibration
CUTLASS_PTX = NVCC_DIR / "cutlass_ws_gemm.pingpong_64x128x64.sm_90a.ptx"
((_, CUTLASS_ENTRY, CUTLASS_BLOCK),) = [e for e in entries() if e[0] == CUTLASS_PTX.name]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, log_level="WARNING", cache_path=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def raw_profile(device: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((PROFILE_DIR / f"{device}.json").read_text())
    return raw


def kernel_launch(ptx: str, kernel: str, grid_x: int, block_x: int) -> dict[str, Any]:
    return {
        "ptx": ptx,
        "kernel": kernel,
        "launch": {"grid": [grid_x, 1, 1], "block": [block_x, 1, 1]},
        "resources": {"registers_per_thread": REGISTERS_PER_THREAD},
    }


def truth_cycles(launch: dict[str, Any], truth: DeviceFigures) -> float:
    return predict_many_bsp_cycles(truth, core_request(launch, truth))


def measured_runs(truth: DeviceFigures) -> list[dict[str, Any]]:
    """The paper's worked examples at three grid sizes and the sm_90a ws_scale kernel at
    three, each with its cycles on the hidden truth."""
    ws = WS_SCALE_PTX.read_text()
    launches = paper_launches() + [kernel_launch(ws, "ws_scale", g, 256) for g in (80, 400, 2000)]
    return [{**launch, "measured_cycles": truth_cycles(launch, truth)} for launch in launches]


def held_out() -> list[dict[str, Any]]:
    """Launches no run used: a paper kernel at another grid, ws_scale at another grid, and a
    CUTLASS sm_90a GEMM."""
    paper = paper_launches()[3]
    paper["launch"]["grid"][0] *= 2
    return [
        paper,
        kernel_launch(WS_SCALE_PTX.read_text(), "ws_scale", 5000, 256),
        kernel_launch(CUTLASS_PTX.read_text(), CUTLASS_ENTRY, 264, CUTLASS_BLOCK[0]),
    ]


def expected_estimates(device: str) -> set[str]:
    """Dotted names of the Many-BSP figures the raw file flags as estimates (none of them a
    figure calibration fits in today's files: those are absent)."""
    section = raw_profile(device)["many_bsp"]
    flagged = set()
    for name, value in section.items():
        if name == "instruction_classes":
            flagged |= {f"many_bsp.{name}.{k}" for k, v in value.items() if v.get("estimate")}
        elif any(item.get("estimate") for item in (value if isinstance(value, list) else [value])):
            flagged.add(f"many_bsp.{name}")
    return flagged


@pytest.mark.parametrize("device", TODAY)
def test_todays_gpus_list_exactly_the_figures_to_calibrate(client: TestClient, device: str) -> None:
    """The figures a calibration fits are estimates with priors (served), listed
    with the call that fits them; the model answers out of the box."""
    raw = raw_profile(device)
    estimated = {
        f"many_bsp.{n}" for n in MANY_BSP_FIGURES if raw["many_bsp"].get(n, {}).get("estimate")
    }
    assert estimated  # else the acceptance would prove nothing for this device
    listing = client.get(f"/devices/{device}").json()["needs_calibration"]["many-bsp"]
    assert listing["status"] == "uncalibrated-estimates"
    assert {f["figure"] for f in listing["figures"]} == estimated
    assert all(f["state"] == "estimate" and f["calibratable"] for f in listing["figures"])
    assert listing["missing"] == []
    assert {f["figure"] for f in listing["estimates"]} == expected_estimates(device) - estimated
    call = listing["calibrate"]
    assert call["path"] == "/calibrate" and call["method"] == "POST"
    assert call["body"]["base_device"] == device and call["body"]["model"] == "many-bsp"
    assert sorted(call["body"]["fit"]) == sorted(n.removeprefix("many_bsp.") for n in estimated)
    r = client.post("/predict-kernel", json={**paper_launches()[0], "device": device})
    assert r.status_code == 200, r.text
    assert r.json()["profile_provenance"]["kind"] == "estimated"


@pytest.fixture(scope="module")
def calibrated(client: TestClient) -> dict[str, tuple[dict[str, Any], DeviceFigures]]:
    """device -> (the /calibrate answer, the hidden truth), made with the body GET
    /devices/{id} lists, its measurements filled with runs timed on the truth."""
    before = {p.name: p.read_bytes() for p in PROFILE_DIR.glob("*.json")}
    out = {}
    for device in TODAY:
        detail = client.get(f"/devices/{device}").json()
        truth = true_many_bsp_figures(detail)
        call = detail["needs_calibration"]["many-bsp"]["calibrate"]
        body = {**call["body"], "measurements": measured_runs(truth)}
        response = client.request(call["method"], call["path"], json=body)
        assert response.status_code == 200, response.text
        out[device] = (response.json(), truth)
    # calibrating never writes a shipped profile file
    assert {p.name: p.read_bytes() for p in PROFILE_DIR.glob("*.json")} == before
    return out


@pytest.mark.parametrize("device", TODAY)
def test_calibrated_profiles_fit_the_hidden_figures(
    client: TestClient,
    calibrated: dict[str, tuple[dict[str, Any], DeviceFigures]],
    device: str,
) -> None:
    answer, _ = calibrated[device]
    assert answer["device"].startswith(f"{device}-cal-") and answer["unit"] == "cycles"
    fitted = {f["name"]: f for f in answer["fitted"]}
    # every calibratable figure the profile carries; the throughput efficiency only where
    # a throughput floor reads it
    section = raw_profile(device)["many_bsp"]
    assert set(fitted) == {n for n in MANY_BSP_FIGURES if n in section}
    assert ("throughput_efficiency" in fitted) == ("sector_bytes" in section)
    for name, true_value in TRUE_MANY_BSP.items():
        if name not in fitted:
            continue
        assert fitted[name]["identifiable"] and not fitted[name]["estimate"], fitted[name]
        assert fitted[name]["value"] == pytest.approx(true_value, rel=0.02)
        # the base's estimate (its prior median) is the fit's base value
        assert fitted[name]["base_value"] == fitted[name]["prior"]["median"]
    assert not any("estimate: true" in w for w in answer["warnings"])
    profile = client.get(f"/devices/{answer['device']}").json()
    for name, figure in fitted.items():
        stored = profile["many_bsp"][name]
        assert stored["value"] == figure["value"] and stored["estimate"] is False
        assert stored["source"].startswith("fitted by POST /calibrate from 21 many-bsp")
    # the calibrated profile's listing: nothing left to calibrate for Many-BSP, its state
    # "calibrated"; estimates no run fits are still flagged (and served)
    listing = profile["needs_calibration"]["many-bsp"]
    assert listing["figures"] == [] and listing["missing"] == [] and listing["calibrate"] is None
    estimates = expected_estimates(device) - {f"many_bsp.{n}" for n in MANY_BSP_FIGURES}
    assert {f["figure"] for f in listing["estimates"]} == estimates
    assert listing["status"] == "calibrated"
    summary = [d for d in client.get("/devices").json()["devices"] if d["id"] == answer["device"]]
    assert summary[0]["model_status"]["many-bsp"] == listing["status"]
    assert "many-bsp" in summary[0]["models"]
    assert summary[0]["calibration"]["base_device"] == device
    # provenance in the base's schema_version (4: the memory section)
    assert profile["schema_version"] == 4 and profile["calibration"]["model"] == "many-bsp"


@pytest.mark.parametrize("device", TODAY)
def test_calibrated_profiles_predict_held_out_launches(
    client: TestClient,
    calibrated: dict[str, tuple[dict[str, Any], DeviceFigures]],
    device: str,
) -> None:
    answer, truth = calibrated[device]
    for launch in held_out():
        r = client.post("/predict-kernel", json={**launch, "device": answer["device"]})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["device"] == answer["device"]
        assert out["predicted_cycles"] == pytest.approx(truth_cycles(launch, truth), rel=0.02)
        if launch.get("kernel") == "ws_scale":
            assert len(out["warp_roles"]) == 2  # the two warp groups of the sm_90a kernel


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_sm_90a_kernel_compiled_here_is_predicted(
    client: TestClient,
    calibrated: dict[str, tuple[dict[str, Any], DeviceFigures]],
    tmp_path: Path,
) -> None:
    ptx_path = tmp_path / "ws_scale.ptx"
    subprocess.run(
        ["nvcc", "-arch=sm_90a", "-ptx", str(WS_SCALE_CU), "-o", str(ptx_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    ptx = ptx_path.read_text()
    assert ".target sm_90a" in ptx and "setmaxnreg" in ptx
    answer, truth = calibrated["h100"]
    launch = kernel_launch(ptx, "ws_scale", 1320, 256)
    r = client.post("/predict-kernel", json={**launch, "device": answer["device"]})
    assert r.status_code == 200, r.text
    assert r.json()["predicted_cycles"] == pytest.approx(truth_cycles(launch, truth), rel=0.02)


def test_too_few_runs_keep_no_made_up_number_as_a_fit(client: TestClient) -> None:
    """Three runs for three figures: what they do not determine stays near its prior (the
    starting value), flagged estimate in the answer and the stored profile, never a fit of
    this device presented as a measurement; more runs then determine the figures."""
    detail = client.get("/devices/v100").json()
    truth = true_many_bsp_figures(detail)
    runs = measured_runs(truth)[:3]
    r = client.post(
        "/calibrate", json={"model": "many-bsp", "base_device": "v100", "measurements": runs}
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    shipped = default_profiles()
    undetermined = [f for f in answer["fitted"] if not f["identifiable"]]
    assert undetermined
    for f in undetermined:
        assert f["estimate"] and f["base_value"] == f["prior"]["median"]
        assert getattr(shipped["v100"].many_bsp, f["name"]).estimate  # the base's own estimate
        assert any(w.startswith(f"{f['name']} was not determined") for w in answer["warnings"])
    profile = client.get(f"/devices/{answer['device']}").json()
    for f in undetermined:
        stored = profile["many_bsp"][f["name"]]
        assert stored["estimate"] is True and stored["value"] == f["value"]
        assert "held by its prior" in stored["note"]
    listing = profile["needs_calibration"]["many-bsp"]
    assert listing["status"] == "calibrated"
    assert sorted(x["figure"] for x in listing["figures"]) == sorted(
        f"many_bsp.{f['name']}" for f in undetermined
    )
    assert {x["state"] for x in listing["figures"]} == {"estimate"}
    assert listing["calibrate"]["body"]["base_device"] == answer["device"]
    # that listed call, with enough runs, replaces the estimates with fits: nothing is left to
    # calibrate (the state stays "calibrated": fitted to runs)
    call = listing["calibrate"]
    refit = client.post(call["path"], json={**call["body"], "measurements": measured_runs(truth)})
    assert refit.status_code == 200, refit.text
    assert refit.json()["base_device"] == answer["device"]
    assert all(f["identifiable"] and not f["estimate"] for f in refit.json()["fitted"])
    again = client.get(f"/devices/{refit.json()['device']}").json()
    assert again["needs_calibration"]["many-bsp"]["status"] == "calibrated"
    assert again["needs_calibration"]["many-bsp"]["figures"] == []
    assert again["calibration"]["root_device"] == "v100"
    assert again["many_bsp"]["mu"]["value"] == pytest.approx(TRUE_MANY_BSP["mu"], rel=0.02)
    # fewer runs than figures: a fit all the same (the priors fill in)
    r = client.post(
        "/calibrate", json={"model": "many-bsp", "base_device": "v100", "measurements": runs[:2]}
    )
    assert r.status_code == 200, r.text


def test_inline_profile_lacking_mu_is_calibrated_and_predicts(client: TestClient) -> None:
    base = default_profiles()["gtx-760"]
    assert base.many_bsp is not None
    section = base.many_bsp.model_copy(update=dict.fromkeys(MANY_BSP_FIGURES))
    base = base.model_copy(update={"many_bsp": section})
    truth = true_many_bsp_figures(base.model_dump(mode="json"))
    body = {
        "model": "many-bsp",
        "base_device_params": base.model_dump(mode="json"),
        "measurements": many_bsp_runs(truth),
        "name": "kepler-lab",
    }
    response = client.post("/calibrate", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["device"].startswith("inline-cal-") and answer["unit"] == "cycles"
    # the base had no value to report: the fit started from the shipped profiles' median
    assert all(f["base_value"] is None for f in answer["fitted"])
    fitted = {f["name"]: f for f in answer["fitted"]}
    assert fitted["mu"]["identifiable"]
    # many_bsp_runs adds 2 % noise
    assert fitted["mu"]["value"] == pytest.approx(TRUE_MANY_BSP["mu"], rel=0.1)
    stored = client.get("/devices/kepler-lab").json()["many_bsp"]["mu"]
    assert stored["source"].startswith("fitted by POST /calibrate from 18 many-bsp")
    launch = held_out()[0]
    r = client.post("/predict-kernel", json={**launch, "device": "kepler-lab"})
    assert r.status_code == 200, r.text
    expected = predict_many_bsp_cycles(truth, core_request(launch, truth))
    assert r.json()["predicted_cycles"] == pytest.approx(expected, rel=0.05)
    # the uncalibrated profile cannot predict: 422 naming what calibration supplies
    r = client.post(
        "/predict-kernel", json={**launch, "device_params": base.model_dump(mode="json")}
    )
    assert r.status_code == 422 and "many_bsp.mu" in r.text
