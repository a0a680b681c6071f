"""Copying a core dataclass into a response model by the names both declare.

The response schemas repeat many of the core's quantities under the core's own names (the
paper's: ``w``, ``COMP``, ``block_comm``...). Copying them by name, rather than one keyword
each, keeps a schema and its core type from drifting apart silently: a field renamed on one
side only is then a missing field, which pydantic refuses.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@functools.cache
def _shared_names(
    model: type[BaseModel], source: type[DataclassInstance], besides: frozenset[str]
) -> tuple[str, ...]:
    declared = {f.name for f in dataclasses.fields(source)} - besides
    return tuple(name for name in model.model_fields if name in declared)


def shared_fields(
    model: type[BaseModel], source: DataclassInstance, besides: Collection[str] = ()
) -> dict[str, Any]:
    """The values of ``source`` (a dataclass instance) under the field names ``model`` also
    declares, as keyword arguments of ``model``; ``besides``: names the caller gives otherwise
    (converted)."""
    names = _shared_names(model, type(source), frozenset(besides))
    return {name: getattr(source, name) for name in names}
