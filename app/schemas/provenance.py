"""Where the figures behind an answer come from: the ``profile_provenance`` of
/optimize-tiling, /predict-kernel and GET /devices/{id} answers (issue 16)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from device_profiles import DeviceProfile, profile_provenance


class ProfileProvenance(BaseModel):
    kind: Literal["published", "estimated", "calibrated", "inline"] = Field(
        description="published: papers or public documents state every figure the model "
        "used; estimated: some are uncalibrated estimates (their priors: GET /devices/{id}); "
        "calibrated: fitted to measured runs (POST /calibrate); inline: the request's own "
        "device_params"
    )
    measurement_count: int | None = Field(
        default=None, description="measured runs the calibration used; null unless calibrated"
    )


def provenance_out(profile: DeviceProfile | None, model: str | None) -> ProfileProvenance:
    """The provenance of ``profile`` for ``model`` (every model when None); None: inline."""
    if profile is None:
        return ProfileProvenance(kind="inline")
    p = profile_provenance(profile, model)
    return ProfileProvenance(kind=p.kind, measurement_count=p.measurement_count)
