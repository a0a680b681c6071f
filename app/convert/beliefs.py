"""What is believed about a device's figures, per model, for the uncertainty of answers: the
posterior of the profile's last calibration of that model, else the priors its figures cite.

Worker-only (numpy, through perfmodel.belief): app/jobs.py imports it inside the jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from device_profiles import DeviceProfile
from device_profiles.priors import gemm_ws_priors, many_bsp_priors
from device_profiles.schema import CALIBRATABLE_FIGURES
from perfmodel.belief import FigureBelief, Prior
from perfmodel.gemm_ws import GemmWsMachine

#: the figures a belief covers per model: those a calibration fits
MANY_BSP_BELIEF_FIGURES = CALIBRATABLE_FIGURES["many-bsp"]
BELIEF_FIGURES = CALIBRATABLE_FIGURES["gemm-ws"]
#: a figure no profile cites a prior for is believed within a factor e (1 sd) of its value
UNCITED_SIGMA_LOG = 1.0


def gemm_ws_belief(
    profile: DeviceProfile | None, machine: GemmWsMachine
) -> tuple[Literal["calibration", "priors"], FigureBelief]:
    """What is believed about the reference (fp16) figures ``machine`` holds: the posterior of
    the profile's last GeMM-WS calibration, else the priors its figures cite, centred on the
    figures' values (a wide one for a figure that cites none, and for inline device_params).
    Returns (kind, belief)."""
    values = {name: float(getattr(machine, name)) for name in BELIEF_FIGURES}
    cited = gemm_ws_priors(profile) if profile is not None else {}
    return _belief(profile, "gemm-ws", cited, values)


def _posterior(profile: DeviceProfile | None, model: str) -> FigureBelief | None:
    calibration = profile.calibration if profile is not None else None
    posterior = calibration.posterior if calibration is not None else None
    if calibration is None or calibration.model != model or posterior is None:
        return None
    return FigureBelief.from_calibration(
        posterior.figures, posterior.mean_log, posterior.covariance_log
    )


def many_bsp_belief(
    profile: DeviceProfile | None, values: dict[str, float]
) -> tuple[Literal["calibration", "priors"], FigureBelief]:
    """What is believed about mu and the launch overheads whose point values are ``values``:
    the profile's last Many-BSP calibration, else its cited priors (wide where none is)."""
    cited = many_bsp_priors(profile) if profile is not None else {}
    return _belief(profile, "many-bsp", cited, values)


def _belief(
    profile: DeviceProfile | None,
    model: str,
    cited: Mapping[str, Prior],
    values: Mapping[str, float],
) -> tuple[Literal["calibration", "priors"], FigureBelief]:
    """The profile's last calibration of ``model``, else the ``cited`` priors (a wide one
    around the value for a figure that cites none) centred on ``values``."""
    posterior = _posterior(profile, model)
    if posterior is not None:
        return "calibration", posterior
    priors = {
        name: cited[name]
        if name in cited
        else Prior(value, UNCITED_SIGMA_LOG, "no cited prior: wide")
        for name, value in values.items()
        if name in cited or value > 0
    }
    return "priors", FigureBelief.from_priors(priors, values)
