"""Many-BSP calibration over HTTP: profiles that lack mu and the launch overheads (the
figures only a measurement gives) become usable by /predict-kernel once calibrated.

The runs are the paper's six worked-example launches at three grid sizes, timed on hidden
"true" figures by the core predictor, +-2 % noise. The oracle for the answers is the hidden
truth: fitted figures near it, and a held-out launch predicted within a few per cent of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from device_profiles import DeviceProfile, default_profiles
from perfmodel.calibration import MANY_BSP_FIGURES, predict_many_bsp_cycles
from perfmodel.manybsp import DeviceFigures, device_from_profile
from tests.app.calibration_helpers import core_request, many_bsp_runs, paper_launches
from tests.app.service_helpers import clean_environ

__all__ = ["clean_environ"]

#: the hidden figures (gtx-760's paper values are mu 3.36, 553 and 10 cycles)
TRUE = {"mu": 2.0, "block_launch_overhead_cycles": 700.0, "warp_launch_overhead_cycles": 25.0}
#: the GPUs the profiles branch ships with every Many-BSP figure but these three
TODAYS_GPUS = ("v100", "a100", "h100", "p100")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(workers=1, log_level="WARNING"))) as test_client:
        yield test_client


def without_fitted_figures(profile: DeviceProfile) -> DeviceProfile:
    assert profile.many_bsp is not None
    section = profile.many_bsp.model_copy(update=dict.fromkeys(MANY_BSP_FIGURES))
    return profile.model_copy(update={"many_bsp": section})


def true_figures(profile: dict[str, Any]) -> DeviceFigures:
    """The profile's figures with the hidden mu and overheads put in by hand."""
    section = dict(profile["many_bsp"])
    for name, value in TRUE.items():
        section[name] = {"value": value, "source": "hidden truth of the test"}
    return device_from_profile(DeviceProfile.model_validate({**profile, "many_bsp": section}))


def held_out_launch() -> dict[str, Any]:
    """A grid size none of the runs used (the runs scale grid x by 1, 4 and 16)."""
    launch = paper_launches()[3]
    launch["launch"]["grid"][0] *= 2
    return launch


def check_calibrated(client: TestClient, answer: dict[str, Any], truth: DeviceFigures) -> None:
    fitted = {f["name"]: f for f in answer["fitted"]}
    assert set(fitted) == set(MANY_BSP_FIGURES)
    assert fitted["mu"]["identifiable"]
    assert fitted["mu"]["value"] == pytest.approx(TRUE["mu"], rel=0.1)
    assert fitted["block_launch_overhead_cycles"]["value"] == pytest.approx(700, rel=0.25)
    profile = client.get(f"/devices/{answer['device']}").json()
    assert (
        "many-bsp"
        in [
            d["models"]
            for d in client.get("/devices").json()["devices"]
            if d["id"] == answer["device"]
        ][0]
    )
    for name, figure in fitted.items():
        assert profile["many_bsp"][name]["value"] == figure["value"]
    launch = held_out_launch()
    r = client.post("/predict-kernel", json={**launch, "device": answer["device"]})
    assert r.status_code == 200, r.text
    expected = predict_many_bsp_cycles(truth, core_request(launch, truth))
    assert r.json()["predicted_cycles"] == pytest.approx(expected, rel=0.05)
    assert r.json()["device"] == answer["device"]


def test_inline_profile_lacking_mu_is_calibrated_and_predicts(client: TestClient) -> None:
    base = without_fitted_figures(default_profiles()["gtx-760"])
    truth = true_figures(base.model_dump(mode="json"))
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
    check_calibrated(client, answer, truth)
    stored = client.get("/devices/kepler-lab").json()["many_bsp"]["mu"]
    assert stored["source"].startswith("fitted by POST /calibrate from 18 many-bsp")
    # the uncalibrated profile cannot predict: 422 naming what calibration supplies
    r = client.post(
        "/predict-kernel", json={**held_out_launch(), "device_params": base.model_dump(mode="json")}
    )
    assert r.status_code == 422 and "many_bsp.mu" in r.text


@pytest.mark.parametrize("device", TODAYS_GPUS)
def test_packaged_profile_without_mu_is_calibrated_and_predicts(
    client: TestClient, device: str
) -> None:
    shipped = default_profiles().get(device)
    if shipped is None:
        pytest.skip(f"{device} is not packaged in this checkout (device profiles branch)")
    missing = shipped.missing_many_bsp_figures()
    unfittable = [m for m in missing if m.removeprefix("many_bsp.") not in MANY_BSP_FIGURES]
    profile = client.get(f"/devices/{device}").json()
    if unfittable:
        # a profile missing more than calibration can fit is refused, naming just those
        body = {"model": "many-bsp", "base_device": device, "measurements": [
            {**paper_launches()[0], "measured_cycles": 1e5}] * 4}  # fmt: skip
        r = client.post("/calibrate", json=body)
        assert r.status_code == 422
        assert {e["field"] for e in r.json()["errors"]} == {"base_device"}
        assert [e["reason"] for e in r.json()["errors"]] == [
            f"missing figure: {m}" for m in unfittable
        ]
        return
    truth = true_figures(profile)
    response = client.post(
        "/calibrate",
        json={"model": "many-bsp", "base_device": device, "measurements": many_bsp_runs(truth)},
    )
    assert response.status_code == 200, response.text
    check_calibrated(client, response.json(), truth)
