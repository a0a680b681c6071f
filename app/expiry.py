"""Idle calibrated profiles and draft records expire (``KPERF_PROFILE_IDLE_EXPIRY_S``, off by
default).

A use (a lookup of a calibrated profile, runs posted to a record) writes the record's last-use
time to the store (``last_used`` / ``<record id>``), at most once per :attr:`refresh_s` per
record and process, so a hot profile costs no write per request. A sweep, every
:attr:`sweep_every_s` in each replica, deletes what was unused for longer than the idle time:
a calibrated profile with its runs and its owner's names, a draft with its runs. Each delete
expects the last use it read (``app/store/transaction.py``): a profile used meanwhile by any
replica stays. Calibrated profiles with no recorded use (made before expiry was turned on) are
counted from the first sweep; drafts from their next use.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from app.profile_store import LAST_USED, PROFILES, DeviceGone, ProfileStore
from app.store import StoreUnavailable

log = logging.getLogger("kperf.expiry")

#: a record's last use is rewritten at most this often (a fraction of the idle time)
REFRESH_FRACTION = 0.1
#: sweeps run this often (a fraction of the idle time), within these bounds
SWEEP_FRACTION = 0.1
SWEEP_BOUNDS_S = (1.0, 300.0)


class IdleExpiry:
    """Last uses and the sweep; ``on_expired(kind)`` counts each deletion (the metric)."""

    def __init__(
        self,
        profiles: Callable[[], ProfileStore],
        idle_s: float,
        on_expired: Callable[[str], None],
    ) -> None:
        if not idle_s > 0:
            raise ValueError(f"idle_s must be positive, got {idle_s}")
        self._profiles = profiles
        self.idle_s = idle_s
        self.refresh_s = idle_s * REFRESH_FRACTION
        low, high = SWEEP_BOUNDS_S
        self.sweep_every_s = min(max(idle_s * SWEEP_FRACTION, low), high)
        self._on_expired = on_expired
        #: record id -> monotonic time this process last wrote its use
        self._written: dict[str, float] = {}

    async def touch(self, record_id: str) -> None:
        now = time.monotonic()
        if now - self._written.get(record_id, -math.inf) < self.refresh_s:
            return
        self._written[record_id] = now
        store = self._profiles().store
        try:
            await asyncio.to_thread(store.put, LAST_USED, record_id, _stamp(time.time()))
        except StoreUnavailable:
            self._written.pop(record_id, None)  # noted on the next use instead

    def sweep(self, now: float | None = None) -> list[str]:
        """Delete every record unused for longer than the idle time (blocking); their ids."""
        profiles = self._profiles()
        store = profiles.store
        now = time.time() if now is None else now
        ids = store.keys(LAST_USED)
        for device_id in set(store.keys(PROFILES)) - set(ids):
            store.put_if_absent(LAST_USED, device_id, _stamp(now))
        expired = []
        for record_id, used in zip(ids, store.get_many(LAST_USED, ids), strict=True):
            if used is None or now - float(used) <= self.idle_s:
                continue
            tenant, at, _ = record_id.partition("@")
            if at:
                deleted, kind = profiles.delete_draft(record_id, tenant, expect_used=used), "draft"
            else:
                try:
                    deleted = profiles.expire_profile(record_id, used)
                except DeviceGone:  # deleted meanwhile; only its last use was left
                    store.delete(LAST_USED, record_id)
                    continue
                kind = "calibrated"
            if deleted:
                self._written.pop(record_id, None)
                self._on_expired(kind)
                expired.append(record_id)
        if expired:
            log.info("idle profiles expired", extra={"records": expired})
        return expired

    async def run(self) -> None:
        """Sweep forever (a lifespan task); a store outage only skips a sweep."""
        while True:
            await asyncio.sleep(self.sweep_every_s)
            try:
                await asyncio.to_thread(self.sweep)
            except StoreUnavailable as exc:
                log.warning("expiry sweep skipped: store unavailable", extra={"error": str(exc)})


def _stamp(unix_s: float) -> bytes:
    return f"{unix_s:.3f}".encode()
