"""Calibrated device profiles, their aliases and measured runs, kept in the shared Store.

Layout (values are UTF-8 JSON, or the bare id for an alias):

* ``profiles`` / ``<id>``: a calibrated :class:`DeviceProfile`; written once, never changed
  (its id is a digest of what made it, see ``app/convert/calibrate.py``);
* ``aliases`` / ``<name>``: the id the name points to;
* ``owners`` / ``<id>``: the tenant that created a calibrated profile (issue 20);
* ``runs:<record>`` / ``<model>.<16 hex content digest>``: one measured run,
  ``{"model", "seq", "batch", "run"}``; the record is its runs by ``seq`` (oldest first), and
  a run posted twice is stored once. ``<record>`` is a calibrated id, or ``<tenant>@<shipped
  id>``: a tenant's own draft record of a shipped profile (nobody writes the shipped one);
* ``batches:<record>`` / ``<batch id>``: the run keys one post wrote (``fit``: the runs a
  profile was fitted to), for DELETE by batch;
* counters (``Store.counter``): ``runs:<record>``, ``profiles:<tenant>``, ``bytes:<tenant>``,
  kept and capped by the store in the same transaction as the writes they count
  (``app/store/transaction.py``): a post's cost does not grow with the record.

Shipped profiles (``device_profiles/*.json``) are never written: a calibration always makes a
new profile. Lookups go shipped ids, then calibrated ids, then aliases; names may not take a
shipped or calibrated id, nor the shape of one.

While the store is unavailable, shipped profiles are still looked up and listed (they never
touch it); a listing then says the stored ones are missing and why
(:attr:`ProfileListing.stored_unavailable`), and any other lookup raises
:class:`StoredProfileUnavailable`, naming the request field: the id may be a calibrated one
or a name, and nothing can tell until the store answers.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.store import Counter, Delete, Put, Store, StoreUnavailable
from device_profiles import DeviceProfile, UnknownDevice

PROFILES = "profiles"
ALIASES = "aliases"
#: device id -> the tenant that created it
OWNERS = "owners"
#: hex digits of a run's content digest in its key (64 bits: collisions within one device's
#: record of at most a million runs are below one in ten million)
RUN_DIGEST_HEX = 16
#: what a calibrated id ends with: ``<root>-cal-<12 hex>``
CALIBRATED_SUFFIX = re.compile(r"-cal-[0-9a-f]{12}$")


def runs_namespace(record_id: str) -> str:
    return f"runs:{record_id}"


def batches_namespace(record_id: str) -> str:
    return f"batches:{record_id}"


@dataclass(frozen=True, slots=True)
class Limits:
    """The caps the store enforces in its own transaction (None: none)."""

    runs_per_device: int | None = None
    profiles_per_tenant: int | None = None
    bytes_per_tenant: int | None = None


@dataclass(frozen=True, slots=True)
class Appended:
    batch: str
    #: runs newly stored (a run already in the record is not stored again)
    added: int
    #: runs in the record afterwards, as the store's transaction counted them
    total: int


class UnknownRun(LookupError):
    """No batch or run of that id in the record (404 naming ``field``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class NameTaken(ValueError):
    """An alias already names other content, or would shadow a profile id (409)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class StoredProfileUnavailable(StoreUnavailable):
    """A device id that is no shipped profile, looked up while the store that holds calibrated
    profiles and names cannot be reached (503 naming ``field``: retry later)."""

    def __init__(self, device_id: str, field: str, cause: str, shipped: Sequence[str]) -> None:
        self.device_id = device_id
        self.field = field
        self.reason = (
            f"{device_id!r} is no shipped profile, and calibrated profiles and names cannot be "
            f"looked up now: {cause}; retry later, or name a shipped profile "
            f"({', '.join(shipped)})"
        )
        super().__init__(f"{field}: {self.reason}")


@dataclass(frozen=True, slots=True)
class ProfileListing:
    """Every profile that could be read, each with the names that resolve to it."""

    profiles: tuple[tuple[DeviceProfile, tuple[str, ...]], ...]
    #: why no calibrated profile is listed (the store's error); None when all of them are
    stored_unavailable: str | None = None


class ProfileStore:
    """Shipped profiles (read-only) and calibrated ones (in ``store``), one namespace of ids."""

    def __init__(
        self, store: Store, shipped: Mapping[str, DeviceProfile], limits: Limits = Limits()
    ) -> None:
        self.store = store
        self.shipped = shipped
        self.limits = limits

    # ---------------------------------------------------------------- profiles and aliases

    def calibrated(self, device_id: str) -> DeviceProfile | None:
        raw = self.store.get(PROFILES, device_id)
        return None if raw is None else DeviceProfile.model_validate_json(raw)

    def alias_target(self, name: str) -> str | None:
        raw = self.store.get(ALIASES, name)
        return None if raw is None else raw.decode()

    def resolve(self, device_id: str, field: str = "device") -> DeviceProfile:
        """The profile ``device_id`` names (shipped id, calibrated id or alias)."""
        shipped = self.shipped.get(device_id)
        if shipped is not None:
            return shipped
        try:
            profile = self.calibrated(device_id)
            if profile is None:
                target = self.alias_target(device_id)
                profile = self.calibrated(target) if target is not None else None
            if profile is None:
                raise UnknownDevice(device_id, self.known_ids(), field=field)
        except StoreUnavailable as exc:
            raise StoredProfileUnavailable(
                device_id, field, str(exc), sorted(self.shipped)
            ) from exc
        return profile

    def known_ids(self) -> list[str]:
        """Shipped ids, then calibrated ids and aliases, each sorted."""
        stored = sorted({*self.store.keys(PROFILES), *self.store.keys(ALIASES)})
        return sorted(self.shipped) + [i for i in stored if i not in self.shipped]

    def all_calibrated(self) -> list[DeviceProfile]:
        # one batched read (Redis: MGET), not a round trip per profile
        found = self.store.get_many(PROFILES, self.store.keys(PROFILES))
        return [DeviceProfile.model_validate_json(raw) for raw in found if raw is not None]

    def listing(self) -> ProfileListing:
        """Shipped profiles, then calibrated ones with their names; while the store fails,
        the shipped ones alone and the store's error (never a profile without its names)."""
        shipped = tuple((p, ()) for p in self.shipped.values())
        try:
            aliases = self.aliases()
            stored = self.all_calibrated()
        except StoreUnavailable as exc:
            return ProfileListing(shipped, stored_unavailable=str(exc))
        names: dict[str, list[str]] = {}
        for name, target in aliases.items():
            names.setdefault(target, []).append(name)
        return ProfileListing(
            tuple(
                (p, tuple(sorted(names.get(p.id, [])))) for p in (*self.shipped.values(), *stored)
            )
        )

    def aliases(self) -> dict[str, str]:
        """name -> id of every alias."""
        names = self.store.keys(ALIASES)
        found = zip(names, self.store.get_many(ALIASES, names), strict=True)
        return {name: raw.decode() for name, raw in found if raw is not None}

    def save(
        self, profile: DeviceProfile, model: str, measurements: Sequence[Any], tenant: str
    ) -> bool:
        """Store a new calibrated profile of ``tenant``'s with the runs it was fitted to as its
        record, all in one step of the store (a failure or a cap leaves nothing behind); False
        (and nothing written) when the id exists: same id, same content."""
        if profile.id in self.shipped:
            raise ValueError(f"{profile.id!r} is a shipped profile id")
        puts = _run_puts(profile.id, model, measurements, 0, "fit")
        keys = [p.key for p in puts]
        puts += [
            Put(batches_namespace(profile.id), "fit", json.dumps(keys).encode(), if_absent=True),
            Put(OWNERS, profile.id, tenant.encode(), if_absent=True),
            Put(PROFILES, profile.id, profile.model_dump_json().encode(), if_absent=True),
        ]
        outcome = self.store.transact(
            puts,
            counters=[
                self._runs_counter(profile.id),
                self._profiles_counter(tenant),
                self._bytes_counter(tenant, profile.id),
            ],
        )
        return (PROFILES, profile.id) in outcome.written

    def check_alias(self, name: str, target: str, moving_from: str | None = None) -> None:
        """NameTaken unless ``name`` may point at ``target``: it is no profile id (nor shaped
        like one), and names nothing yet, ``target`` already, or ``moving_from`` (the device a
        recalibration refits)."""
        if name in self.shipped or CALIBRATED_SUFFIX.search(name):
            raise NameTaken("name", f"{name!r} is (or looks like) a profile id; choose another")
        if self.store.get(PROFILES, name) is not None:
            raise NameTaken("name", f"{name!r} is a calibrated profile id; choose another")
        current = self.alias_target(name)
        if current not in (None, target, moving_from):
            raise NameTaken(
                "name",
                f"{name!r} already names {current}; choose another name, or move it with "
                f"POST /devices/{name}/recalibrate",
            )

    def set_alias(self, name: str, target: str, *, moving_from: str | None = None) -> None:
        """Point ``name`` at ``target`` (see :meth:`check_alias`)."""
        self.check_alias(name, target, moving_from)
        if self.alias_target(name) is None and self.store.put_if_absent(
            ALIASES, name, target.encode()
        ):
            return
        # taken meanwhile by a concurrent request: check again against what it wrote
        self.check_alias(name, target, moving_from)
        self.store.put(ALIASES, name, target.encode())

    # ---------------------------------------------------------------- ownership

    def owner(self, device_id: str) -> str | None:
        """The tenant that created a calibrated profile; None for a shipped one (nobody's)."""
        if device_id in self.shipped:
            return None
        raw = self.store.get(OWNERS, device_id)
        return None if raw is None else raw.decode()

    # ---------------------------------------------------------------- measurements

    def append(
        self, record_id: str, tenant: str, model: str, measurements: Sequence[Any]
    ) -> Appended:
        """Add one batch of validated runs (JSON-ready dicts) to a record, each run once
        (by its content digest), within the caps; CapExceeded and nothing stored otherwise."""
        batch = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
        puts = _run_puts(record_id, model, measurements, time.time_ns(), batch)
        keys = [p.key for p in puts]
        puts.append(Put(batches_namespace(record_id), batch, json.dumps(keys).encode()))
        outcome = self.store.transact(
            puts, counters=[self._runs_counter(record_id), self._bytes_counter(tenant, record_id)]
        )
        added = sum(1 for p in puts[:-1] if (p.namespace, p.key) in outcome.written)
        return Appended(batch, added, outcome.totals[runs_counter_key(record_id)])

    def run_count(self, record_id: str) -> int:
        """Runs in a record, from its counter (constant cost, whatever the history)."""
        return self.store.counter(runs_counter_key(record_id))

    def record(self, record_id: str) -> dict[str, list[Any]]:
        """model -> every run recorded for ``record_id``, oldest first."""
        namespace = runs_namespace(record_id)
        runs: list[tuple[int, str, Any]] = []
        keys = self.store.keys(namespace)
        for raw in self.store.get_many(namespace, keys):
            if raw is not None:
                entry = json.loads(raw)
                runs.append((entry["seq"], entry["model"], entry["run"]))
        out: dict[str, list[Any]] = {}
        for _, model, run in sorted(runs, key=lambda r: r[0]):
            out.setdefault(model, []).append(run)
        return out

    def delete_runs(
        self, record_id: str, tenant: str, *, batch: str | None = None, digest: str | None = None
    ) -> tuple[int, int]:
        """Delete one batch's runs, or the run of one digest; (deleted, runs left)."""
        namespace = runs_namespace(record_id)
        deletes: list[Delete] = []
        if batch is not None:
            raw = self.store.get(batches_namespace(record_id), batch)
            if raw is None:
                raise UnknownRun("batch", f"{record_id} has no batch {batch!r}")
            deletes = [Delete(namespace, key) for key in json.loads(raw)]
            deletes.append(Delete(batches_namespace(record_id), batch))
        elif digest is not None:
            keys = [k for k in self.store.keys(namespace) if k.endswith("." + digest)]
            if not keys:
                raise UnknownRun("digest", f"{record_id} has no run of digest {digest!r}")
            deletes = [Delete(namespace, key) for key in keys]
        runs = self._runs_counter(record_id)
        before = self.run_count(record_id)
        outcome = self.store.transact(
            deletes=deletes, counters=[runs, self._bytes_counter(tenant, record_id)]
        )
        left = outcome.totals[runs.key]
        return max(0, before - left), left

    def delete_profile(self, device_id: str, tenant: str) -> list[str]:
        """Delete a calibrated profile, its record and every name pointing at it, in one step
        of the store; the names it had."""
        names = [n for n, target in self.aliases().items() if target == device_id]
        runs = runs_namespace(device_id)
        batches = batches_namespace(device_id)
        deletes = [
            Delete(PROFILES, device_id),
            Delete(OWNERS, device_id),
            *(Delete(ALIASES, n) for n in names),
            *(Delete(runs, k) for k in self.store.keys(runs)),
            *(Delete(batches, k) for k in self.store.keys(batches)),
        ]
        self.store.transact(
            deletes=deletes,
            counters=[
                self._runs_counter(device_id),
                self._profiles_counter(tenant),
                self._bytes_counter(tenant, device_id),
            ],
        )
        return names

    # ---------------------------------------------------------------- caps

    def _runs_counter(self, record_id: str) -> Counter:
        return Counter(
            runs_counter_key(record_id),
            "count",
            (runs_namespace(record_id),),
            cap=self.limits.runs_per_device,
        )

    def _profiles_counter(self, tenant: str) -> Counter:
        return Counter(
            f"profiles:{tenant}", "count", (PROFILES,), cap=self.limits.profiles_per_tenant
        )

    def _bytes_counter(self, tenant: str, record_id: str) -> Counter:
        namespaces = (PROFILES, runs_namespace(record_id), batches_namespace(record_id))
        return Counter(f"bytes:{tenant}", "bytes", namespaces, cap=self.limits.bytes_per_tenant)


def runs_counter_key(record_id: str) -> str:
    return f"runs:{record_id}"


def record_of(device_id: str, tenant: str, shipped: Mapping[str, DeviceProfile]) -> str:
    """Whose runs a device's record is: a calibrated device's own; for a shipped profile (which
    nobody may write) the calling tenant's draft of it, ``<tenant>@<id>``, which recalibrating
    turns into a calibrated device of that tenant's."""
    return f"{tenant}@{device_id}" if device_id in shipped else device_id


def run_digest(model: str, run: Any) -> str:
    """The content digest of one run: identical runs posted twice are stored once."""
    text = json.dumps({"model": model, "run": run}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:RUN_DIGEST_HEX]


def _run_puts(
    record_id: str, model: str, measurements: Sequence[Any], first_seq: int, batch: str
) -> list[Put]:
    namespace = runs_namespace(record_id)
    return [
        Put(
            namespace,
            f"{model}.{run_digest(model, run)}",
            json.dumps({"model": model, "seq": first_seq + i, "batch": batch, "run": run}).encode(),
            if_absent=True,
        )
        for i, run in enumerate(measurements)
    ]
