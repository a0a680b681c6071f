"""The priors and per-dtype throughput ratios a profile cites, as the core's records.

A profile's figures carry their log-normal priors (schema_version 3, ``prior``); the MAP
calibration (perfmodel.calibration) and the uncertainty of predictions (perfmodel.belief) take
them as :class:`perfmodel.prior.Prior`. Derivations: docs/model-notes.md, "Priors".
"""

from __future__ import annotations

from pydantic import BaseModel

from device_profiles.schema import DeviceProfile, Figure
from perfmodel.prior import Prior

#: element types whose GeMM-WS figures a profile without ``gemm_ws_dtypes`` serves at the
#: fp16 figures (the paper's reading: §4.2's durations are per element whatever the type)
ALL_DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")


def _section_priors(section: BaseModel | None) -> dict[str, Prior]:
    if section is None:
        return {}
    out = {}
    for name in type(section).model_fields:
        figure = getattr(section, name)
        if isinstance(figure, Figure) and figure.prior is not None:
            p = figure.prior
            out[name] = Prior(p.median, p.sigma_log, p.source)
    return out


def gemm_ws_priors(profile: DeviceProfile) -> dict[str, Prior]:
    """The priors the profile's GeMM-WS figures cite, by figure name."""
    return _section_priors(profile.gemm_ws)


def many_bsp_priors(profile: DeviceProfile) -> dict[str, Prior]:
    """The priors the profile's Many-BSP figures cite, by figure name."""
    return _section_priors(profile.many_bsp)


def gemm_ws_dtype_ratios(profile: DeviceProfile) -> dict[str, tuple[float, float]]:
    """dtype -> (load, compute) throughput relative to the gemm_ws (fp16) figures, for the
    element types the device has; every dtype at (1, 1) when the profile cites none."""
    if profile.gemm_ws_dtypes is None:
        return dict.fromkeys(ALL_DTYPES, (1.0, 1.0))
    return {d: (r.load, r.compute) for d, r in profile.gemm_ws_dtypes.items()}
