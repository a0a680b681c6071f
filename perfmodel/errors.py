"""Domain errors of the performance models (no HTTP knowledge here).

Hierarchy::

    ValueError
    ├── ModelInputError            bad model input; message says how to fix it
        ├── PTXSyntaxError         submitted text is not PTX we can read (line, column)
        ├── UnknownKernel          the requested entry is not in the module
        ├── AmbiguousKernel        no entry named and the module has several
        └── CalibrationInputError  measurements or fit options a calibration cannot use
            └── MeasurementLineError   a line of a JSONL measurements file (1-based line)
    └── InfeasibleSearchSpace      every configuration breaks a hardware constraint (the
                                   solver's, and a model's own: a CTA that fits no SM)
"""

from __future__ import annotations


class ModelInputError(ValueError):
    """Input the model cannot evaluate; ``field`` names the offending input."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnfittableMeasurements(ModelInputError):
    """Runs that no figures within the priors' range predict in finite time (every start of a
    fit overflowed): a property of the numbers together, which no request schema can state."""

    def __init__(self, reason: str) -> None:
        super().__init__("measurements", reason)


class PTXSyntaxError(ModelInputError):
    """The submitted text is not PTX we can read; ``line``/``column`` are 1-based."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__("ptx", f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column
        self.message = message


class UnknownKernel(ModelInputError):
    """The entry asked for is not a ``.entry`` of the module; ``entries`` lists those that are."""

    def __init__(self, name: str | None, entries: tuple[str, ...]) -> None:
        listed = ", ".join(entries) if entries else "none"
        if name is None:
            reason = "the module declares no .entry function; submit PTX with a kernel"
        else:
            reason = f"no .entry named {name!r} in the module; choose one of: {listed}"
        super().__init__("kernel", reason)
        self.name = name
        self.entries = entries


class AmbiguousKernel(ModelInputError):
    """No entry name given but the module has several ``.entry`` functions."""

    def __init__(self, entries: tuple[str, ...]) -> None:
        super().__init__(
            "kernel",
            "the module has several .entry functions; name one of: " + ", ".join(entries),
        )
        self.entries = entries


class CalibrationInputError(ModelInputError):
    """Measurements or fit options a calibration cannot use; ``field`` names the input, e.g.
    ``measurements``, ``measurements[3].measured_time_us``, ``fit`` or ``folds``."""


class MeasurementLineError(CalibrationInputError):
    """A line of a JSONL measurements file is not a measurement of the model asked for.

    ``line`` is 1-based; ``key`` is the offending key of the line's object, if one is.
    """

    def __init__(self, line: int, key: str | None, reason: str) -> None:
        super().__init__(f"line {line}" + (f".{key}" if key else ""), reason)
        self.line = line
        self.key = key


class InfeasibleSearchSpace(ValueError):
    def __init__(
        self, reason: str, rejected: dict[str, int], *, field: str = "search_space"
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rejected = rejected
        #: the request field holding the configurations: "search_space" or "candidates"
        self.field = field
