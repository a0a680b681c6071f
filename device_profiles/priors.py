"""The priors of a profile's calibratable figures, and its GeMM-WS per-dtype ratios, as the
plain records the calibration engine and the request conversions take.

A profile file carries the priors as cited data (``prior`` on a figure, schema_version 3;
docs/model-notes.md, "Priors"); this module only reads them out. It knows nothing of HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from device_profiles.schema import CALIBRATABLE_FIGURES, DeviceProfile, Figure

if TYPE_CHECKING:  # the service process must not load the calibration (numerical) stack
    from perfmodel.calibration.priors import Prior

#: the dtype the GeMM-WS figures of a profile are given in (the §4.2 kernel's fp16)
REFERENCE_DTYPE = "fp16"


def _priors(section: object, names: tuple[str, ...]) -> dict[str, Prior]:
    from perfmodel.calibration.priors import Prior  # noqa: PLC0415 - see TYPE_CHECKING above

    out: dict[str, Prior] = {}
    for name in names:
        figure = getattr(section, name, None) if section is not None else None
        if isinstance(figure, Figure) and figure.prior is not None:
            p = figure.prior
            out[name] = Prior(median=p.median, sigma_log=p.sigma_log, source=p.source)
    return out


def gemm_ws_priors(profile: DeviceProfile) -> dict[str, Prior]:
    """Figure name -> prior, for the GeMM-WS figures of ``profile`` that carry one."""
    return _priors(profile.gemm_ws, CALIBRATABLE_FIGURES["gemm-ws"])


def many_bsp_priors(profile: DeviceProfile) -> dict[str, Prior]:
    """Figure name -> prior, for the calibratable Many-BSP figures that carry one."""
    return _priors(profile.many_bsp, CALIBRATABLE_FIGURES["many-bsp"])


def gemm_ws_dtype_ratios(profile: DeviceProfile) -> dict[str, tuple[float, float]]:
    """dtype -> (load ratio, compute ratio) multiplying the reference-dtype (fp16)
    throughputs, for the element types the device has. Empty when the profile does not say
    (schema_version 1 and 2 files): every dtype then uses the throughputs unchanged."""
    if profile.gemm_ws is None:
        return {}
    return {
        dtype: (r.load_ratio, r.compute_ratio) for dtype, r in profile.gemm_ws.dtype_ratios.items()
    }
