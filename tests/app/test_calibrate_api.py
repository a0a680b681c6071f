"""POST /calibrate and the calibrated profiles it stores, over HTTP.

Oracles are independent of the code under test: the stored figures are fed back into the
event simulator (perfmodel.gemm_ws.simulate) and a brute-force ranking; digests are recomputed
from the documented rule; hidden "true" figures generate the runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import re
from collections.abc import Iterator
from typing import Any
from xml.etree import ElementTree

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.store import MemoryStore
from device_profiles.loader import PROFILE_DIR
from device_profiles.schema import GemmWsSection
from perfmodel.gemm_ws import GemmShape, GemmWsMachine
from solver.search_space import SearchSpace
from tests.app.calibration_helpers import TRUE_GEMM, gemm_ws_runs, true_time_us
from tests.app.service_helpers import clean_environ
from tests.gemm_ws_cases import brute_force_ranking
from tests.render.svg import Svg

__all__ = ["clean_environ"]

RUNS = gemm_ws_runs()
PROBLEM = {"m": 2048, "n": 1024, "k": 2048}
SVG = {"accept": "image/svg+xml"}
CALIBRATED_ID = re.compile(r"^rtx-a6000-cal-[0-9a-f]{12}$")
#: every figure of a profile's gemm_ws section is fitted by default
GEMM_FIGURES = tuple(GemmWsSection.model_fields)


def _settings() -> Settings:
    return Settings(workers=1, log_level="WARNING", cache_path=None)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(_settings())) as test_client:
        yield test_client


def calibrate(client: TestClient, **body: Any) -> dict[str, Any]:
    payload = {"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS, **body}
    response = client.post("/calibrate", json=payload)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def machine_of(profile: dict[str, Any]) -> GemmWsMachine:
    section = profile["gemm_ws"]
    return GemmWsMachine(
        sm_count=int(profile["hardware"]["sm_count"]["value"]),
        shared_memory_per_block_bytes=int(
            profile["hardware"]["shared_memory_per_block_bytes"]["value"]
        ),
        **{name: section[name]["value"] for name in GEMM_FIGURES},
    )


def digest_of(runs: list[dict[str, Any]]) -> str:
    """The documented rule: sha256 of the runs' canonical JSON, sorted, as a JSON list."""
    canon = sorted(json.dumps(r, sort_keys=True, separators=(",", ":")) for r in runs)
    return hashlib.sha256(("[" + ",".join(canon) + "]").encode()).hexdigest()


def test_calibrated_profile_holds_the_fit_and_cites_it(client: TestClient) -> None:
    answer = calibrate(client)
    assert CALIBRATED_ID.match(answer["device"])
    assert answer["measurement_count"] == len(RUNS) and answer["unit"] == "us"
    assert answer["measurements_digest"] == digest_of(RUNS)
    profile = client.get(f"/devices/{answer['device']}").json()
    shipped = client.get("/devices/rtx-a6000").json()
    fitted = {f["name"]: f for f in answer["fitted"]}
    assert set(fitted) == set(GEMM_FIGURES)
    for name, figure in fitted.items():
        stored = profile["gemm_ws"][name]
        assert stored["value"] == figure["value"]
        assert figure["base_value"] == shipped["gemm_ws"][name]["value"]
        # every figure is the MAP fit's (one coherent point); what the runs did not determine
        # is flagged estimate: held by its prior
        fitted_from = f"fitted by POST /calibrate from {len(RUNS)} gemm-ws measurements"
        assert stored["source"].startswith(fitted_from)
        assert answer["measurements_digest"][:12] in stored["source"]
        assert stored["source"].endswith("base rtx-a6000")
        assert stored["estimate"] is (not figure["identifiable"])
    # what was not fitted is the base's, unchanged
    assert profile["hardware"] == shipped["hardware"]
    # the runs were generated with 3x the load and 0.3x the MATH throughput: both recovered
    for name in ("load_throughput_elements_per_us", "compute_throughput_macs_per_us"):
        assert fitted[name]["identifiable"]
        assert fitted[name]["value"] == pytest.approx(getattr(TRUE_GEMM, name), rel=0.1)
    # GET /devices/{id}: the fitted figures are calibrated, the model's provenance too
    origin = profile["profile_provenance"]["gemm-ws"]
    assert (origin["kind"], origin["measurement_count"]) == ("calibrated", len(RUNS))
    for f in profile["figures"]["gemm-ws"]:
        name = f["figure"].removeprefix("gemm_ws.")
        assert f["status"] == ("calibrated" if fitted[name]["identifiable"] else "estimated")
    provenance = profile["calibration"]
    assert provenance["base_device"] == "rtx-a6000" and provenance["root_device"] == "rtx-a6000"
    assert provenance["measurement_count"] == len(RUNS)
    assert provenance["measurements_digest"] == digest_of(RUNS)
    assert provenance["fitted"] == list(fitted)
    assert provenance["training_error"] == answer["training_error"]
    assert provenance["cross_validation_error"] == answer["cross_validation_error"]


def test_residuals_are_the_stored_profiles_predictions(client: TestClient) -> None:
    answer = calibrate(client)
    machine = machine_of(client.get(f"/devices/{answer['device']}").json())
    residuals = answer["residuals"]
    assert [r["index"] for r in residuals] == list(range(len(RUNS)))
    for r, run in zip(residuals, RUNS, strict=True):
        assert r["measured"] == run["measured_time_us"]
        assert r["predicted"] == pytest.approx(true_time_us(machine, run), abs=1e-9)
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] / r["measured"] - 1))
    errors = [abs(r["error_pct"]) for r in residuals]
    assert answer["training_error"]["mean_abs_pct"] == pytest.approx(sum(errors) / len(errors))
    assert answer["training_error"]["max_abs_pct"] == pytest.approx(max(errors))
    assert answer["cross_validation_error"]["mean_abs_pct"] >= 0


def test_calibrated_profile_serves_optimize_tiling(client: TestClient) -> None:
    answer = calibrate(client)
    machine = machine_of(client.get(f"/devices/{answer['device']}").json())
    r = client.post(
        "/optimize-tiling",
        json={"m": 2048, "n": 1024, "k": 2048, "device": answer["device"], "shortlist": "exploit"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["profile_provenance"] == {
        "kind": "calibrated",
        "measurement_count": len(RUNS),
        "estimated_figures": sorted(
            f"gemm_ws.{f['name']}" for f in answer["fitted"] if not f["identifiable"]
        ),
    }
    expected = brute_force_ranking(GemmShape(2048, 1024, 2048), machine, SearchSpace())[:5]
    got = [(c["tile_m"], c["tile_n"], c["tile_k"], c["buffer_depth"]) for c in body["candidates"]]
    assert got == [
        (s.tiling.tile_m, s.tiling.tile_n, s.tiling.tile_k, s.tiling.buffer_depth) for s in expected
    ]
    assert body["device"] == answer["device"]
    assert body["feedback"]["url"] == f"/devices/{answer['device']}/measurements"
    # each candidate carries its run, ready to post back with a measured time
    for c in body["candidates"]:
        assert c["measurement"] == {
            "m": 2048, "n": 1024, "k": 2048, "dtype": "fp16", "tile_m": c["tile_m"],
            "tile_n": c["tile_n"], "tile_k": c["tile_k"], "buffer_depth": c["buffer_depth"],
        }  # fmt: skip


def test_same_base_and_runs_give_the_same_id_in_any_order(client: TestClient) -> None:
    first = calibrate(client)
    shuffled = RUNS[:]
    random.Random(5).shuffle(shuffled)
    again = calibrate(client, measurements=shuffled)
    assert again["device"] == first["device"] and again["created"] is False
    assert again["fitted"] == first["fitted"]
    # residuals follow the request's order
    assert [r["measured"] for r in again["residuals"]] == [r["measured_time_us"] for r in shuffled]
    # other runs, another fit set, another base: other ids
    assert calibrate(client, measurements=RUNS[:-1])["device"] != first["device"]
    assert calibrate(client, fit=["t_init_us", "t_epilogue_us"])["device"] != first["device"]
    inline = {
        "sm_count": 84, "t_init_us": 1.68, "t_epilogue_us": 1.543,
        "load_startup_latency_us": 0.77, "compute_startup_latency_us": 0.0,
        "load_throughput_elements_per_us": 152.96, "compute_throughput_macs_per_us": 24610.0,
        "shared_memory_per_block_bytes": 101376,
    }  # fmt: skip
    other = calibrate(client, base_device=None, base_device_params=inline)
    assert other["device"].startswith("inline-cal-") and other["base_device"] == "inline"


def test_listing_shows_provenance_and_aliases(client: TestClient) -> None:
    answer = calibrate(client, name="lab-gpu")
    assert answer["name"] == "lab-gpu"
    listing = {d["id"]: d for d in client.get("/devices").json()["devices"]}
    entry = listing[answer["device"]]
    assert entry["aliases"] == ["lab-gpu"] and entry["models"] == ["gemm-ws", "many-bsp"]
    assert entry["calibration"]["base_device"] == "rtx-a6000"
    assert entry["calibration"]["measurement_count"] == len(RUNS)
    assert entry["calibration"]["created_at"]
    assert listing["rtx-a6000"]["calibration"] is None
    assert client.get("/devices/lab-gpu").json()["id"] == answer["device"]


def test_a_name_is_not_taken_twice(client: TestClient) -> None:
    calibrate(client, name="bench-gpu")
    calibrate(client, name="bench-gpu")  # same content: fine
    r = client.post(
        "/calibrate",
        json={"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS[:20],
              "name": "bench-gpu"},
    )  # fmt: skip
    assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["field"] == "name"
    assert "recalibrate" in r.json()["errors"][0]["reason"]
    for shipped_or_id in ("rtx-a6000", calibrate(client)["device"]):
        r = client.post(
            "/calibrate",
            json={"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS,
                  "name": shipped_or_id},
        )  # fmt: skip
        assert r.status_code == 409 and r.json()["errors"][0]["field"] == "name"


def test_shipped_profile_files_never_change(client: TestClient) -> None:
    before = {p.name: p.read_bytes() for p in PROFILE_DIR.glob("*.json")}
    answer = calibrate(client, name="file-check")
    client.post(
        "/devices/rtx-a6000/measurements", json={"model": "gemm-ws", "measurements": RUNS[:10]}
    )
    assert client.post("/devices/rtx-a6000/recalibrate").status_code == 200
    assert client.post(f"/devices/{answer['device']}/recalibrate").status_code == 200
    after = {p.name: p.read_bytes() for p in PROFILE_DIR.glob("*.json")}
    assert after == before
    assert client.get("/devices/rtx-a6000").json()["gemm_ws"]["t_init_us"]["value"] == 1.68


def test_recalibration_never_serves_a_stale_answer(client: TestClient) -> None:
    first = calibrate(client, name="cache-gpu", measurements=RUNS[:14])
    problem = {"m": 4096, "n": 1024, "k": 1024, "device": "cache-gpu"}
    r1 = client.post("/optimize-tiling", json=problem)
    assert r1.headers["x-cache"] == "miss" and r1.json()["device"] == first["device"]
    assert client.post("/optimize-tiling", json=problem).headers["x-cache"] == "hit"
    # the answer's feedback URLs name the device as the request did: the name
    feedback = r1.json()["feedback"]
    assert feedback["url"] == "/devices/cache-gpu/measurements"
    added = client.post(feedback["url"], json={"model": "gemm-ws", "measurements": RUNS[14:]})
    assert added.status_code == 200 and added.json()["total"] == len(RUNS)
    second = client.post(feedback["recalibrate_url"]).json()
    assert second["device"] != first["device"] and second["name"] == "cache-gpu"
    # the refit from every recorded run is the same profile /calibrate makes from them
    assert second["device"] == calibrate(client, measurements=RUNS)["device"]
    r2 = client.post("/optimize-tiling", json=problem)
    assert r2.headers["x-cache"] == "miss" and r2.json()["device"] == second["device"]
    machine = machine_of(client.get("/devices/cache-gpu").json())
    best = brute_force_ranking(GemmShape(4096, 1024, 1024), machine, SearchSpace())[0]
    assert r2.json()["best"]["predicted_time_us"] == best.overall_time_ns / 1000


def test_measurements_of_a_shipped_profile_make_a_calibrated_child(client: TestClient) -> None:
    # a run that cannot have run on the device is refused, naming it: the A100 has no fp8 rate
    fp8_run = {**RUNS[0], "dtype": "fp8"}
    r = client.post(
        "/devices/a100/measurements", json={"model": "gemm-ws", "measurements": [fp8_run]}
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "measurements.0.dtype"
    assert client.get("/devices/a100/measurements").json()["gemm_ws"] == []
    before = len(client.get("/devices/rtx-a6000/measurements").json()["gemm_ws"])
    fresh = gemm_ws_runs(seed=17)[:8]  # runs never posted before: identical ones are kept once
    r = client.post(
        "/devices/rtx-a6000/measurements", json={"model": "gemm-ws", "measurements": fresh}
    )
    assert r.status_code == 200 and r.json()["added"] == 8
    record = client.get("/devices/rtx-a6000/measurements").json()["gemm_ws"]
    assert record[before:] == fresh
    child = client.post("/devices/rtx-a6000/recalibrate", json={"fit": ["t_init_us"]}).json()
    assert CALIBRATED_ID.match(child["device"]) and child["base_device"] == "rtx-a6000"
    assert child["measurement_count"] == len(record)


def test_a_new_service_over_the_same_store_serves_what_was_made() -> None:
    """Everything a calibration makes lives in the store, none of it in the process: a service
    restarted over the same store (durable backends: app/store) serves it all."""
    store = MemoryStore()
    first_app = create_app(_settings())
    first_app.state.service.store = store
    with TestClient(first_app) as first:
        made = calibrate(first, name="kept-gpu", measurements=RUNS[:20])
        first.post(
            "/devices/kept-gpu/measurements", json={"model": "gemm-ws", "measurements": RUNS[20:]}
        )
        profile = first.get(f"/devices/{made['device']}").json()
    second_app = create_app(_settings())
    second_app.state.service.store = store
    with TestClient(second_app) as second:
        assert second.get("/devices/kept-gpu").json() == profile
        assert len(second.get("/devices/kept-gpu/measurements").json()["gemm_ws"]) == len(RUNS)
        r = second.post(
            "/optimize-tiling", json={"m": 512, "n": 512, "k": 512, "device": "kept-gpu"}
        )
        assert r.status_code == 200 and r.json()["device"] == made["device"]
        again = second.post("/devices/kept-gpu/recalibrate").json()
        assert again["measurement_count"] == len(RUNS)


def test_unknown_device_in_the_path_is_404(client: TestClient) -> None:
    for method, path, body in [
        ("get", "/devices/nope", None),
        ("get", "/devices/nope/measurements", None),
        ("post", "/devices/nope/measurements", {"model": "gemm-ws", "measurements": RUNS[:1]}),
        ("post", "/devices/nope/recalibrate", None),
    ]:
        r = client.request(method.upper(), path, json=body)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["errors"][0]["field"] == "device"
        assert "rtx-a6000" in r.json()["errors"][0]["reason"]  # lists the known ids


def test_recalibrating_a_device_without_runs_says_what_to_do(client: TestClient) -> None:
    r = client.post("/devices/940mx/recalibrate")
    # 409: a well-formed request the device's state (no runs yet) cannot serve (not a 422:
    # the body is valid)
    assert r.status_code == 409 and r.json()["errors"][0]["field"] == "model"
    assert "/devices/940mx/measurements" in r.json()["errors"][0]["reason"]


def test_a_profile_of_estimated_gemm_ws_figures_is_calibrated_from_its_listed_call(
    client: TestClient,
) -> None:
    """h100 ships GeMM-WS figures estimated from public peaks, with priors: GET /devices/h100
    lists all six as estimates to calibrate; the listed call, with runs timed on a hidden
    H100, makes a profile that /optimize-tiling serves, its figures those of the hidden GPU."""
    shipped = client.get("/devices/h100").json()
    assert all(f["estimate"] and f["prior"] for f in shipped["gemm_ws"].values())
    listing = shipped["needs_calibration"]["gemm-ws"]
    assert listing["status"] == "uncalibrated-estimates"
    assert {f["figure"] for f in listing["figures"]} == {f"gemm_ws.{n}" for n in GEMM_FIGURES}
    hardware = shipped["hardware"]
    truth = dataclasses.replace(
        TRUE_GEMM,
        sm_count=int(hardware["sm_count"]["value"]),
        shared_memory_per_block_bytes=int(hardware["shared_memory_per_block_bytes"]["value"]),
    )
    runs = gemm_ws_runs(seed=3, machine=truth)
    call = listing["calibrate"]
    r = client.request(call["method"], call["path"], json={**call["body"], "measurements": runs})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["device"].startswith("h100-cal-")
    fitted = {f["name"]: f for f in answer["fitted"]}
    for name in ("load_throughput_elements_per_us", "compute_throughput_macs_per_us"):
        assert fitted[name]["identifiable"]
        assert fitted[name]["base_value"] == shipped["gemm_ws"][name]["value"]
        assert fitted[name]["value"] == pytest.approx(getattr(truth, name), rel=0.1)
    profile = client.get(f"/devices/{answer['device']}").json()
    for name, figure in fitted.items():
        stored = profile["gemm_ws"][name]
        # every figure is the MAP fit's, cited; not determined: flagged as an estimate
        assert stored["estimate"] == figure["estimate"] == (not figure["identifiable"])
        assert stored["source"].startswith("fitted")
    # fitted to runs: "calibrated", whether or not the runs determined every figure
    assert profile["needs_calibration"]["gemm-ws"]["status"] == "calibrated"
    assert profile["hardware"] == hardware
    # fitted under the h100's default pipeline model (estimated figures on sm_90: async-copy),
    # which answers on the calibrated profile by default
    assert answer["pipeline_model"] == "async-copy"
    problem = {"m": 4096, "n": 4096, "k": 1024, "device": answer["device"]}
    r = client.post("/optimize-tiling", json=problem)
    assert r.status_code == 200 and r.json()["pipeline_model"] == "async-copy", r.text
    # under the paper model it ranks as a brute force on the stored figures does
    r = client.post("/optimize-tiling", json={**problem, "pipeline_model": "paper"})
    assert r.status_code == 200, r.text
    best = brute_force_ranking(GemmShape(4096, 4096, 1024), machine_of(profile), SearchSpace())[0]
    assert r.json()["best"]["predicted_time_us"] == best.overall_time_ns / 1000


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_a_few_runs_answer_200_with_the_rest_held_by_the_priors(
    client: TestClient, count: int
) -> None:
    """A tuner's first runs are accepted. The runs are reproduced within the noise
    the fit reports (two noise sds); every figure they do not determine stays within two
    prior sds of its prior median and is flagged estimate, here and in the stored profile."""
    runs = random.Random(count).sample(RUNS, count)
    r = client.post(
        "/calibrate", json={"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": runs}
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["measurement_count"] == count
    # within the noise: two of the noise sds the fit estimated (the A6000's tight published
    # priors pull against a GPU this far from them)
    assert answer["training_error"]["max_abs_pct"] <= 2 * answer["noise_pct"]
    assert answer["effective_figures"] <= count + 1e-6
    profile = client.get(f"/devices/{answer['device']}").json()
    for f in answer["fitted"]:
        prior = f["prior"]
        assert f["interval_low"] <= f["value"] <= f["interval_high"]
        if not f["identifiable"]:
            assert abs(math.log(f["value"] / prior["median"])) <= 2 * prior["sigma_log"], f
            assert f["estimate"] and profile["gemm_ws"][f["name"]]["estimate"] is True
    for residual in answer["residuals"]:
        assert residual["predicted_low"] <= residual["predicted"] <= residual["predicted_high"]


def test_a_fit_of_few_runs_flags_what_it_did_not_determine(client: TestClient) -> None:
    """Six runs for six figures on v100 (whose GeMM-WS figures are estimates): what the runs
    do not determine stays near its starting value (the prior), flagged estimate in the
    answer and in the stored profile, with a warning; never presented as a measurement."""
    r = client.post(
        "/calibrate", json={"model": "gemm-ws", "base_device": "v100", "measurements": RUNS[:6]}
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    profile = client.get(f"/devices/{answer['device']}").json()
    assert len(answer["fitted"]) == 6
    undetermined = [f for f in answer["fitted"] if not f["identifiable"]]
    assert undetermined  # six runs of one shape family cannot pin six figures
    for f in undetermined:
        assert f["estimate"]
        prior = f["prior"]
        assert abs(math.log(f["value"] / prior["median"])) <= 2 * prior["sigma_log"]
        assert profile["gemm_ws"][f["name"]]["estimate"] is True
        assert any(w.startswith(f"{f['name']} was not determined") for w in answer["warnings"])
    listing = profile["needs_calibration"]["gemm-ws"]
    # calibrated, not "uncalibrated-estimates": the figures held by priors are listed
    assert listing["status"] == "calibrated"


def test_calibrated_ids_and_names_serve_batch_and_pictures(client: TestClient) -> None:
    answer = calibrate(client, name="drawn-gpu")
    items = client.post(
        "/optimize-tiling/batch",
        json={"problems": [{**PROBLEM, "device": answer["device"]},
                           {**PROBLEM, "device": "drawn-gpu"},
                           {**PROBLEM, "device": "no-such-gpu"}]},
    ).json()["items"]  # fmt: skip
    assert [i["status"] for i in items] == ["ok", "ok", "error"]
    assert {i["result"]["device"] for i in items[:2]} == {answer["device"]}
    assert items[2]["error"]["errors"][0]["field"] == "problems.2.device"
    r = client.post("/optimize-tiling", json={**PROBLEM, "device": "drawn-gpu"}, headers=SVG)
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
    # the timeline's total is the calibrated figures' prediction
    best = items[0]["result"]["best"]["predicted_time_us"]
    assert any(f"{best:{spec}}" in r.text for spec in (".1f", ",.1f", ",.3f")), best


def test_a_calibration_can_answer_with_its_picture(client: TestClient) -> None:
    r = client.post(
        "/calibrate",
        json={"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS[:12]},
        headers=SVG,
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/svg+xml" and r.headers["vary"] == "Accept"
    assert Svg.parse(r.content).markers("points") == 12
    # the profile was stored all the same, and Location names it
    made = client.get(r.headers["location"])
    assert made.status_code == 200 and made.json()["calibration"]["measurement_count"] == 12
    as_json = client.post(
        "/calibrate",
        json={"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS[:12]},
    )
    assert as_json.headers["location"] == f"/devices/{as_json.json()['device']}"
    assert as_json.headers["location"] == r.headers["location"]  # same runs, same profile
    refit = client.post(f"{r.headers['location']}/recalibrate", headers=SVG)
    assert refit.status_code == 200 and refit.headers["content-type"] == "image/svg+xml"
    assert Svg.parse(refit.content).markers("points") == 12


def test_the_fit_as_a_picture_plots_every_run_against_the_json_answer(
    client: TestClient,
) -> None:
    payload = {"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS}
    answer = client.post("/calibrate", json=payload).json()
    response = client.post("/calibrate", json=payload, headers={"Accept": "image/svg+xml"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("image/svg+xml")
    root = ElementTree.fromstring(response.content)
    groups = {g.get("id"): g for g in root.iter("{http://www.w3.org/2000/svg}g")}
    # one marker per run, in the scatter and in the residuals
    for gid in ("points", "residuals"):
        markers = [u for u in groups[gid].iter() if u.tag.endswith("use")]
        assert len(markers) == len(answer["residuals"]) == len(RUNS)
    assert "identity" in groups
    # the title states the JSON answer's mean absolute error
    summary = "".join(groups["summary"].itertext())
    assert f"{answer['training_error']['mean_abs_pct']:.2f}" in summary
