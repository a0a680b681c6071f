"""Calibrated device profiles, their aliases and measured runs, kept in the shared Store.

Layout (values are UTF-8 JSON, or the bare id for an alias):

* ``profiles`` / ``<id>``: a calibrated :class:`DeviceProfile`; written once, never changed
  (its id is a digest of what made it, see ``app/convert/calibrate.py``);
* ``aliases:<tenant>`` / ``<name>``: the id a tenant's name points to. Names live in their
  tenant's namespace: a bare name in a request is looked up in the caller's, and a name only
  ever points at a profile of its tenant's (``set_alias`` checks), so nothing another tenant
  does moves, rebinds or removes it;
* ``owners`` / ``<id>``: the tenant that created a calibrated profile. The owner is part of
  what makes the id (``app/convert/calibrate.py``): the same runs posted by two tenants make
  two profiles, and reading another tenant's runs gives no way to its id;
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
new profile. Lookups go shipped ids, then calibrated ids, then the caller's names; names may
not take a shipped or calibrated id, nor the shape of one.

Reads follow one policy (:class:`ReadPolicy`): ``open`` (the default) lets any caller use and
read any calibrated profile and its runs by id; ``owner`` (``KPERF_AUTH_READS`` with a tokens
file) shows a tenant its own calibrated profiles only, as if the others did not exist (admins
see all). Either way only the owner (or an admin) may change one.

While the store is unavailable, shipped profiles are still looked up and listed (they never
touch it); a listing then says the stored ones are missing and why
(:attr:`ProfileListing.stored_unavailable`), and any other lookup raises
:class:`StoredProfileUnavailable`, naming the request field: the id may be a calibrated one
or a name, and nothing can tell until the store answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.auth import ANONYMOUS, LOCAL, Principal, check_owner
from app.field_errors import FieldReasonError
from app.store import Counter, Delete, Expect, Put, Store, StoreUnavailable, Unmet
from device_profiles import DeviceProfile, UnknownDevice

PROFILES = "profiles"
#: the names of before tenants had namespaces (one for everybody), moved by :meth:`migrate`
LEGACY_ALIASES = "aliases"
#: the record layout of before runs were keyed by digest (one value per posted batch)
LEGACY_MEASUREMENTS = "measurements"
#: ``layout`` / ``version``: what :meth:`ProfileStore.migrate` last brought the store to
META = "meta"
LAYOUT_VERSION = b"2"
#: record id -> unix seconds of its last use (written when expiry is on, see ``app/expiry.py``)
LAST_USED = "last_used"
#: how many times a delete lists a record again when runs keep landing while it deletes
DELETE_ATTEMPTS = 5
#: characters of an unknown id an error message repeats
ID_ECHO_CHARS = 64
#: device id -> the tenant that created it
OWNERS = "owners"
#: hex digits of a run's content digest in its key (64 bits: collisions within one device's
#: record of at most a million runs are below one in ten million)
RUN_DIGEST_HEX = 16
#: what a calibrated id ends with: ``<root>-cal-<12 hex>``
CALIBRATED_SUFFIX = re.compile(r"-cal-[0-9a-f]{12}$")


def aliases_namespace(tenant: str) -> str:
    return f"aliases:{tenant}"


def runs_namespace(record_id: str) -> str:
    return f"runs:{record_id}"


def batches_namespace(record_id: str) -> str:
    return f"batches:{record_id}"


#: who may read a calibrated profile and its runs: anyone (``open``), or its owner's tenant and
#: admins (``owner``, under ``KPERF_AUTH_READS``)
ReadPolicy = Literal["open", "owner"]


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


class UnknownRun(FieldReasonError, LookupError):
    """No batch or run of that id in the record (404 naming ``field``)."""


class NameTaken(FieldReasonError, ValueError):
    """An alias already names other content, or would shadow a profile id (409)."""


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


class DeviceGone(LookupError):
    """The device was deleted while runs were posted to it: nothing stored (404)."""

    def __init__(self, device_id: str) -> None:
        self.device_id = device_id
        self.field = "device"
        self.reason = f"{device_id} was deleted meanwhile: nothing stored; GET /devices lists yours"
        super().__init__(f"{self.field}: {self.reason}")


class ProfileStore:
    """Shipped profiles (read-only) and calibrated ones (in ``store``), one namespace of ids;
    names per tenant."""

    def __init__(
        self,
        store: Store,
        shipped: Mapping[str, DeviceProfile],
        limits: Limits = Limits(),
        reads: ReadPolicy = "open",
    ) -> None:
        self.store = store
        self.shipped = shipped
        self.limits = limits
        self.reads = reads

    # ---------------------------------------------------------------- profiles and aliases

    def calibrated(self, device_id: str) -> DeviceProfile | None:
        raw = self.store.get(PROFILES, device_id)
        return None if raw is None else DeviceProfile.model_validate_json(raw)

    def alias_target(self, tenant: str, name: str) -> str | None:
        raw = self.store.get(aliases_namespace(tenant), name)
        return None if raw is None else raw.decode()

    def may_read(self, viewer: Principal, owner: str | None) -> bool:
        """Whether ``viewer`` sees a calibrated profile of ``owner``'s (:class:`ReadPolicy`)."""
        return self.reads == "open" or viewer.role == "admin" or owner == viewer.tenant

    def resolve(self, device_id: str, viewer: Principal, field: str = "device") -> DeviceProfile:
        """The profile ``device_id`` names for ``viewer``: a shipped id, a calibrated id it
        may read, or one of its tenant's names."""
        shipped = self.shipped.get(device_id)
        if shipped is not None:
            return shipped
        try:
            profile = self.calibrated(device_id)
            if profile is None:
                target = self.alias_target(viewer.tenant, device_id)
                profile = self.calibrated(target) if target is not None else None
            elif not self.may_read(viewer, self.owner(device_id)):
                profile = None
            if profile is None:
                raise self.unknown(device_id, field)
        except StoreUnavailable as exc:
            raise StoredProfileUnavailable(
                _echo(device_id), field, str(exc), sorted(self.shipped)
            ) from exc
        return profile

    def unknown(self, device_id: str, field: str) -> UnknownDevice:
        """The error of an id nobody may see: the id cut short, the shipped ids, and where
        the caller's own are listed; never another tenant's ids or names."""
        return UnknownDevice(
            _echo(device_id),
            sorted(self.shipped),
            field=field,
            listing="GET /devices lists the calibrated profiles and names you may use",
        )

    def all_calibrated(self) -> list[tuple[DeviceProfile, str | None]]:
        """Every calibrated profile with its owner (None: made before tenants)."""
        # batched reads (Redis: MGET), not a round trip per profile
        ids = self.store.keys(PROFILES)
        found = self.store.get_many(PROFILES, ids)
        owners = self.store.get_many(OWNERS, ids)
        return [
            (DeviceProfile.model_validate_json(raw), None if owner is None else owner.decode())
            for raw, owner in zip(found, owners, strict=True)
            if raw is not None
        ]

    def listing(self, viewer: Principal) -> ProfileListing:
        """Shipped profiles, then the calibrated ones ``viewer`` may read, each with the
        names of ``viewer``'s tenant; while the store fails, the shipped ones alone and the
        store's error (never a profile without its names)."""
        shipped = tuple((p, ()) for p in self.shipped.values())
        try:
            aliases = self.aliases(viewer.tenant)
            stored = [p for p, owner in self.all_calibrated() if self.may_read(viewer, owner)]
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

    def aliases(self, tenant: str) -> dict[str, str]:
        """name -> id of every name of ``tenant``'s."""
        namespace = aliases_namespace(tenant)
        names = self.store.keys(namespace)
        found = zip(names, self.store.get_many(namespace, names), strict=True)
        return {name: raw.decode() for name, raw in found if raw is not None}

    def save(
        self, profile: DeviceProfile, model: str, measurements: Sequence[Any], tenant: str
    ) -> bool:
        """Store a new calibrated profile of ``tenant``'s with the runs it was fitted to as its
        record, all in one step of the store (a failure or a cap leaves nothing behind); False
        (and nothing written) when the id exists: same id, same content, same owner (the owner
        is in the id; another owner's profile of that id is never answered as this one)."""
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
        created = (PROFILES, profile.id) in outcome.written
        if not created:
            check_owner(Principal(tenant, "write"), self.owner(profile.id), profile.id)
        return created

    def check_alias(
        self, tenant: str, name: str, target: str, moving_from: str | None = None
    ) -> None:
        """NameTaken unless ``tenant``'s ``name`` may point at ``target``: it is no profile
        id (nor shaped like one), and names nothing yet, ``target`` already, or
        ``moving_from`` (the device a recalibration refits)."""
        if name in self.shipped or CALIBRATED_SUFFIX.search(name):
            raise NameTaken("name", f"{name!r} is (or looks like) a profile id; choose another")
        if self.store.get(PROFILES, name) is not None:
            raise NameTaken("name", f"{name!r} is a calibrated profile id; choose another")
        current = self.alias_target(tenant, name)
        if current not in (None, target, moving_from):
            raise NameTaken(
                "name",
                f"{name!r} already names {current}; choose another name, or move it with "
                f"POST /devices/{name}/recalibrate",
            )

    def set_alias(
        self, tenant: str, name: str, target: str, *, moving_from: str | None = None
    ) -> None:
        """Point ``tenant``'s ``name`` at ``target``, a profile of ``tenant``'s (see
        :meth:`check_alias`)."""
        if self.owner(target) != tenant:
            raise ValueError(f"{target} is not tenant {tenant}'s: its names cannot point at it")
        self.check_alias(tenant, name, target, moving_from)
        namespace = aliases_namespace(tenant)
        if self.alias_target(tenant, name) is None and self.store.put_if_absent(
            namespace, name, target.encode()
        ):
            return
        # taken meanwhile by a concurrent request: check again against what it wrote
        self.check_alias(tenant, name, target, moving_from)
        self.store.put(namespace, name, target.encode())

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
        (by its content digest), within the caps; CapExceeded and nothing stored otherwise.
        A calibrated device's runs are stored only while it exists (DeviceGone otherwise,
        nothing stored): a run posted during its delete is never left without it. A draft
        deleted meanwhile (expiry) simply starts again with these runs."""
        batch = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
        puts = _run_puts(record_id, model, measurements, time.time_ns(), batch)
        keys = [p.key for p in puts]
        puts.append(Put(batches_namespace(record_id), batch, json.dumps(keys).encode()))
        draft = "@" in record_id
        try:
            outcome = self.store.transact(
                puts,
                counters=[
                    self._runs_counter(record_id),
                    self._bytes_counter(tenant, record_id),
                ],
                expects=() if draft else [Expect(PROFILES, record_id)],
            )
        except Unmet:
            raise DeviceGone(record_id) from None
        added = sum(1 for p in puts[:-1] if p.slot in outcome.written)
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
        """Delete a calibrated profile of ``tenant``'s, its record and its names (in
        ``tenant``'s namespace: no other tenant's name points at it), in one step of the
        store; the names it had. The step expects the run count it listed: runs that landed
        meanwhile make it list again, and once it is gone no run lands (:meth:`append`)."""
        for _ in range(DELETE_ATTEMPTS):
            try:
                return self._delete_profile_step(device_id, tenant, ())
            except Unmet:
                if self.store.get(PROFILES, device_id) is None:
                    raise DeviceGone(device_id) from None
                # runs landed while it listed: list again
        raise StoreUnavailable(
            f"{device_id}: runs kept landing while it was deleted ({DELETE_ATTEMPTS} tries)"
        )

    def expire_profile(self, device_id: str, used: bytes) -> bool:
        """Delete a calibrated profile as :meth:`delete_profile` does, if its last use is still
        ``used``; False when it was used (or given runs) meanwhile."""
        # a profile made before tenants is nobody's: no tenant's counters count it
        tenant = self.owner(device_id) or ANONYMOUS
        try:
            self._delete_profile_step(device_id, tenant, [Expect(LAST_USED, device_id, used)])
        except Unmet:
            if self.store.get(PROFILES, device_id) is None:
                raise DeviceGone(device_id) from None
            return False
        return True

    def _delete_profile_step(
        self, device_id: str, tenant: str, expects: Sequence[Expect]
    ) -> list[str]:
        names = [n for n, target in self.aliases(tenant).items() if target == device_id]
        runs = self._runs_counter(device_id)
        listed = self.run_count(device_id)
        self._delete_record(
            device_id,
            extra=[
                Delete(PROFILES, device_id),
                Delete(OWNERS, device_id),
                Delete(LAST_USED, device_id),
                *(Delete(aliases_namespace(tenant), n) for n in names),
            ],
            counters=[
                dataclasses.replace(runs, expect=listed),
                self._profiles_counter(tenant),
                self._bytes_counter(tenant, device_id),
            ],
            expects=[Expect(PROFILES, device_id), *expects],
        )
        return names

    def delete_draft(self, record_id: str, tenant: str, *, expect_used: bytes | None) -> bool:
        """Delete a draft record (``<tenant>@<shipped id>``) as one step, if its last use is
        still ``expect_used`` (None: whatever it is); False when it changed meanwhile."""
        runs = self._runs_counter(record_id)
        try:
            self._delete_record(
                record_id,
                extra=[Delete(LAST_USED, record_id)],
                counters=[
                    dataclasses.replace(runs, expect=self.run_count(record_id)),
                    self._bytes_counter(tenant, record_id),
                ],
                expects=[] if expect_used is None else [Expect(LAST_USED, record_id, expect_used)],
            )
        except Unmet:
            return False
        return True

    def _delete_record(
        self,
        record_id: str,
        *,
        extra: Sequence[Delete],
        counters: Sequence[Counter],
        expects: Sequence[Expect],
    ) -> None:
        runs, batches = runs_namespace(record_id), batches_namespace(record_id)
        deletes = [
            *extra,
            *(Delete(runs, k) for k in self.store.keys(runs)),
            *(Delete(batches, k) for k in self.store.keys(batches)),
        ]
        self.store.transact(deletes=deletes, counters=counters, expects=expects)

    # ---------------------------------------------------------------- earlier layouts

    def migrate(self) -> bool:
        """Bring a store written by an earlier release to this layout, once (``meta`` /
        ``layout`` records it; replicas racing do each step at most once: every move is one
        step that writes if absent and deletes the old key). True when it looked."""
        if self.store.get(META, "layout") == LAYOUT_VERSION:
            return False
        # one namespace of names for everybody: each goes to its profile's owner (a profile
        # made before tenants is the unauthenticated tenant's, ``local``)
        names = self.store.keys(LEGACY_ALIASES)
        for name, raw in zip(names, self.store.get_many(LEGACY_ALIASES, names), strict=True):
            if raw is not None:
                tenant = self.owner(raw.decode()) or LOCAL.tenant
                self.store.transact(
                    [Put(aliases_namespace(tenant), name, raw, if_absent=True)],
                    [Delete(LEGACY_ALIASES, name)],
                )
        # one value per posted batch, ``measurements:<device>`` / ``<model>.<ns>.<hex|fit>``
        for device_id in [*self.shipped, *self.store.keys(PROFILES)]:
            self._migrate_batches(device_id)
        self.store.put(META, "layout", LAYOUT_VERSION)
        return True

    def _migrate_batches(self, device_id: str) -> None:
        namespace = f"{LEGACY_MEASUREMENTS}:{device_id}"
        tenant = self.owner(device_id) or LOCAL.tenant
        # a shipped id's runs were everybody's: they become the unauthenticated tenant's draft
        record_id = record_of(device_id, LOCAL.tenant, self.shipped)
        for key in self.store.keys(namespace):
            raw = self.store.get(namespace, key)
            if raw is None:
                continue
            _, stamp, suffix = key.split(".", 2)
            batch = "fit" if suffix == "fit" else f"{stamp}-{suffix}"
            old = json.loads(raw)
            puts = _run_puts(record_id, old["model"], old["measurements"], int(stamp), batch)
            keys = json.dumps([p.key for p in puts]).encode()
            puts.append(Put(batches_namespace(record_id), batch, keys, if_absent=True))
            # counted, never capped: runs already acknowledged are not refused now
            counters = [self._runs_counter(record_id), self._bytes_counter(tenant, record_id)]
            self.store.transact(
                puts,
                [Delete(namespace, key)],
                [dataclasses.replace(c, cap=None) for c in counters],
            )

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


def _echo(device_id: str) -> str:
    """``device_id`` as an answer may repeat it: at most ID_ECHO_CHARS characters."""
    if len(device_id) <= ID_ECHO_CHARS:
        return device_id
    return f"{device_id[:ID_ECHO_CHARS]}... ({len(device_id)} characters)"


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
