"""Domain errors of the tiling optimizer (mapped to HTTP once, in ``app/errors.py``).

Hierarchy::

    ValueError
    ├── ModelInputError
    │   └── InvalidSearchSpace    a dimension's list/range is empty or malformed (field named)
    ├── InfeasibleSearchSpace     every candidate breaks a hardware constraint (defined with
    │                             the models' errors: a model raises it too)
    └── UnknownDeviceName         no CUDA device name known for a table's file name
    RuntimeError
    └── SolverTimeout             the time limit expired before any configuration was found
    AssertionError
    └── CertificateMismatch       Z3 refuted the scorer's incumbent (a bug; strict mode only)
"""

from __future__ import annotations

from perfmodel.errors import InfeasibleSearchSpace, ModelInputError

__all__ = [
    "CertificateMismatch",
    "InfeasibleSearchSpace",
    "InvalidSearchSpace",
    "SolverTimeout",
    "UnknownDeviceName",
]


class InvalidSearchSpace(ModelInputError):
    """A search space dimension the solver cannot read; ``field`` is relative to it."""


class UnknownDeviceName(ValueError):
    """A serving engine's table is named after the GPU's CUDA name, and none is known for the
    device (the request's ``device_name`` gives it)."""

    def __init__(self, device: str) -> None:
        self.field = "device_name"
        self.reason = (
            f"no CUDA device name is known for {device!r}: give device_name "
            "(torch.cuda.get_device_name()) for the engine's file name, or format 'json'"
        )
        super().__init__(self.reason)


class SolverTimeout(RuntimeError):
    def __init__(self, time_limit_s: float) -> None:
        super().__init__(
            f"no configuration was found within the time limit of {time_limit_s} s; "
            "raise time_limit_s or shrink the search space"
        )
        self.time_limit_s = time_limit_s


class CertificateMismatch(AssertionError):
    """The exact scorer and the Z3 encoding of eq. (1)-(3) disagree (a bug in one of them)."""
