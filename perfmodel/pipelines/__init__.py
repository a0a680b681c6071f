"""The registry of pipeline models: the name a request or a profile gives -> one
:class:`perfmodel.pipeline.PipelineModel`.

This is the one place that chooses between models. A factory builds its model from the
settings every model may read (the wave-time variant, the SM's residency limits); each
factory imports its model where it runs, so resolving one model never loads another's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perfmodel.errors import InfeasibleSearchSpace, ModelInputError
from perfmodel.gemm_ws import SmLimits, WaveTimeModel
from perfmodel.pipeline import PipelineModel

if TYPE_CHECKING:
    from perfmodel.gemm_ws_memory_model import Recurrences


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    """What a request and a device say that a model may read."""

    wave_model: WaveTimeModel = WaveTimeModel.PAPER
    #: per-SM residency limits (CTAs that may share an SM), with the request's CTA size
    limits: SmLimits = field(default_factory=SmLimits)


Factory = Callable[[PipelineSettings], PipelineModel]


class UnknownPipelineModel(ModelInputError):
    """A pipeline model name no factory is registered under."""

    def __init__(self, name: str, field_name: str = "pipeline_model") -> None:
        super().__init__(
            field_name,
            f"unknown pipeline model {name!r}; choose one of: {', '.join(names())}",
        )


def _paper(settings: PipelineSettings) -> PipelineModel:
    from perfmodel.pipelines.paper import PaperPipeline

    return PaperPipeline(settings.wave_model)


def check_cta_fits(limits: SmLimits) -> None:
    """Refuse a CTA (the request's threads_per_cta x registers_per_thread) that fits no SM
    whatever its buffer: InfeasibleSearchSpace naming the field that makes it too large."""
    if limits.ctas_per_sm(1) < 1:
        registers = limits.registers_per_thread
        field_name = "registers_per_thread" if registers is not None else "threads_per_cta"
        raise InfeasibleSearchSpace(
            f"a CTA of {limits.threads_per_cta} threads x {registers or 0} registers does not "
            f"fit one SM ({limits.max_threads_per_sm} threads, {limits.registers_per_sm} "
            "registers)",
            {"registers_per_sm" if registers is not None else "max_threads_per_sm": 1},
            field=field_name,
        )


def _async_copy(settings: PipelineSettings) -> PipelineModel:
    from perfmodel.pipelines.async_copy import AsyncCopyPipeline

    check_cta_fits(settings.limits)
    return AsyncCopyPipeline(settings.limits)


#: the model a problem is solved under when nothing names one (the paper's eq. (1)-(3))
DEFAULT_NAME = "paper"

_FACTORIES: dict[str, Factory] = {DEFAULT_NAME: _paper, "async-copy": _async_copy}


def register(name: str, factory: Factory) -> None:
    """Serve ``name`` with the model ``factory`` builds (a name already taken is refused)."""
    if name in _FACTORIES:
        raise ValueError(f"pipeline model {name!r} is already registered")
    _FACTORIES[name] = factory


def unregister(name: str) -> None:
    """Stop serving ``name`` (built-in models included)."""
    del _FACTORIES[name]


def names() -> tuple[str, ...]:
    """The names served, in registration order."""
    return tuple(_FACTORIES)


def is_registered(name: str) -> bool:
    return name in _FACTORIES


def resolve(name: str, settings: PipelineSettings | None = None) -> PipelineModel:
    """The model ``name`` names under ``settings``; UnknownPipelineModel lists the valid names."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise UnknownPipelineModel(name)
    return factory(settings or PipelineSettings())


def memory_recurrences(model: PipelineModel) -> Recurrences:
    """The stage recurrences the L2-reuse memory term runs under ``model``: the paper's
    eq. (1)-(3) for the paper model, the async-copy ring for every other model."""
    return "paper" if model.name == DEFAULT_NAME else "async-copy"


__all__ = [
    "DEFAULT_NAME",
    "PipelineSettings",
    "UnknownPipelineModel",
    "check_cta_fits",
    "is_registered",
    "memory_recurrences",
    "names",
    "register",
    "resolve",
    "unregister",
]
