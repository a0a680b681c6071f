"""A service many pipelines share (issue 20), against a real ``kperf serve`` on a real SQLite
file and a real Redis: tokens, ownership, caps enforced by the store's own transaction.

Oracles: the answers a tenant got before another tenant's attempts (unchanged afterwards), the
store's own rows/keys (nothing left by a refused write), and arithmetic on the cap (8 posts of
50 distinct runs against a cap of 100: exactly two fit)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.auth import hash_token
from tests.app.calibration_helpers import gemm_ws_runs
from tests.app.redis_helpers import redis_server
from tests.app.service_helpers import start_server, stop_server

__all__ = ["redis_server"]

TOKENS = {"alice": "write", "bob": "write", "rita": "read", "root": "admin"}
CAP_RUNS = 100
CAP_PROFILES = 2
PROBLEM = {"m": 4096, "n": 4096, "k": 4096, "device": "a-gpu"}


def _token(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer token-of-{tenant}-0123456789"}


def _distinct_runs(seed: int, count: int) -> list[dict[str, Any]]:
    # measured times carry seeded noise: different seeds, different runs (different digests)
    runs = gemm_ws_runs(seed) + gemm_ws_runs(seed + 1000)
    return runs[:count]


@pytest.fixture(params=["sqlite", "redis"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "# sha256 tenant role\n"
        + "".join(
            f"{hash_token(_token(t)['Authorization'][7:])} {t} {role}\n"
            for t, role in TOKENS.items()
        )
    )
    if request.param == "sqlite":
        path = tmp_path / "store.sqlite3"
        url = f"sqlite://{path}"

        def keys() -> set[str]:
            with sqlite3.connect(path) as conn:
                rows = conn.execute("SELECT namespace, key FROM store_entries").fetchall()
            return {f"{ns}/{k}" for ns, k in rows if not ns.startswith(("results", "locks"))}
    else:
        server = request.getfixturevalue("redis_server")
        if server.proc is None:
            server.start()
        server.flush()
        url = server.url
        client = redis.Redis.from_url(url)

        def keys() -> set[str]:
            listed: list[bytes] = client.keys("*")  # type: ignore[assignment]
            found = {k.decode() for k in listed}
            return {k for k in found if ":results:" not in k and ":locks:" not in k}

    proc, base = start_server(
        {
            "KPERF_STORE_URL": url,
            "KPERF_TOKENS_FILE": str(tokens),
            "KPERF_MAX_CALIBRATION_MEASUREMENTS": str(CAP_RUNS),
            "KPERF_MAX_PROFILES_PER_TENANT": str(CAP_PROFILES),
            "KPERF_WORKERS": "2",
        }
    )
    try:
        yield base, keys
    finally:
        stop_server(proc)


def _problem(response: httpx.Response, status: int, field: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert field in [e["field"] for e in body["errors"]], body
    return body


def test_tenants_own_their_devices(server: tuple[str, Any]) -> None:
    base, keys = server
    with httpx.Client(base_url=base, timeout=120) as http:
        runs = _distinct_runs(1, 36)
        calibrate = {"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": runs}
        # no token, or a read-only one: nothing is written
        _problem(http.post("/calibrate", json=calibrate), 401, "authorization")
        _problem(
            http.post("/calibrate", json=calibrate, headers=_token("rita")), 403, "authorization"
        )
        before = keys()
        made = http.post("/calibrate", json={**calibrate, "name": "a-gpu"}, headers=_token("alice"))
        assert made.status_code == 200, made.text
        device = made.json()["device"]
        answer = http.post("/optimize-tiling", json=PROBLEM).json()  # reads need no token
        record = http.get(f"/devices/{device}/measurements").json()
        assert keys() > before
        history = http.get(f"/devices/{device}").json()["history"]
        assert (history["owner"], history["recorded_runs"]) == ("alice", len(runs))
        assert history["fit_measurement_count"] == len(runs) and history["fitted"]
        assert history["training_error"] == made.json()["training_error"]
        # issue 16: which figures moved from their priors, against the fit's answer
        fitted = {f["name"]: f for f in made.json()["fitted"]}
        for row in history["figures_vs_priors"]:
            figure = fitted[row["figure"]]
            assert row["fitted"] == figure["value"]
            assert row["prior"] == figure["prior"]["median"]
            assert row["determined"] == figure["identifiable"]

        # bob can neither post to, refit, rename nor delete alice's device
        post = {"model": "gemm-ws", "measurements": [{**runs[0], "measured_time_us": 0.01}]}
        bob = _token("bob")
        _problem(
            http.post(f"/devices/{device}/measurements", json=post, headers=bob), 403, "device"
        )
        _problem(http.post("/devices/a-gpu/recalibrate", headers=bob), 403, "device")
        _problem(http.delete(f"/devices/{device}", headers=bob), 403, "device")
        _problem(http.delete("/devices/a-gpu/measurements/batches/fit", headers=bob), 403, "device")
        taken = http.post(
            "/calibrate",
            json={**calibrate, "name": "a-gpu", "measurements": _distinct_runs(7, 36)},
            headers=bob,
        )
        _problem(taken, 409, "name")
        assert http.post("/optimize-tiling", json=PROBLEM).json()["best"] == answer["best"]
        assert http.get(f"/devices/{device}/measurements").json() == record

        # a shipped profile's record is nobody's: bob's runs go to his own draft of it, and
        # refitting that makes bob's device, which alice cannot touch
        added = http.post(
            "/devices/rtx-a6000/measurements",
            json={"model": "gemm-ws", "measurements": _distinct_runs(3, 36)},
            headers=bob,
        )
        assert added.status_code == 200, added.text
        assert added.json()["added"] == 36
        assert (
            http.get("/devices/rtx-a6000/measurements", headers=_token("alice")).json()["gemm_ws"]
            == []
        )
        refit = http.post("/devices/rtx-a6000/recalibrate", headers=bob)
        assert refit.status_code == 200, refit.text
        bobs = refit.json()["device"]
        _problem(http.delete(f"/devices/{bobs}", headers=_token("alice")), 403, "device")
        _problem(http.delete("/devices/rtx-a6000", headers=_token("root")), 403, "device")

        # the owner deletes: the device, its record and its name are gone, nothing left over
        gone = http.delete("/devices/a-gpu", headers=_token("alice"))
        assert gone.status_code == 200 and gone.json()["names"] == ["a-gpu"], gone.text
        assert http.get(f"/devices/{device}").status_code == 404
        assert not [k for k in keys() if device in k or "a-gpu" in k]


def test_identical_runs_are_stored_once(server: tuple[str, Any]) -> None:
    base, _ = server
    alice = _token("alice")
    with httpx.Client(base_url=base, timeout=60, headers=alice) as http:
        runs = _distinct_runs(5, 10)
        post = {"model": "gemm-ws", "measurements": runs}
        first = http.post("/devices/rtx-a6000/measurements", json=post).json()
        again = http.post("/devices/rtx-a6000/measurements", json=post).json()
        assert (first["added"], first["total"]) == (10, 10)
        assert (again["added"], again["duplicates"], again["total"]) == (0, 10, 10)
        record = http.get("/devices/rtx-a6000/measurements").json()
        assert record["gemm_ws_digests"] == first["digests"] == again["digests"]
        one = http.delete(f"/devices/rtx-a6000/measurements/runs/{first['digests'][3]}").json()
        assert (one["deleted"], one["total"]) == (1, 9)
        record = http.get("/devices/rtx-a6000/measurements").json()
        assert record["gemm_ws"] == runs[:3] + runs[4:]
        left = http.delete(f"/devices/rtx-a6000/measurements/batches/{first['batch']}").json()
        assert (left["deleted"], left["total"]) == (9, 0)
        assert http.get("/devices/rtx-a6000/measurements").json()["gemm_ws"] == []


def test_concurrent_posts_never_pass_the_cap(server: tuple[str, Any]) -> None:
    base, _ = server

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=120, headers=_token("alice")) as http:
            posts = [
                http.post("/devices/rtx-a6000/measurements",
                          json={"model": "gemm-ws", "measurements": _distinct_runs(10 * i, 50)})
                for i in range(1, 9)
            ]  # fmt: skip
            return list(await asyncio.gather(*posts))

    answers = asyncio.run(scenario())
    ok = sorted(a.json()["total"] for a in answers if a.status_code == 200)
    assert ok == [50, 100], [a.text for a in answers]
    for refused in (a for a in answers if a.status_code != 200):
        body = _problem(refused, 409, "measurements")
        assert (body["errors"][0]["cap"], body["errors"][0]["total"]) == (CAP_RUNS, 100)
    with httpx.Client(base_url=base, timeout=120, headers=_token("alice")) as http:
        assert len(http.get("/devices/rtx-a6000/measurements").json()["gemm_ws"]) == 100
        # a device at its cap still refits
        refit = http.post("/devices/rtx-a6000/recalibrate")
        assert refit.status_code == 200, refit.text
        assert refit.json()["measurement_count"] == 100


def test_oversized_text_and_refused_calibrations_leave_nothing(server: tuple[str, Any]) -> None:
    base, keys = server
    with httpx.Client(base_url=base, timeout=120, headers=_token("bob")) as http:
        profile = http.get("/devices/rtx-a6000").json()
        profile.pop("needs_calibration")
        inline = {"model": "many-bsp", "measurements": [{"ptx": "x"}]}
        empty = keys()
        for field, size in (("name", 201), ("description", 4001)):
            huge = {**inline, "base_device_params": {**profile, field: "n" * size}}
            body = _problem(http.post("/calibrate", json=huge), 422, "base_device_params")
            reason = next(e["reason"] for e in body["errors"] if e["field"] == "base_device_params")
            assert f"{field}: " in reason and str(size - 1) in reason, reason
        _problem(http.post("/calibrate", json={**inline, "name": "n" * 65}), 422, "name")
        assert keys() == empty
        made = []
        for seed in range(CAP_PROFILES + 1):
            runs = _distinct_runs(100 + seed, 36)
            before = keys()
            answer = http.post(
                "/calibrate",
                json={"model": "gemm-ws", "base_device": "rtx-a6000", "measurements": runs},
            )
            made.append(answer)
        assert [a.status_code for a in made] == [200] * CAP_PROFILES + [409], made[-1].text
        body = _problem(made[-1], 409, "device")
        assert (body["errors"][0]["cap"], body["errors"][0]["total"]) == (CAP_PROFILES, 2)
        assert keys() == before  # the refused one left no key or row
        gone = http.delete(f"/devices/{made[0].json()['device']}")
        assert gone.status_code == 200, gone.text
        again = http.post(
            "/calibrate",
            json={"model": "gemm-ws", "base_device": "rtx-a6000",
                  "measurements": _distinct_runs(100 + CAP_PROFILES, 36)},
        )  # fmt: skip
        assert again.status_code == 200, again.text
