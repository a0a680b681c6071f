"""Load and validate every device profile shipped in this package."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from device_profiles.schema import SUPPORTED_SCHEMA_VERSIONS, DeviceProfile

PROFILE_DIR = Path(__file__).resolve().parent


class ProfileError(ValueError):
    """A profile file is unreadable, of an unknown schema version, or invalid."""


class UnknownDevice(KeyError):
    """No profile with the requested id; carries the valid ids and the request field that
    named it (``device``, ``base_device``, ``device_id`` for a URL path)."""

    def __init__(
        self, device_id: str, known: list[str], field: str = "device", listing: str | None = None
    ) -> None:
        super().__init__(device_id)
        self.device_id = device_id
        self.known = known
        self.field = field
        #: where the ids not in ``known`` are listed (a service's calibrated ones), if any
        self.listing = listing

    def __str__(self) -> str:
        text = f"unknown device {self.device_id!r}; known devices: {', '.join(self.known)}"
        return text if self.listing is None else f"{text}; {self.listing}"


class ModelNotServed(ValueError):
    """The profile lacks the figures a model needs; ``missing`` names them, ``field`` the
    request field that chose the profile."""

    def __init__(
        self, device_id: str, model: str, missing: list[str], field: str = "device"
    ) -> None:
        super().__init__(
            f"device {device_id!r} cannot serve the {model} model: missing figures "
            + ", ".join(missing)
        )
        self.device_id = device_id
        self.model = model
        self.missing = missing
        self.field = field


def load_profile_file(path: Path) -> DeviceProfile:
    """Parse one profile file, refusing unknown schema versions before validating fields."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path.name}: cannot read profile: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"{path.name}: a profile must be a JSON object")
    version = raw.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise ProfileError(
            f"{path.name}: schema_version {version!r} is not supported "
            f"(supported: {list(SUPPORTED_SCHEMA_VERSIONS)})"
        )
    try:
        profile = DeviceProfile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(f"{path.name}: {exc}") from exc
    if profile.id != path.stem:
        raise ProfileError(f"{path.name}: id {profile.id!r} must equal the file name stem")
    return profile


def load_profiles(directory: Path = PROFILE_DIR) -> dict[str, DeviceProfile]:
    """All profiles in ``directory`` keyed by id."""
    return {p.id: p for p in map(load_profile_file, sorted(directory.glob("*.json")))}


@lru_cache(maxsize=1)
def default_profiles() -> dict[str, DeviceProfile]:
    """The packaged profiles, loaded once per process."""
    return load_profiles()


def get_profile(device_id: str) -> DeviceProfile:
    profiles = default_profiles()
    try:
        return profiles[device_id]
    except KeyError:
        raise UnknownDevice(device_id, sorted(profiles)) from None
