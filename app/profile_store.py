"""Calibrated device profiles, their aliases and measured runs, kept in the shared Store.

Layout (values are UTF-8 JSON, or the bare id for an alias):

* ``profiles`` / ``<id>``: a calibrated :class:`DeviceProfile`; written once, never changed
  (its id is a digest of what made it, see ``app/convert/calibrate.py``);
* ``aliases`` / ``<name>``: the id the name points to;
* ``measurements:<id>`` / ``<model>.<time ns, 20 digits>.<random hex>``: one appended batch,
  ``{"model": ..., "measurements": [...]}``; the record of a device is its batches in key
  order (oldest first). Shipped profile ids have records too.

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

import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.store import Store, StoreUnavailable
from device_profiles import DeviceProfile, UnknownDevice

PROFILES = "profiles"
ALIASES = "aliases"
#: what a calibrated id ends with: ``<root>-cal-<12 hex>``
CALIBRATED_SUFFIX = re.compile(r"-cal-[0-9a-f]{12}$")


def measurements_namespace(device_id: str) -> str:
    return f"measurements:{device_id}"


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

    def __init__(self, store: Store, shipped: Mapping[str, DeviceProfile]) -> None:
        self.store = store
        self.shipped = shipped

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
        found = (self.calibrated(i) for i in self.store.keys(PROFILES))
        return [p for p in found if p is not None]

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
        found = {name: self.alias_target(name) for name in self.store.keys(ALIASES)}
        return {name: target for name, target in found.items() if target is not None}

    def save(self, profile: DeviceProfile, model: str, measurements: Sequence[Any]) -> bool:
        """Store a new calibrated profile with the runs it was fitted to as its record; False
        (and nothing written) when the id exists: same id, same content."""
        if profile.id in self.shipped:
            raise ValueError(f"{profile.id!r} is a shipped profile id")
        # the record first, under a fixed key: two identical calibrations write it once, and
        # a profile is never visible without its record
        self.store.put_if_absent(
            measurements_namespace(profile.id),
            f"{model}.{0:020d}.fit",
            _batch(model, measurements),
        )
        return self.store.put_if_absent(PROFILES, profile.id, profile.model_dump_json().encode())

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

    # ---------------------------------------------------------------- measurements

    def append(self, device_id: str, model: str, measurements: Sequence[Any]) -> None:
        """Append one batch of validated runs (JSON-ready dicts) to a device's record."""
        key = f"{model}.{time.time_ns():020d}.{secrets.token_hex(4)}"
        self.store.put(measurements_namespace(device_id), key, _batch(model, measurements))

    def record(self, device_id: str) -> dict[str, list[Any]]:
        """model -> every run recorded for ``device_id``, oldest batch first."""
        namespace = measurements_namespace(device_id)
        out: dict[str, list[Any]] = {}
        for key in self.store.keys(namespace):
            raw = self.store.get(namespace, key)
            if raw is None:
                continue
            batch = json.loads(raw)
            out.setdefault(batch["model"], []).extend(batch["measurements"])
        return out


def _batch(model: str, measurements: Sequence[Any]) -> bytes:
    return json.dumps({"model": model, "measurements": list(measurements)}).encode()
