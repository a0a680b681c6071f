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
    FigureStatus,
    ModelStatus,
    Provenance,
    calibration_needs,
    calibration_status,
    figure_statuses,
    is_calibratable,
    model_status,
    profile_provenance,
)

__all__ = [
    "CALIBRATABLE_FIGURES",
    "FigureNeed",
    "FigureStatus",
    "Provenance",
    "ModelNotServed",
    "ModelStatus",
    "DeviceProfile",
    "ProfileError",
    "UnknownDevice",
    "calibration_needs",
    "calibration_status",
    "default_profiles",
    "get_profile",
    "figure_statuses",
    "is_calibratable",
    "load_profile_file",
    "load_profiles",
    "model_status",
    "profile_provenance",
]
