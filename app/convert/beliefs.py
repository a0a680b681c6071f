"""What is believed about a device's figures, per model, for the uncertainty of answers: the
posterior of the profile's last calibration of that model, else the priors its figures cite.

Worker-only (numpy, through perfmodel.belief): app/jobs.py imports it inside the jobs.
"""

from __future__ import annotations

from typing import Literal

from device_profiles import DeviceProfile
from device_profiles.priors import many_bsp_priors
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
    posterior = _posterior(profile, "gemm-ws")
    if posterior is not None:
        return "calibration", posterior
    section = profile.gemm_ws if profile is not None else None
    priors = {}
    for name in BELIEF_FIGURES:
        cited = getattr(getattr(section, name, None), "prior", None)
        value = float(getattr(machine, name))
        if cited is not None:
            priors[name] = Prior(cited.median, cited.sigma_log, cited.source)
        elif value > 0:
            priors[name] = Prior(value, UNCITED_SIGMA_LOG, "no cited prior: wide")
    values = {name: float(getattr(machine, name)) for name in BELIEF_FIGURES}
    return "priors", FigureBelief.from_priors(priors, values)


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
    posterior = _posterior(profile, "many-bsp")
    if posterior is not None:
        return "calibration", posterior
    cited = many_bsp_priors(profile) if profile is not None else {}
    priors = {
        name: cited.get(name, Prior(values[name], UNCITED_SIGMA_LOG, "no cited prior: wide"))
        for name in MANY_BSP_BELIEF_FIGURES
        if values.get(name, 0.0) > 0
    }
    return "priors", FigureBelief.from_priors(priors, values)
