"""Reading the command line into request bodies."""

from __future__ import annotations

import argparse
from typing import Any


def given(args: argparse.Namespace, *names: str, **renamed: str) -> dict[str, Any]:
    """The request fields whose option the command line gave (its value not None): each of
    ``names`` from the option of the same name, each key of ``renamed`` from the option its
    value names (``kernel="kernel_name"``)."""
    fields = {**{name: name for name in names}, **renamed}
    values = {field: getattr(args, dest) for field, dest in fields.items()}
    return {field: value for field, value in values.items() if value is not None}
