"""What a profile lacks for each model, and which of it a calibration run fills.

Every figure a model needs falls in one of four states for a given profile:

* cited: present, with a source that states it (or a derivation in docs/model-notes.md);
* absent, calibratable (:data:`~device_profiles.schema.CALIBRATABLE_FIGURES`): no public
  source gives it for this device, measured runs do (POST /calibrate) -> ``needs_calibration``;
* absent, not calibratable: it must be cited in the file before the model can serve -> ``missing``;
* present but flagged ``estimate`` (schema_version 2): served, and listed under
  ``needs_calibration`` when a run can fit it, else under ``estimates``.

A model serves a profile when none of its figures is absent. The routes turn these records
into the ``needs_calibration`` listing of GET /devices/{id}; nothing here knows HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from device_profiles.schema import (
    CALIBRATABLE_FIGURES,
    FLOOR_FIGURE,
    REQUIRED_GEMM_WS_FIGURES,
    REQUIRED_MANY_BSP_CLASSES,
    REQUIRED_MANY_BSP_FIGURES,
    BarrierOverheadPoint,
    DeviceProfile,
    Figure,
    InstructionClassFigures,
)

#: the models a profile can serve, in the order listings show them
MODELS: tuple[str, ...] = ("gemm-ws", "many-bsp")

FigureState = Literal["absent", "estimate"]
ModelState = Literal[
    "served", "calibrated", "uncalibrated-estimates", "needs-calibration", "missing-figures"
]

#: why each calibratable figure has no public value: what it is and where the papers got it
_CALIBRATABLE_REASONS: dict[str, str] = {
    "mu": "mu of eq. (24)-(25), the speedup of blocks sharing an SM: the Many-BSP report "
    "fits it per device from measured kernels (§2, §5 parameter blocks); no public source "
    "gives it for this device",
    "block_launch_overhead_cycles": "block_lnch_ovh of Table 1-8, cycles to launch a block: "
    "measured with the report's own microbenchmarks for its three GPUs only",
    "warp_launch_overhead_cycles": "warp_lnch_ovh of Table 1-8, cycles to launch a warp: "
    "measured with the report's own microbenchmarks for its three GPUs only",
    "throughput_efficiency": "the fraction of the issue/unit peak per cycle of clock_mhz a "
    "board sustains: its clock under load (unlocked boost clocks vary with power and "
    "temperature) and its issue stalls; no public source gives it for a board",
}
_GEMM_WS_REASON = (
    "GeMM-WS §4.2 measures it for one kernel on the RTX A6000: an effective rate or time of "
    "that kernel, not a hardware figure (the A6000 throughputs are ~30-40x below its peaks, "
    "docs/model-notes.md), so no public source gives it for this device"
)


@dataclass(frozen=True)
class FigureNeed:
    """One figure a model needs that this profile lacks, or carries only as an estimate."""

    figure: str  #: dotted path in the profile file, e.g. ``many_bsp.mu``
    name: str  #: the name a calibration request's ``fit`` list takes, e.g. ``mu``
    state: FigureState
    calibratable: bool
    reason: str


@dataclass(frozen=True)
class ModelStatus:
    """One model's view of one profile."""

    model: str
    #: calibratable figures that are absent or uncalibrated estimates: what a run fills
    needs_calibration: tuple[FigureNeed, ...]
    #: absent figures no calibration fits: they need a cited figure in the file
    missing: tuple[FigureNeed, ...]
    #: estimates no calibration fits: served, but flagged until a cited figure replaces them
    estimates: tuple[FigureNeed, ...]
    #: the profile was fitted to measured runs of this model (POST /calibrate)
    calibrated: bool = False
    #: what a calibration that names no ``fit`` fits on this profile (:func:`default_fit`)
    default_fit: tuple[str, ...] = ()

    @property
    def served(self) -> bool:
        """True when the model can answer for this profile now."""
        return not any(n.state == "absent" for n in self.needs_calibration + self.missing)

    @property
    def state(self) -> ModelState:
        if self.missing:
            return "missing-figures"
        if not self.served:
            return "needs-calibration"
        if self.calibrated:
            # fitted to runs; the figures the runs did not determine are still listed as
            # estimates held by their priors, which "uncalibrated" would misname
            return "calibrated"
        if self.needs_calibration or self.estimates:
            return "uncalibrated-estimates"
        return "served"

    @property
    def fit(self) -> tuple[str, ...]:
        """The ``fit`` list of the calibration request that fills ``needs_calibration``."""
        return tuple(n.name for n in self.needs_calibration)


@dataclass(frozen=True)
class _Required:
    figure: str
    name: str
    present: bool
    estimate: bool
    note: str | None


def _cited(path: str, name: str, item: object) -> _Required:
    if item is None:
        return _Required(path, name, False, False, None)
    assert isinstance(item, Figure | InstructionClassFigures)
    return _Required(path, name, True, item.estimate, item.note or item.source)


def _barrier(points: list[BarrierOverheadPoint]) -> _Required:
    flagged = [p for p in points if p.estimate]
    note = (flagged[0].note or flagged[0].source) if flagged else None
    path = "many_bsp.bar_sync_overhead"
    return _Required(path, "bar_sync_overhead", bool(points), bool(flagged), note)


def _required(profile: DeviceProfile, model: str) -> Iterator[_Required]:
    """Every figure ``model`` needs, in the order of the schema's REQUIRED lists."""
    if model == "gemm-ws":
        section = profile.gemm_ws
        for name in REQUIRED_GEMM_WS_FIGURES:
            item = getattr(section, name) if section is not None else None
            yield _cited(f"gemm_ws.{name}", name, item)
        return
    if model != "many-bsp":
        raise ValueError(f"unknown model {model!r}; known models: {', '.join(MODELS)}")
    mb = profile.many_bsp
    for name in REQUIRED_MANY_BSP_FIGURES:
        yield _cited(f"many_bsp.{name}", name, getattr(mb, name) if mb is not None else None)
    yield _barrier(mb.bar_sync_overhead if mb is not None else [])
    classes = mb.instruction_classes if mb is not None else {}
    for key in REQUIRED_MANY_BSP_CLASSES:
        path = f"many_bsp.instruction_classes.{key}"
        yield _cited(path, f"instruction_classes.{key}", classes.get(key))
    if mb is None:
        return
    # optional figures the model reads when present: served, so an estimate among them is
    # listed like a required one's
    for name in type(mb).model_fields:
        item = getattr(mb, name)
        if name not in REQUIRED_MANY_BSP_FIGURES and isinstance(item, Figure) and item.estimate:
            yield _cited(f"many_bsp.{name}", name, item)
    for key, c in classes.items():
        if key not in REQUIRED_MANY_BSP_CLASSES and c.estimate:
            yield _cited(f"many_bsp.instruction_classes.{key}", f"instruction_classes.{key}", c)


def model_status(profile: DeviceProfile, model: str) -> ModelStatus:
    """What ``model`` needs from ``profile`` and lacks; ValueError names the known models."""
    calibratable = set(CALIBRATABLE_FIGURES.get(model, ()))
    needs: list[FigureNeed] = []
    missing: list[FigureNeed] = []
    estimates: list[FigureNeed] = []
    for req in _required(profile, model):
        if req.present and not req.estimate:
            continue
        can_fit = req.name in calibratable
        if req.present:
            reason = f"uncalibrated estimate: {req.note}"
        elif can_fit:
            reason = _CALIBRATABLE_REASONS.get(req.name, _GEMM_WS_REASON)
        else:
            reason = (
                f"no cited public figure in device_profiles/{profile.id}.json and no "
                "calibration run fits it: add the figure with its source"
            )
        need = FigureNeed(
            req.figure, req.name, "estimate" if req.present else "absent", can_fit, reason
        )
        if can_fit:
            needs.append(need)
        elif req.present:
            estimates.append(need)
        else:
            missing.append(need)
    calibrated = profile.calibration is not None and profile.calibration.model == model
    return ModelStatus(
        model,
        tuple(needs),
        tuple(missing),
        tuple(estimates),
        calibrated,
        default_fit(profile, model),
    )


def default_fit(profile: DeviceProfile, model: str) -> tuple[str, ...]:
    """The figures a calibration of ``model`` on ``profile`` fits when it names no ``fit``
    (perfmodel.calibration's default): every calibratable figure, but the throughput floor's
    efficiency on a Many-BSP profile without ``sector_bytes``, where no floor reads it."""
    figures = CALIBRATABLE_FIGURES[model]
    floor = profile.many_bsp is not None and profile.many_bsp.sector_bytes is not None
    if model == "many-bsp" and not floor:
        return tuple(name for name in figures if name != FLOOR_FIGURE)
    return figures


def calibration_status(profile: DeviceProfile) -> dict[str, ModelStatus]:
    """:func:`model_status` for every model, keyed by model name."""
    return {model: model_status(profile, model) for model in MODELS}


def is_calibratable(model: str, figure: str) -> bool:
    """Whether a calibration run fits ``figure`` (a dotted path or a bare name) of ``model``."""
    return figure.rsplit(".", 1)[-1] in CALIBRATABLE_FIGURES.get(model, ())


def calibration_needs(profile: DeviceProfile) -> dict[str, list[str]]:
    """Per model, the dotted names of the figures it needs that a calibration run fits and
    ``profile`` lacks or carries only as an estimate."""
    return {
        model: [need.figure for need in status.needs_calibration]
        for model, status in calibration_status(profile).items()
    }
