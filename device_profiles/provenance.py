"""Where a profile's figures for a model come from, as every answer reports it (so a user can
tell a fitted figure from an estimate):
``calibrated`` (a calibration of that model made it, with its run count), ``estimated`` (a
figure the model uses is an uncalibrated estimate), or ``published`` (every figure cited)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from device_profiles.schema import (
    MODEL_SECTIONS,
    REQUIRED_GEMM_WS_FIGURES,
    REQUIRED_MANY_BSP_FIGURES,
    DeviceProfile,
    Figure,
    FigurePrior,
)

ProvenanceKind = Literal["published", "estimated", "calibrated", "inline"]
#: the scalar figures of each model, in the schema's order
_SCALARS = {"gemm-ws": REQUIRED_GEMM_WS_FIGURES, "many-bsp": REQUIRED_MANY_BSP_FIGURES}
FigureSource = Literal["published", "estimated", "calibrated"]


@dataclass(frozen=True, slots=True)
class Provenance:
    kind: ProvenanceKind
    measurement_count: int | None
    #: dotted names of the model's figures that are estimates (empty unless estimated)
    estimated_figures: tuple[str, ...]


def provenance(profile: DeviceProfile | None, model: str) -> Provenance:
    """The provenance of ``profile``'s ``model`` figures (None: inline figures)."""
    if profile is None:
        return Provenance("inline", None, ())
    prefix = MODEL_SECTIONS[model] + "."
    estimates = tuple(f for f in profile.estimated_figures() if f.startswith(prefix))
    calibration = profile.calibration
    if calibration is not None and calibration.model == model:
        return Provenance("calibrated", calibration.measurement_count, estimates)
    return Provenance("estimated" if estimates else "published", None, estimates)


@dataclass(frozen=True, slots=True)
class FigureStatus:
    """One scalar figure a model uses: its value, where it comes from and its prior."""

    figure: str  #: dotted path in the profile, e.g. ``gemm_ws.t_init_us``
    value: float
    status: FigureSource
    prior: FigurePrior | None


def figure_statuses(profile: DeviceProfile, model: str) -> list[FigureStatus]:
    """The scalar figures ``model`` uses that ``profile`` carries: ``calibrated`` when a
    calibration of that model fitted (and identified) it, ``estimated`` when flagged an
    estimate, else ``published``. Instruction classes and bar.sync points are listed in the
    profile itself (they have no prior: no run fits them)."""
    section = getattr(profile, MODEL_SECTIONS[model])
    calibration = profile.calibration
    fitted = set(calibration.fitted) if calibration and calibration.model == model else set()
    out = []
    for name in _SCALARS[model]:
        figure = getattr(section, name, None) if section is not None else None
        if not isinstance(figure, Figure):
            continue
        status: FigureSource = "estimated" if figure.estimate else "published"
        if name in fitted and not figure.estimate:
            status = "calibrated"
        path = f"{MODEL_SECTIONS[model]}.{name}"
        out.append(FigureStatus(path, figure.value, status, figure.prior))
    return out
