"""Calibrated profiles, their names and measured runs live in the shared store: they survive a
restart on a durable store (SQLite through KPERF_STORE_URL or KPERF_CACHE_PATH), and a profile
calibrated on one replica is served by another sharing a real Redis. Cached answers never
outlive a recalibration: the profile's content is part of every cache key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from device_profiles.loader import PROFILE_DIR
from tests.app.calibration_helpers import (
    TRUE_MANY_BSP,
    gemm_ws_runs,
    many_bsp_runs,
    paper_launches,
    true_many_bsp_figures,
)
from tests.app.redis_helpers import RedisServer, redis_server
from tests.app.service_helpers import clean_environ, servers

__all__ = ["clean_environ", "redis_server"]

RUNS = gemm_ws_runs()
PROBLEM = {"m": 2048, "n": 512, "k": 1024}


def _settings(how: str, path: Path) -> Settings:
    if how == "store_url":
        return Settings(workers=1, log_level="WARNING", store_url=f"sqlite://{path}")
    return Settings(workers=1, log_level="WARNING", cache_path=path)


@pytest.fixture
def files_before() -> Iterator[dict[str, bytes]]:
    before = {p.name: p.read_bytes() for p in PROFILE_DIR.glob("*.json")}
    yield before
    assert {p.name: p.read_bytes() for p in PROFILE_DIR.glob("*.json")} == before


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("how", ["store_url", "cache_path"])
def test_calibrations_survive_a_restart_on_sqlite(
    tmp_path: Path, how: str, files_before: dict[str, bytes]
) -> None:
    path = tmp_path / "kperf.sqlite3"
    with TestClient(create_app(_settings(how, path))) as first:
        assert first.get("/readyz").json()["store"]["backend"] == "sqlite"
        made = _ok(
            first.post(
                "/calibrate",
                json={"model": "gemm-ws", "base_device": "rtx-a6000", "name": "lab-gpu",
                      "measurements": RUNS[:20]},
            )
        )  # fmt: skip
        more = {"model": "gemm-ws", "measurements": RUNS[20:]}
        _ok(first.post("/devices/lab-gpu/measurements", json=more))
        profile = _ok(first.get("/devices/lab-gpu"))
        record = _ok(first.get("/devices/lab-gpu/measurements"))
        listing = _ok(first.get("/devices"))
        r = first.post("/optimize-tiling", json={**PROBLEM, "device": "lab-gpu"})
        answer = _ok(r)
        assert r.headers["x-cache"] == "miss" and answer["device"] == made["device"]
    assert path.stat().st_size > 0

    with TestClient(create_app(_settings(how, path))) as second:
        # the same profile, name, record and listing, read back from the file
        assert _ok(second.get("/devices/lab-gpu")) == profile
        assert _ok(second.get(f"/devices/{made['device']}")) == profile
        assert _ok(second.get("/devices/lab-gpu/measurements")) == record
        assert len(record["gemm_ws"]) == len(RUNS)
        assert _ok(second.get("/devices")) == listing
        # the cached answer for the name is in the file too
        r = second.post("/optimize-tiling", json={**PROBLEM, "device": "lab-gpu"})
        assert r.headers["x-cache"] == "hit" and r.json() == answer
        # recalibrating moves the name: the same request is a miss, answered on the new figures
        again = _ok(second.post("/devices/lab-gpu/recalibrate"))
        assert again["device"] != made["device"] and again["measurement_count"] == len(RUNS)
        r = second.post("/optimize-tiling", json={**PROBLEM, "device": "lab-gpu"})
        assert r.headers["x-cache"] == "miss" and r.json()["device"] == again["device"]
        assert r.json()["best"]["predicted_time_us"] != answer["best"]["predicted_time_us"]
        # the old id still names the old profile: the old figures' answer
        old = _ok(second.post("/optimize-tiling", json={**PROBLEM, "device": made["device"]}))
        assert old["device"] == made["device"] and old["best"] == answer["best"]

    with TestClient(create_app(_settings(how, path))) as third:
        assert _ok(third.get("/devices/lab-gpu"))["id"] == again["device"]


def test_an_in_memory_store_forgets_on_restart() -> None:
    """The contrast: without a durable store nothing a calibration made outlives the process
    (so the test above would fail without the SQLite file)."""
    settings = Settings(workers=1, log_level="WARNING")
    assert settings.effective_store_url == "memory://"
    with TestClient(create_app(settings)) as first:
        made = _ok(
            first.post(
                "/calibrate",
                json={"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": RUNS},
            )
        )
    with TestClient(create_app(settings)) as second:
        assert second.get(f"/devices/{made['device']}").status_code == 404


@pytest.fixture(scope="module")
def replicas(redis_server: RedisServer) -> Iterator[tuple[str, str]]:
    """Two real `kperf serve` processes sharing the module's Redis."""
    with servers(2, {"KPERF_STORE_URL": redis_server.url}) as (url_a, url_b):
        yield url_a, url_b


def test_a_profile_calibrated_on_one_replica_serves_on_the_other(
    replicas: tuple[str, str], files_before: dict[str, bytes]
) -> None:
    url_a, url_b = replicas
    with (
        httpx.Client(base_url=url_a, timeout=120) as a,
        httpx.Client(base_url=url_b, timeout=120) as b,
    ):
        assert a.get("/readyz").json()["store"]["backend"] == "redis"
        # GeMM-WS on A, named
        made = _ok(
            a.post(
                "/calibrate",
                json={"model": "gemm-ws", "base_device": "rtx-a6000", "name": "shared-gpu",
                      "measurements": RUNS[:20]},
            )
        )  # fmt: skip
        assert _ok(b.get("/devices/shared-gpu")) == _ok(a.get(f"/devices/{made['device']}"))
        assert "shared-gpu" in [
            alias for d in _ok(b.get("/devices"))["devices"] for alias in d["aliases"]
        ]
        first = b.post("/optimize-tiling", json={**PROBLEM, "device": "shared-gpu"})
        assert _ok(first)["device"] == made["device"] and first.headers["x-cache"] == "miss"
        hit = a.post("/optimize-tiling", json={**PROBLEM, "device": "shared-gpu"})
        assert hit.headers["x-cache"] == "hit" and hit.content == first.content
        batch = _ok(
            b.post(
                "/optimize-tiling/batch",
                json={"problems": [{**PROBLEM, "device": made["device"]},
                                   {**PROBLEM, "device": "shared-gpu", "top_k": 2}]},
            )
        )  # fmt: skip
        assert [i["status"] for i in batch["items"]] == ["ok", "ok"]
        assert {i["result"]["device"] for i in batch["items"]} == {made["device"]}
        # runs posted to B are A's to refit from; the name moves, on both replicas
        more = {"model": "gemm-ws", "measurements": RUNS[20:]}
        _ok(b.post("/devices/shared-gpu/measurements", json=more))
        again = _ok(a.post("/devices/shared-gpu/recalibrate"))
        assert again["measurement_count"] == len(RUNS) and again["device"] != made["device"]
        assert _ok(b.get("/devices/shared-gpu"))["id"] == again["device"]
        fresh = b.post("/optimize-tiling", json={**PROBLEM, "device": "shared-gpu"})
        assert fresh.headers["x-cache"] == "miss" and _ok(fresh)["device"] == again["device"]

        # Many-BSP on B from v100 (no mu, no launch overheads), predicted on A
        shipped = _ok(b.get("/devices/v100"))
        truth = true_many_bsp_figures(shipped)
        kernel = _ok(
            b.post(
                "/calibrate",
                json={"model": "many-bsp", "base_device": "v100",
                      "measurements": many_bsp_runs(truth)},
            )
        )  # fmt: skip
        mu = next(f for f in kernel["fitted"] if f["name"] == "mu")
        assert mu["identifiable"] and mu["value"] == pytest.approx(TRUE_MANY_BSP["mu"], rel=0.1)
        launch = paper_launches()[2]
        predicted = _ok(a.post("/predict-kernel", json={**launch, "device": kernel["device"]}))
        assert predicted["device"] == kernel["device"] and predicted["predicted_cycles"] > 0
        # the shipped profile answers on its estimates; the calibrated one on the fit
        shipped_answer = _ok(b.post("/predict-kernel", json={**launch, "device": "v100"}))
        assert shipped_answer["profile_provenance"]["kind"] == "estimated"
        assert predicted["profile_provenance"]["kind"] == "calibrated"
