"""Read measurements from JSON Lines: one JSON object per line, blank lines skipped.

GeMM-WS line (what ``bench/measure_gemm.py`` writes)::

    {"model": "gemm-ws", "m": 4096, "n": 4096, "k": 4096, "dtype": "fp16", "tile_m": 128,
     "tile_n": 128, "tile_k": 64, "buffer_depth": 3, "measured_time_us": 812.4, "meta": {...}}

Many-BSP line: ``ptx`` (text), ``grid``/``block`` ([x, y, z]), ``measured_cycles``; optional
``kernel``, ``registers_per_thread``, ``shared_bytes_per_block``, ``loop_trip_counts``
({label: trips}), ``memory_transactions`` ({ptx line: n_ma}), ``clock_mhz``, ``device`` (must
be the id of the figures given to the loader).

``model`` is optional on a line; lines of another model are skipped, and a file with none of
the model asked for is refused. ``meta`` (any JSON) is ignored. Any other key is an error, so a
misspelt key does not pass silently. Every error names the 1-based line.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from perfmodel.calibration import validate
from perfmodel.calibration.gemm_ws import check_measurement
from perfmodel.calibration.records import (
    GEMM_WS_MODEL,
    MANY_BSP_MODEL,
    MODELS,
    GemmWsMeasurement,
    ManyBspMeasurement,
)
from perfmodel.errors import CalibrationInputError, MeasurementLineError
from perfmodel.manybsp import DeviceFigures, PredictRequest

_T = TypeVar("_T")
Source = os.PathLike[str] | Iterable[str]

_COMMON_KEYS = frozenset({"model", "meta"})
GEMM_WS_KEYS: tuple[str, ...] = (
    "m",
    "n",
    "k",
    "dtype",
    "tile_m",
    "tile_n",
    "tile_k",
    "buffer_depth",
    "measured_time_us",
)
MANY_BSP_REQUIRED: tuple[str, ...] = ("ptx", "grid", "block", "measured_cycles")
MANY_BSP_OPTIONAL: tuple[str, ...] = (
    "device",
    "kernel",
    "registers_per_thread",
    "shared_bytes_per_block",
    "loop_trip_counts",
    "memory_transactions",
    "clock_mhz",
)


def _numbered_lines(source: Source) -> Iterator[tuple[int, str]]:
    if isinstance(source, str):
        raise TypeError(
            "pass pathlib.Path(...) for a file, or text.splitlines() for JSONL text; "
            "a bare string is ambiguous"
        )
    if isinstance(source, os.PathLike):
        with Path(source).open(encoding="utf-8") as f:
            yield from enumerate(f, start=1)
    else:
        yield from enumerate(source, start=1)


def _objects(source: Source, model: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every line for ``model``; refuses a source with none."""
    if model not in MODELS:
        raise CalibrationInputError("model", f"unknown model {model!r}; choose from: {MODELS}")
    others: dict[str, int] = {}
    found = 0
    for number, text in _numbered_lines(source):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MeasurementLineError(number, None, f"not JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise MeasurementLineError(number, None, "each line must be one JSON object")
        line_model = obj.get("model", model)
        if line_model not in MODELS:
            raise MeasurementLineError(
                number, "model", f"unknown model {line_model!r}; choose from: {MODELS}"
            )
        if line_model != model:
            others[line_model] = others.get(line_model, 0) + 1
            continue
        found += 1
        yield number, obj
    if not found:
        held = ", ".join(f"{count} of {name}" for name, count in others.items()) or "none"
        raise CalibrationInputError(
            "measurements", f"no {model} measurements in the input (lines: {held})"
        )


def _check_keys(
    number: int,
    obj: Mapping[str, Any],
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
) -> None:
    allowed = set(required) | set(optional) | _COMMON_KEYS
    for key in obj:
        if key not in allowed:
            raise MeasurementLineError(
                number, key, "unknown key; allowed: " + ", ".join(sorted(allowed))
            )
    for key in required:
        if key not in obj:
            raise MeasurementLineError(number, key, "missing")


def _on_line(number: int, build: Callable[[], _T]) -> _T:
    """Run ``build``; a field error inside becomes an error on line ``number``."""
    try:
        return build()
    except MeasurementLineError:
        raise
    except CalibrationInputError as exc:
        raise MeasurementLineError(number, exc.field, exc.reason) from exc


def load_gemm_ws_jsonl(source: Source) -> list[GemmWsMeasurement]:
    out = []
    for number, obj in _objects(source, GEMM_WS_MODEL):
        _check_keys(number, obj, GEMM_WS_KEYS)
        record = GemmWsMeasurement(**{key: obj[key] for key in GEMM_WS_KEYS})
        _on_line(number, functools.partial(check_measurement, record, ""))
        out.append(record)
    return out


def _triple(value: object, field: str) -> tuple[int, int, int]:
    if not isinstance(value, list) or len(value) != 3:
        raise CalibrationInputError(field, f"must be [x, y, z], got {value!r}")
    x, y, z = (validate.whole(v, f"{field}.{a}") for v, a in zip(value, "xyz", strict=True))
    return x, y, z


def _whole_map(value: object, field: str, key_type: type) -> dict[Any, int]:
    if not isinstance(value, dict):
        raise CalibrationInputError(field, f"must be an object, got {value!r}")
    out: dict[Any, int] = {}
    for key, v in value.items():
        try:
            typed_key = key_type(key)
        except ValueError as exc:
            raise CalibrationInputError(f"{field}.{key}", "key must be a line number") from exc
        out[typed_key] = validate.whole(v, f"{field}.{key}")
    return out


def _many_bsp_record(obj: Mapping[str, Any], device: DeviceFigures) -> ManyBspMeasurement:
    if obj.get("device", device.device_id) != device.device_id:
        raise CalibrationInputError(
            "device",
            f"the run is on {obj['device']!r}; these figures are {device.device_id!r}",
        )
    if not isinstance(obj["ptx"], str):
        raise CalibrationInputError("ptx", "must be the PTX module as a string")
    kernel = obj.get("kernel")
    if kernel is not None and not isinstance(kernel, str):
        raise CalibrationInputError("kernel", f"must be a string, got {kernel!r}")
    optional_whole = {
        key: validate.whole(obj[key], key, minimum=0) if obj.get(key) is not None else None
        for key in ("registers_per_thread", "shared_bytes_per_block")
    }
    clock = obj.get("clock_mhz")
    request = PredictRequest(
        ptx=obj["ptx"],
        device=device,
        grid=_triple(obj["grid"], "grid"),
        block=_triple(obj["block"], "block"),
        kernel=kernel,
        registers_per_thread=optional_whole["registers_per_thread"],
        shared_bytes_per_block=optional_whole["shared_bytes_per_block"],
        loop_trip_counts=_whole_map(obj.get("loop_trip_counts", {}), "loop_trip_counts", str),
        memory_transactions=_whole_map(
            obj.get("memory_transactions", {}), "memory_transactions", int
        ),
        clock_mhz=validate.positive_time(clock, "clock_mhz") if clock is not None else None,
    )
    return ManyBspMeasurement(
        request, validate.positive_time(obj["measured_cycles"], "measured_cycles")
    )


def load_many_bsp_jsonl(source: Source, device: DeviceFigures) -> list[ManyBspMeasurement]:
    """Many-BSP measurements; ``device`` gives the figures each run's request is built with."""
    out = []
    for number, obj in _objects(source, MANY_BSP_MODEL):
        _check_keys(number, obj, MANY_BSP_REQUIRED, MANY_BSP_OPTIONAL)
        out.append(_on_line(number, functools.partial(_many_bsp_record, obj, device)))
    return out


def load_measurements_jsonl(
    source: Source, model: str, *, device: DeviceFigures | None = None
) -> list[GemmWsMeasurement] | list[ManyBspMeasurement]:
    """The measurements of ``model`` ("gemm-ws" or "many-bsp") in ``source`` (a path, or an
    iterable of lines); Many-BSP needs ``device``, the figures the runs are predicted with."""
    if model == MANY_BSP_MODEL:
        if device is None:
            raise CalibrationInputError(
                "device", "Many-BSP measurements need the device figures their runs use"
            )
        return load_many_bsp_jsonl(source, device)
    if model == GEMM_WS_MODEL:
        return load_gemm_ws_jsonl(source)
    raise CalibrationInputError("model", f"unknown model {model!r}; choose from: {MODELS}")
