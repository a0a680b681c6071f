"""A service many pipelines share, against a real ``kperf serve`` on a real SQLite
file and a real Redis: tokens, ownership, caps enforced by the store's own transaction.

Oracles: the answers a tenant got before another tenant's attempts (unchanged afterwards), the
store's own rows/keys (nothing left by a refused write), and arithmetic on the cap (8 posts of
50 distinct runs against a cap of 100: exactly two fit)."""

from __future__ import annotations

import asyncio
import json
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
from tests.app.service_helpers import REPO, start_server, stop_server

__all__ = ["redis_server"]

TOKENS = {"alice": "write", "bob": "write", "rita": "read", "root": "admin"}
CAP_RUNS = 100
CAP_PROFILES = 2
#: fits here may wait behind each other on a loaded machine: their speed is not under test
#: (tests/app/test_recalibrate_history.py holds the default limit)
LIMIT = {"time_limit_s": 60}
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
        calibrate = {"model": "gemm-ws", "base_device": "rtx-a6000", **LIMIT, "measurements": runs}
        # no token, or a read-only one: nothing is written
        _problem(http.post("/calibrate", json=calibrate), 401, "authorization")
        _problem(
            http.post("/calibrate", json=calibrate, headers=_token("rita")), 403, "authorization"
        )
        before = keys()
        made = http.post("/calibrate", json={**calibrate, "name": "a-gpu"}, headers=_token("alice"))
        assert made.status_code == 200, made.text
        device = made.json()["device"]
        # reads need no token: by id (names are their tenant's: alice's answers the same)
        answer = http.post("/optimize-tiling", json={**PROBLEM, "device": device}).json()
        by_name = http.post("/optimize-tiling", json=PROBLEM, headers=_token("alice")).json()
        assert by_name["best"] == answer["best"]
        _problem(http.post("/optimize-tiling", json=PROBLEM), 422, "device")
        record = http.get(f"/devices/{device}/measurements").json()
        assert keys() > before
        history = http.get(f"/devices/{device}").json()["history"]
        assert (history["owner"], history["recorded_runs"]) == ("alice", len(runs))
        assert history["fit_measurement_count"] == len(runs) and history["fitted"]
        assert history["training_error"] == made.json()["training_error"]
        # which figures moved from their priors, against the fit's answer
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
        _problem(http.post(f"/devices/{device}/recalibrate", headers=bob), 403, "device")
        _problem(http.delete(f"/devices/{device}", headers=bob), 403, "device")
        _problem(
            http.delete(f"/devices/{device}/measurements/batches/fit", headers=bob), 403, "device"
        )
        # alice's name is not bob's: he reaches nothing by it, and may take it for his own
        _problem(http.post("/devices/a-gpu/recalibrate", headers=bob), 404, "device")
        bobs_name = http.post(
            "/calibrate",
            json={**calibrate, "name": "a-gpu", "measurements": _distinct_runs(7, 36)},
            headers=bob,
        )
        assert bobs_name.status_code == 200 and bobs_name.json()["device"] != device
        assert http.get("/devices/a-gpu", headers=bob).json()["id"] == bobs_name.json()["device"]
        assert http.get("/devices/a-gpu", headers=_token("alice")).json()["id"] == device
        _problem(
            http.delete(f"/devices/{bobs_name.json()['device']}", headers=_token("alice")),
            403,
            "device",
        )
        assert http.delete("/devices/a-gpu", headers=bob).json()["names"] == ["a-gpu"]
        alices = http.post("/optimize-tiling", json=PROBLEM, headers=_token("alice")).json()
        assert alices["best"] == answer["best"]
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
                json={
                    "model": "gemm-ws",
                    "base_device": "rtx-a6000",
                    **LIMIT,
                    "measurements": runs,
                },
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
            json={"model": "gemm-ws", "base_device": "rtx-a6000", **LIMIT,
                  "measurements": _distinct_runs(100 + CAP_PROFILES, 36)},
        )  # fmt: skip
        assert again.status_code == 200, again.text


def _runs_file(name: str) -> list[dict[str, Any]]:
    lines = (REPO / "docs" / "examples" / name).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_the_probes_takeover_by_copied_runs_is_impossible(server: tuple[str, Any]) -> None:
    """The outside probe's finding, step by step: B copies A's runs (reads are open) and
    calibrates them before A recalibrates. A's name keeps pointing at A's own profiles."""
    base, _ = server
    alice, bob = _token("alice"), _token("bob")
    runs = _distinct_runs(21, 13)
    with httpx.Client(base_url=base, timeout=120) as http:
        first = _ok(
            http.post(
                "/calibrate",
                json={"model": "gemm-ws", "base_device": "rtx-a6000", **LIMIT, "name": "a-gpu",
                      "measurements": runs[:9]},
                headers=alice,
            )
        )  # fmt: skip
        _ok(
            http.post(
                "/devices/a-gpu/measurements",
                json={"model": "gemm-ws", "measurements": runs[9:]},
                headers=alice,
            )
        )
        copied = _ok(http.get(f"/devices/{first['device']}/measurements", headers=bob))["gemm_ws"]
        assert sorted(map(json.dumps, copied)) == sorted(map(json.dumps, runs))
        bobs = _ok(
            http.post(
                "/calibrate",
                json={
                    "model": "gemm-ws",
                    "base_device": "rtx-a6000",
                    **LIMIT,
                    "measurements": copied,
                },
                headers=bob,
            )
        )
        assert bobs["created"]
        refit = _ok(http.post("/devices/a-gpu/recalibrate", json={}, headers=alice))
        # the same runs, base and figures: only the owner tells the two profiles apart
        assert refit["measurements_digest"] == bobs["measurements_digest"]
        assert refit["created"] and refit["device"] != bobs["device"]
        named = _ok(http.get("/devices/a-gpu", headers=alice))
        assert (named["id"], named["history"]["owner"]) == (refit["device"], "alice")
        assert _ok(http.get(f"/devices/{bobs['device']}"))["history"]["owner"] == "bob"
        more = {"model": "gemm-ws", "measurements": _distinct_runs(22, 2)}
        _ok(http.post("/devices/a-gpu/measurements", json=more, headers=alice))
        _problem(
            http.post(f"/devices/{refit['device']}/measurements", json=more, headers=bob),
            403,
            "device",
        )


def test_another_tenants_refit_and_delete_leave_a_name_alone(server: tuple[str, Any]) -> None:
    """The probe's second variant, with the README's example runs: B calibrates the same runs,
    adds more, recalibrates and deletes. A's name, profile and answers never change."""
    base, _ = server
    alice, bob = _token("alice"), _token("bob")
    runs, more = _runs_file("runs.jsonl"), _runs_file("more-runs.jsonl")
    calibrate = {"model": "gemm-ws", "base_device": "rtx-a6000", **LIMIT, "measurements": runs}
    problem = {**PROBLEM, "device": "a-mine"}
    with httpx.Client(base_url=base, timeout=120) as http:
        mine = _ok(http.post("/calibrate", json={**calibrate, "name": "a-mine"}, headers=alice))
        answer = _ok(http.post("/optimize-tiling", json=problem, headers=alice))
        theirs = _ok(http.post("/calibrate", json={**calibrate, "name": "a-mine"}, headers=bob))
        assert theirs["created"] and theirs["device"] != mine["device"]
        _ok(
            http.post(
                "/devices/a-mine/measurements",
                json={"model": "gemm-ws", "measurements": more},
                headers=bob,
            )
        )
        refit = _ok(http.post("/devices/a-mine/recalibrate", json={}, headers=bob))
        assert refit["device"] not in (mine["device"], theirs["device"])

        def unchanged() -> None:
            assert _ok(http.get("/devices/a-mine", headers=alice))["id"] == mine["device"]
            again = _ok(http.post("/optimize-tiling", json=problem, headers=alice))
            # everything but the solve's own timing
            assert {**again, "solver": None} == {**answer, "solver": None}

        unchanged()
        _problem(http.delete(f"/devices/{mine['device']}", headers=bob), 403, "device")
        gone = _ok(http.delete("/devices/a-mine", headers=bob))
        assert (gone["device"], gone["names"]) == (refit["device"], ["a-mine"])
        _problem(http.get("/devices/a-mine", headers=bob), 404, "device")
        unchanged()
        assert _ok(http.get(f"/devices/{theirs['device']}"))["history"]["owner"] == "bob"


def test_an_unknown_device_answer_is_bounded_and_lists_nobodys_ids(
    server: tuple[str, Any],
) -> None:
    base, _ = server
    with httpx.Client(base_url=base, timeout=120) as http:
        made = _ok(
            http.post(
                "/calibrate",
                json={"model": "gemm-ws", "base_device": "rtx-a6000", **LIMIT, "name": "secret-gpu",
                      "measurements": _distinct_runs(31, 9)},
                headers=_token("alice"),
            )
        )  # fmt: skip
        long_id = "x" * 10_000
        asked = [
            (http.get(f"/devices/{long_id}", headers=_token("bob")), 404),
            (http.post("/optimize-tiling", json={**PROBLEM, "device": "y" * 100}), 422),
            (http.get("/devices/secret-gpu", headers=_token("bob")), 404),
        ]
        for response, status in asked:
            body = _problem(response, status, "device")
            assert len(response.content) < 2_000, len(response.content)
            assert made["device"] not in response.text  # nobody's ids but the shipped ones
            assert "GET /devices" in body["detail"]
        assert "x" * 64 + "... (10000 characters)" in asked[0][0].text
        assert "secret-gpu" not in asked[0][0].text + asked[1][0].text


def test_runs_racing_a_delete_are_stored_before_it_or_refused(server: tuple[str, Any]) -> None:
    """Posts racing the profile's DELETE: each one either landed before it (and went with
    the profile) or was refused; nothing of the device is left in the store."""
    base, keys = server
    alice = _token("alice")
    with httpx.Client(base_url=base, timeout=120, headers=alice) as http:
        made = _ok(
            http.post(
                "/calibrate",
                json={"model": "gemm-ws", "base_device": "rtx-a6000", **LIMIT,
                      "measurements": _distinct_runs(41, 9)},
            )
        )  # fmt: skip
    device = made["device"]

    async def race() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=120, headers=alice) as client:
            posts = [
                client.post(f"/devices/{device}/measurements",
                            json={"model": "gemm-ws", "measurements": _distinct_runs(50 + i, 3)})
                for i in range(12)
            ]  # fmt: skip
            *answers, deleted = await asyncio.gather(*posts, client.delete(f"/devices/{device}"))
            return answers, deleted

    answers, deleted = asyncio.run(race())
    assert deleted.status_code == 200, deleted.text
    for answer in answers:
        assert answer.status_code in (200, 404), answer.text
    assert not [k for k in keys() if device in k]
