"""The device routes while the shared store is down: shipped profiles still answer (listing,
detail, /optimize-tiling, /predict-kernel), the listing says that the calibrated profiles are
unavailable and why, and a calibrated id or name is a 503 naming the request's field.

The store is a real SQLite file: a profile is calibrated into it, then the file is replaced
by garbage while no service holds it open, so the next service finds "not a database"; its
contents put back, the same service lists the calibrated profile again.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.auth import LOCAL
from app.main import create_app
from app.profile_store import ProfileStore
from app.settings import Settings
from app.store import MemoryStore, ResilientStore, StoreUnavailable
from device_profiles import DeviceProfile, default_profiles
from kperf_client import cli
from tests.app.calibration_helpers import gemm_ws_runs
from tests.app.service_helpers import clean_environ

__all__ = ["clean_environ"]

PROFILE_DIR = Path(__file__).resolve().parents[2] / "device_profiles"
KNN = (Path(__file__).resolve().parents[1] / "fixtures" / "ptx" / "paper" / "knn.ptx").read_text()
PROBLEM_JSON = "application/problem+json"
GARBAGE = b"this is not sqlite" * 100
#: the ids of the files in device_profiles/, read here rather than through the loader
SHIPPED_IDS = {json.loads(p.read_text())["id"] for p in PROFILE_DIR.glob("*.json")}
NAME = "lab-gpu"


def _settings(path: Path) -> Settings:
    return Settings(
        workers=1, log_level="WARNING", store_url=f"sqlite://{path}", cache_memory_items=0
    )


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


@dataclass(frozen=True)
class Calibrated:
    path: Path
    #: the database file's bytes with the calibrated profile in it
    good: bytes
    profile_id: str


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Calibrated:
    """A SQLite store holding one calibrated profile named NAME, closed."""
    path = tmp_path_factory.mktemp("store") / "kperf.sqlite3"
    with TestClient(create_app(_settings(path))) as client:
        body = {
            "model": "gemm-ws",
            "base_device": "rtx-a6000",
            "name": NAME,
            "measurements": gemm_ws_runs()[:12],
        }
        profile_id = _ok(client.post("/calibrate", json=body))["device"]
        listed = _ok(client.get("/devices"))
        assert profile_id in {d["id"] for d in listed["devices"]}
    # the service closed its connection: the WAL is checkpointed into the one file
    assert not path.with_name(path.name + "-wal").exists()
    return Calibrated(path=path, good=path.read_bytes(), profile_id=profile_id)


def _break(path: Path) -> None:
    for extra in ("-wal", "-shm"):
        path.with_name(path.name + extra).unlink(missing_ok=True)
    path.write_bytes(GARBAGE)


@pytest.fixture(scope="module")
def down(calibrated: Calibrated, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A service whose store file is not a database (the calibrated one, broken)."""
    path = tmp_path_factory.mktemp("down") / "kperf.sqlite3"
    _break(path)
    with TestClient(create_app(_settings(path))) as client:
        assert client.get("/readyz").json()["store"]["status"] == "degraded: store"
        yield client


def test_the_listing_answers_the_shipped_profiles_and_says_the_stored_ones_are_missing(
    down: TestClient,
) -> None:
    response = down.get("/devices")
    body = _ok(response)
    assert {d["id"] for d in body["devices"]} == SHIPPED_IDS
    assert all(d["calibration"] is None for d in body["devices"])
    stored = body["stored_profiles"]
    assert stored["status"] == "unavailable"
    assert "not a database" in stored["reason"]


@pytest.mark.parametrize("device", ["rtx-a6000", "v100", "gtx-760"])
def test_a_shipped_profile_detail_answers(down: TestClient, device: str) -> None:
    body = _ok(down.get(f"/devices/{device}"))
    assert body["id"] == device
    assert body["hardware"]["sm_count"]["source"]


def test_a_shipped_device_is_solved_and_predicted(down: TestClient) -> None:
    solved = _ok(down.post("/optimize-tiling", json={"m": 1024, "n": 1024, "k": 1024,
                                                      "device": "rtx-a6000"}))  # fmt: skip
    assert solved["device"] == "rtx-a6000" and solved["status"] == "optimal"
    predicted = _ok(
        down.post(
            "/predict-kernel",
            json={
                "ptx": KNN,
                "device": "gtx-760",
                "launch": {"grid": [168, 1, 1], "block": [256, 1, 1]},
                "resources": {"registers_per_thread": 9, "shared_bytes_per_block": 0},
            },
        )
    )
    assert predicted["predicted_cycles"] > 0


def _lookups(profile_id: str) -> list[tuple[str, str, dict[str, Any] | None, str, str]]:
    """(method, path, body, the field the 503 must name, the id it must name)."""
    gemm = {"m": 1024, "n": 1024, "k": 1024}
    launch = {"launch": {"grid": [168, 1, 1], "block": [256, 1, 1]}, "ptx": KNN}
    recal = {"model": "gemm-ws", "base_device": NAME, "measurements": gemm_ws_runs()[:12]}
    return [
        ("GET", f"/devices/{profile_id}", None, "device", profile_id),
        ("GET", f"/devices/{NAME}", None, "device", NAME),
        ("POST", "/optimize-tiling", {**gemm, "device": NAME}, "device", NAME),
        ("POST", "/optimize-tiling", {**gemm, "device": profile_id}, "device", profile_id),
        ("POST", "/predict-kernel", {**launch, "device": profile_id}, "device", profile_id),
        ("POST", "/calibrate", recal, "base_device", NAME),
    ]


def test_a_calibrated_id_or_name_is_a_503_naming_the_field(
    down: TestClient, calibrated: Calibrated
) -> None:
    for method, path, body, field, named in _lookups(calibrated.profile_id):
        response = down.request(method, path, json=body)
        where = f"{method} {path} {field}"
        assert response.status_code == 503, (where, response.text)
        assert response.headers["content-type"] == PROBLEM_JSON, where
        assert int(response.headers["retry-after"]) >= 1, where
        errors = response.json()["errors"]
        assert [e["field"] for e in errors] == [field], where
        reason = errors[0]["reason"]
        # what was asked, that the store could not answer, and the store's own error
        assert named in reason and "not a database" in reason, (where, reason)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"m": 1024, "n": 1024, "k": 1024, "device": 7}, "device"),  # not a string
        ({"m": 0, "n": 1024, "k": 1024, "device": "rtx-a6000"}, "m"),  # out of range
        ({"m": 1024, "n": 1024, "k": 1024}, "device"),  # neither device nor device_params
    ],
)
def test_bad_input_is_still_a_4xx_naming_the_field(
    down: TestClient, body: dict[str, Any], field: str
) -> None:
    response = down.post("/optimize-tiling", json=body)
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    assert field in {e["field"].split(".")[0] for e in response.json()["errors"]}


def test_the_calibrated_profile_is_listed_again_once_the_store_is_back(
    calibrated: Calibrated, tmp_path: Path
) -> None:
    path = tmp_path / "kperf.sqlite3"
    _break(path)
    with TestClient(create_app(_settings(path))) as client:
        first = _ok(client.get("/devices"))
        assert first["stored_profiles"]["status"] == "unavailable"
        path.write_bytes(calibrated.good)
        deadline = time.monotonic() + 10  # the breaker probes again within 2 s
        body = first
        while time.monotonic() < deadline and body["stored_profiles"]["status"] != "ok":
            time.sleep(0.2)
            body = _ok(client.get("/devices"))
        assert body["stored_profiles"] == {"status": "ok", "reason": None}
        listed = {d["id"]: d for d in body["devices"]}
        assert set(listed) == SHIPPED_IDS | {calibrated.profile_id}
        assert listed[calibrated.profile_id]["aliases"] == [NAME]
        assert _ok(client.get(f"/devices/{NAME}"))["id"] == calibrated.profile_id


# ------------------------------------------------------------- ProfileStore, store failing


class SwitchedStore(MemoryStore):
    """In-memory values, and namespaces whose every call raises StoreUnavailable."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()

    def _check(self, namespace: str) -> None:
        if namespace in self.failing:
            raise StoreUnavailable(f"connection refused ({namespace})")

    def get(self, namespace: str, key: str) -> bytes | None:
        self._check(namespace)
        return super().get(namespace, key)

    def keys(self, namespace: str) -> list[str]:
        self._check(namespace)
        return super().keys(namespace)


def _profile_store() -> tuple[ProfileStore, SwitchedStore, str]:
    backend = SwitchedStore()
    shipped = default_profiles()
    copy = DeviceProfile.model_validate(
        {**shipped["v100"].model_dump(), "id": "v100-cal-0123456789ab"}
    )
    profiles = ProfileStore(ResilientStore(backend, backoff_initial_s=1e-6, backoff_max_s=1e-6),
                            shipped)  # fmt: skip
    assert profiles.save(copy, "gemm-ws", [], "local")
    profiles.set_alias("local", "my-v100", copy.id)
    return profiles, backend, copy.id


@pytest.mark.parametrize("failing", [{"profiles"}, {"aliases:local"}])
def test_a_listing_with_part_of_the_store_failing_lists_no_stored_profile(
    failing: set[str],
) -> None:
    profiles, backend, stored_id = _profile_store()
    whole = profiles.listing(LOCAL)
    assert whole.stored_unavailable is None
    assert {p.id for p, _ in whole.profiles} == SHIPPED_IDS | {stored_id}
    backend.failing = failing
    time.sleep(0.01)  # past the breaker's pause: the backend itself is called
    degraded = profiles.listing(LOCAL)
    # all or nothing: never a calibrated profile without its names
    assert {p.id for p, _ in degraded.profiles} == SHIPPED_IDS
    assert degraded.stored_unavailable is not None
    assert "connection refused" in degraded.stored_unavailable


def test_a_stored_lookup_with_the_store_failing_names_the_field() -> None:
    profiles, backend, stored_id = _profile_store()
    backend.failing = {"profiles", "aliases:local"}
    assert profiles.resolve("v100", LOCAL).id == "v100"  # shipped: the store is not asked
    with pytest.raises(StoreUnavailable) as caught:
        profiles.resolve("my-v100", LOCAL, field="base_device")
    assert getattr(caught.value, "field", None) == "base_device"
    assert "my-v100" in str(caught.value)


def test_kperf_devices_warns_that_calibrated_profiles_are_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kperf.sqlite3"
    _break(path)
    monkeypatch.setenv("KPERF_STORE_URL", f"sqlite://{path}")
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["devices"], out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    listed = {line.split()[0] for line in text.splitlines() if line.split()}
    assert SHIPPED_IDS <= listed
    warning = [line for line in text.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "not a database" in warning[0], text


def test_the_schema_documents_the_listing_state_and_the_503() -> None:
    document = create_app(Settings(workers=1, cache_path=None)).openapi()
    schemas = document["components"]["schemas"]
    listing = schemas["DeviceList"]
    assert "stored_profiles" in listing["required"]
    assert listing["properties"]["stored_profiles"].get("description")
    state = schemas[listing["properties"]["stored_profiles"]["$ref"].rsplit("/", 1)[-1]]
    assert set(state["properties"]["status"]["enum"]) == {"ok", "unavailable"}
    assert all(spec.get("description") for spec in state["properties"].values())
    for path, method in [("/devices/{device_id}", "get"), ("/optimize-tiling", "post")]:
        answer = document["paths"][path][method]["responses"]["503"]
        assert "store" in answer["description"] and PROBLEM_JSON in answer["content"], path


def test_a_batch_answers_its_shipped_items_and_names_the_stored_one(down: TestClient) -> None:
    gemm = {"m": 1024, "n": 1024, "k": 1024}
    problems = [{**gemm, "device": "rtx-a6000"}, {**gemm, "device": NAME}]
    items = _ok(down.post("/optimize-tiling/batch", json={"problems": problems}))["items"]
    assert [i["status"] for i in items] == ["ok", "error"]
    error = items[1]["error"]
    assert error["status"] == 503
    assert [e["field"] for e in error["errors"]] == ["problems.1.device"]
    assert NAME in error["errors"][0]["reason"]
