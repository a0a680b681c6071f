"""Device profiles: cited hardware and model figures, their schema and their loader."""

from device_profiles.loader import (
    ModelNotServed,
    ProfileError,
    UnknownDevice,
    default_profiles,
    get_profile,
    load_profile_file,
    load_profiles,
)
from device_profiles.schema import DeviceProfile

__all__ = [
    "ModelNotServed",
    "DeviceProfile",
    "ProfileError",
    "UnknownDevice",
    "default_profiles",
    "get_profile",
    "load_profile_file",
    "load_profiles",
]
