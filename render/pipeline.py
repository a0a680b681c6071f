"""The timeline picture of one simulated configuration, whatever pipeline model simulated it.

:func:`pipeline_timeline_svg` dispatches on the prediction's type (``functools.singledispatch``,
so a subclass draws as its nearest registered base): the paper model's
:class:`perfmodel.gemm_ws.Simulation` as :func:`render.timeline.timeline_svg`, the async-copy
model's :class:`~perfmodel.pipelines.async_copy.recurrences.AsyncSimulation` (and the L2-reuse
model's prediction, which extends it) as :func:`render.timeline.async_timeline_svg`. A model
defined elsewhere draws its own predictions with :func:`register`, where it is defined, without
editing this package (tests/test_third_pipeline_model.py does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from perfmodel.gemm_ws import GemmWsMachine, Simulation
from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation
from render.timeline import async_timeline_svg, timeline_svg

_P = TypeVar("_P")

#: a renderer: (prediction, machine, **labels) -> SVG bytes
Renderer = Callable[..., bytes]


@functools.singledispatch
def pipeline_timeline_svg(prediction: Any, machine: GemmWsMachine, **labels: Any) -> bytes:
    """The timeline of ``prediction`` (one configuration simulated on ``machine``, with its
    events) as SVG bytes; ``labels``: the heading's (device, dtype, rank)."""
    raise TypeError(
        f"no timeline picture is registered for predictions of type "
        f"{type(prediction).__qualname__} (render.pipeline.register)"
    )


def register(prediction_type: type[_P], renderer: Callable[..., bytes]) -> None:
    """Draw predictions of ``prediction_type`` (and of its subclasses) with ``renderer``,
    called as ``renderer(prediction, machine, **labels)``."""
    pipeline_timeline_svg.register(prediction_type, renderer)


def _paper(prediction: Simulation, machine: GemmWsMachine, **labels: Any) -> bytes:
    return timeline_svg(prediction, machine, **labels)


def _async_copy(prediction: AsyncSimulation, machine: GemmWsMachine, **labels: Any) -> bytes:
    return async_timeline_svg(prediction, machine, **labels)


register(Simulation, _paper)
register(AsyncSimulation, _async_copy)

__all__ = ["Renderer", "pipeline_timeline_svg", "register"]
