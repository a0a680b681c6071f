"""Errors that name the offending input: the ``field`` and ``reason`` a problem answer lists."""

from __future__ import annotations


class FieldReasonError(Exception):
    """Refused input: ``field`` names it (a dotted path), ``reason`` says what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
