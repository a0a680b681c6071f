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
from device_profiles.schema import CALIBRATABLE_FIGURES, DeviceProfile
from device_profiles.status import (
    FigureNeed,
    ModelStatus,
    calibration_status,
    is_calibratable,
    model_status,
)

__all__ = [
    "CALIBRATABLE_FIGURES",
    "FigureNeed",
    "ModelNotServed",
    "ModelStatus",
    "DeviceProfile",
    "ProfileError",
    "UnknownDevice",
    "calibration_status",
    "default_profiles",
    "get_profile",
    "is_calibratable",
    "load_profile_file",
    "load_profiles",
    "model_status",
]
