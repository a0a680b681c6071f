"""The Z3 encodings of the pipeline models, keyed by the model's type.

A pipeline model (perfmodel/pipeline.py) knows its recurrences, its scorer and its bounds, but
nothing of Z3: its encoding lives here, in the solver, and is found by the type of the model
object the registry of models (perfmodel/pipelines) resolved. The certificate and the Z3 search
(solver/per_configuration.py) call :func:`encode`; a model defined elsewhere plugs in with
:func:`register` where it is defined, without editing this package.

An encoder takes ``(model, gemm, configs)`` and returns the :class:`solver.encoding.Encoding`
of exactly ``configs``: the recurrences over integers, ``overall_time`` and ``total_math_wait``
per configuration. The built-in models' encoders (one module each) are registered on import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from perfmodel.pipelines.async_copy import AsyncCopyPipeline
from perfmodel.pipelines.l2_reuse import L2ReuseModel
from perfmodel.pipelines.paper import PaperPipeline
from solver.encoding import Encoding
from solver.encodings.async_copy import encode_async_copy
from solver.encodings.l2_reuse import encode_l2_reuse
from solver.encodings.paper import encode_paper

if TYPE_CHECKING:
    from perfmodel.gemm_ws_scoring import Configurations
    from perfmodel.pipeline import GemmOnMachine

_M = TypeVar("_M")

#: an encoder: (model, gemm, configs) -> the encoding of exactly ``configs``
Encoder = Callable[[Any, "GemmOnMachine", "Configurations"], Encoding]

_ENCODERS: dict[type, Encoder] = {}


def register(
    model_type: type[_M], encoder: Callable[[_M, GemmOnMachine, Configurations], Encoding]
) -> None:
    """Encode models of ``model_type`` (and of its subclasses) with ``encoder``; registering a
    type again replaces its encoder."""
    _ENCODERS[model_type] = encoder


def encoder_of(model: object) -> Encoder:
    """The encoder of ``model``'s type, else of its nearest registered base class."""
    for cls in type(model).__mro__:
        encoder = _ENCODERS.get(cls)
        if encoder is not None:
            return encoder
    raise TypeError(
        f"no Z3 encoding is registered for the pipeline model {type(model).__qualname__} "
        "(solver.encodings.register)"
    )


def encode(model: object, gemm: GemmOnMachine, configs: Configurations) -> Encoding:
    """The Z3 encoding of exactly ``configs`` of ``gemm`` under ``model``."""
    return encoder_of(model)(model, gemm, configs)


register(PaperPipeline, encode_paper)
register(AsyncCopyPipeline, encode_async_copy)
register(L2ReuseModel, encode_l2_reuse)

__all__ = ["Encoder", "encode", "encoder_of", "register"]
