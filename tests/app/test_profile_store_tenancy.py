"""The profile store's tenancy on the service's own stores (memory, real SQLite, real Redis):
a store of the layout before tenant namespaces is migrated (names to their owner's namespace,
one-value-per-batch records to runs by digest, counters kept), and idle profiles and drafts
expire unless used meanwhile. Oracles: the runs and names written in the old layout, read back
through the new one; the store's own keys (nothing of an expired record left)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from app.auth import LOCAL, Principal
from app.expiry import IdleExpiry
from app.profile_store import (
    LAST_USED,
    LEGACY_ALIASES,
    OWNERS,
    PROFILES,
    ProfileStore,
    aliases_namespace,
    runs_namespace,
)
from app.store import Store
from device_profiles import DeviceProfile, default_profiles
from kperf_client.client import KperfClient
from tests.app.calibration_helpers import gemm_ws_runs
from tests.app.redis_helpers import redis_server
from tests.app.service_helpers import in_app, make_settings, metric_value
from tests.app.store.test_contract import store

__all__ = ["redis_server", "store"]

SHIPPED = default_profiles()
ALICE = Principal("alice", "write")


def _copy(device_id: str) -> DeviceProfile:
    return DeviceProfile.model_validate({**SHIPPED["rtx-a6000"].model_dump(), "id": device_id})


def _legacy_batch(model: str, runs: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": model, "measurements": runs}).encode()


def test_a_store_of_the_layout_before_tenants_is_migrated_once(store: Store) -> None:
    runs = gemm_ws_runs(3)[:6]
    owned, unowned = "rtx-a6000-cal-0000000000aa", "rtx-a6000-cal-0000000000bb"
    for device_id in (owned, unowned):
        store.put(PROFILES, device_id, _copy(device_id).model_dump_json().encode())
    store.put(OWNERS, owned, b"alice")
    store.put(LEGACY_ALIASES, "my-gpu", owned.encode())
    store.put(LEGACY_ALIASES, "old-gpu", unowned.encode())
    # the fit's batch, then one posted later; and runs posted "for" a shipped id
    store.put(f"measurements:{owned}", f"gemm-ws.{0:020d}.fit", _legacy_batch("gemm-ws", runs[:2]))
    later = f"gemm-ws.{1_700_000_000_000_000_000:020d}.0a1b2c3d"
    store.put(f"measurements:{owned}", later, _legacy_batch("gemm-ws", runs[2:5]))
    store.put("measurements:rtx-a6000", later, _legacy_batch("gemm-ws", runs[5:]))
    profiles = ProfileStore(store, SHIPPED)

    assert profiles.migrate()
    assert profiles.alias_target("alice", "my-gpu") == owned
    assert profiles.alias_target("local", "old-gpu") == unowned
    assert profiles.resolve("my-gpu", ALICE).id == owned
    assert profiles.record(owned) == {"gemm-ws": runs[:5]}
    assert profiles.run_count(owned) == 5
    assert profiles.record("local@rtx-a6000") == {"gemm-ws": runs[5:]}
    assert store.keys(LEGACY_ALIASES) == [] and store.keys(f"measurements:{owned}") == []
    # the migrated batches are batches of the new layout
    assert profiles.delete_runs(owned, "alice", batch="fit") == (2, 3)
    assert profiles.delete_runs(owned, "alice", batch="01700000000000000000-0a1b2c3d") == (3, 0)
    assert not profiles.migrate()  # once


def test_idle_profiles_and_drafts_expire_unless_used_meanwhile(store: Store) -> None:
    profiles = ProfileStore(store, SHIPPED)
    expired: list[str] = []
    expiry = IdleExpiry(lambda: profiles, 100.0, expired.append)
    kept, idle = _copy("rtx-a6000-cal-00000000000c"), _copy("rtx-a6000-cal-00000000000d")
    for profile in (kept, idle):
        assert profiles.save(profile, "gemm-ws", gemm_ws_runs(4)[:3], "alice")
    profiles.set_alias("alice", "idle-gpu", idle.id)
    profiles.append("bob@rtx-a6000", "bob", "gemm-ws", gemm_ws_runs(5)[:2])
    now = time.time()
    store.put(LAST_USED, "bob@rtx-a6000", f"{now:.3f}".encode())
    assert expiry.sweep(now) == []  # profiles without a recorded use start counting now
    assert sorted(store.keys(LAST_USED)) == sorted([kept.id, idle.id, "bob@rtx-a6000"])
    assert expiry.sweep(now + 50) == []
    # a use between the sweep's read and its delete keeps the profile (any replica's use)
    stale = store.get(LAST_USED, kept.id)
    assert stale is not None
    store.put(LAST_USED, kept.id, f"{now + 120:.3f}".encode())
    assert not profiles.expire_profile(kept.id, stale)
    assert sorted(expiry.sweep(now + 150)) == sorted([idle.id, "bob@rtx-a6000"])
    assert sorted(expired) == ["calibrated", "draft"]
    assert profiles.calibrated(kept.id) is not None and profiles.calibrated(idle.id) is None
    assert profiles.alias_target("alice", "idle-gpu") is None
    for record_id in (idle.id, "bob@rtx-a6000"):
        assert store.keys(runs_namespace(record_id)) == [] and profiles.run_count(record_id) == 0
    assert store.keys(aliases_namespace("alice")) == []
    assert store.counter("profiles:alice") == 1
    assert profiles.owner(idle.id) is None and profiles.listing(LOCAL).stored_unavailable is None


def test_a_served_profile_left_idle_expires_and_is_counted() -> None:
    """The service's own sweep (KPERF_PROFILE_IDLE_EXPIRY_S): a calibrated profile nobody
    uses is gone after the idle time and a sweep, and the metric counts it."""

    async def scenario(client: KperfClient) -> tuple[int, int, str]:
        made = await client.http.post(
            "/calibrate",
            json={"model": "gemm-ws", "base_device": "rtx-a6000", "name": "brief",
                  "measurements": gemm_ws_runs(6)[:9], "time_limit_s": 60},
        )  # fmt: skip
        assert made.status_code == 200, made.text
        seen = (await client.http.get("/devices/brief")).status_code
        await asyncio.sleep(3.5)  # past the idle time, and at least two sweeps (1 s apart)
        gone = (await client.http.get(f"/devices/{made.json()['device']}")).status_code
        return seen, gone, (await client.http.get("/metrics")).text

    seen, gone, metrics = in_app(scenario, make_settings(profile_idle_expiry_s=0.5))
    assert (seen, gone) == (200, 404)
    assert metric_value(metrics, "kperf_profiles_expired_total", kind="calibrated") == 1
