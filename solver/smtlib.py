"""SMT-LIB 2 text of small integer terms, shared by every Z3 encoding (solver/encoding.py and
the pipeline models' own, solver/encodings/): each returns the term as text, so an encoding
is parsed by Z3 in one call rather than built object by object."""

from __future__ import annotations

from collections.abc import Mapping


def integer(value: int) -> str:
    """An integer literal (SMT-LIB has no negative literals: ``(- n)``)."""
    return str(value) if value >= 0 else f"(- {-value})"


def maximum(a: str, b: str) -> str:
    """max(a, b) of two integer terms."""
    return f"(ite (>= {a} {b}) {a} {b})"


def one_of(var: str, values: tuple[int, ...]) -> str:
    """``var`` takes one of the ascending ``values``: a range test when they are contiguous."""
    if values == tuple(range(values[0], values[-1] + 1)):
        return f"(and (>= {var} {values[0]}) (<= {var} {values[-1]}))"
    return "(or " + " ".join(f"(= {var} {v})" for v in values) + ")"


def all_equal(values: Mapping[str, int]) -> str:
    """Each variable named in ``values`` equals its value (a configuration's condition)."""
    return "(and " + " ".join(f"(= {var} {value})" for var, value in values.items()) + ")"
