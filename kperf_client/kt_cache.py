"""Read a Kernel Tuner cache file: the measured configurations of one tuning.

Kernel Tuner (``kernel_tuner/util.py``: ``process_cache``, ``store_cache``, ``read_cache``)
writes a JSON object with ``kernel_name``, ``device_name``, ``problem_size``,
``tune_params_keys``, ``tune_params``, ``objective`` and ``cache``: one entry per
configuration, keyed by its values joined by ``,`` in ``tune_params_keys`` order, holding the
tunables and the measured ``time`` in ms (the mean of ``times``). A configuration that failed
holds an error name (``InvalidConfig``, ``CompilationFailedConfig``, ``RuntimeFailedConfig``)
in place of a number; old versions wrote ``1e20``. The file is appended to while a tuning
runs and closed at its end: an unclosed file (trailing ``,``, no closing braces) is read as
Kernel Tuner reads it. ``.gz`` files are read compressed.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kperf_client.kt_geometry import ParamValue

#: old Kernel Tuner versions recorded a failed configuration as this time
_FAILED_TIME = 1e20


class CacheFormatError(ValueError):
    """A file that is not a Kernel Tuner cache, or an entry that cannot be read."""


@dataclass(frozen=True)
class TunedConfig:
    """One measured configuration: its tunables (in the cache's order) and mean time."""

    key: str
    params: dict[str, ParamValue]
    time_ms: float


@dataclass(frozen=True)
class TunerCache:
    kernel_name: str | None
    device_name: str | None
    problem_size: list[int | str] | None
    tune_params_keys: list[str]
    #: the configurations with a measured time, in the file's order
    configs: list[TunedConfig]
    #: configurations that failed (invalid, not compiled, crashed): not measured
    failed: int


def _document(path: Path) -> Any:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8").strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # unclosed, as Kernel Tuner's correct_open_cache closes it: no trailing ",", "}\n}"
        return json.loads(text.removesuffix(",") + "}\n}")


def _param(value: Any, key: str, name: str) -> ParamValue:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise CacheFormatError(f"entry {key!r}: tunable {name!r} is {value!r}, not a number")
    return value


def _time(entry: dict[str, Any]) -> float | None:
    time = entry.get("time")
    if isinstance(time, bool) or not isinstance(time, int | float):
        return None
    if not math.isfinite(time) or time <= 0 or time >= _FAILED_TIME:
        return None
    return float(time)


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def read_cache(path: Path) -> TunerCache:
    """The measured configurations of a Kernel Tuner cache file."""
    try:
        document = _document(path)
    except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise CacheFormatError(f"{path}: not a Kernel Tuner cache (not JSON: {exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("cache"), dict):
        raise CacheFormatError(f"{path}: not a Kernel Tuner cache (no 'cache' object)")
    keys = document.get("tune_params_keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or not keys:
        raise CacheFormatError(f"{path}: 'tune_params_keys' must be a list of tunable names")
    configs: list[TunedConfig] = []
    failed = 0
    for key, entry in document["cache"].items():
        if not isinstance(entry, dict):
            raise CacheFormatError(f"{path}: entry {key!r} is not an object")
        missing = [name for name in keys if name not in entry]
        if missing:
            raise CacheFormatError(f"{path}: entry {key!r} lacks {', '.join(missing)}")
        time = _time(entry)
        if time is None:
            failed += 1
            continue
        params = {name: _param(entry[name], key, name) for name in keys}
        configs.append(TunedConfig(key=key, params=params, time_ms=time))
    problem = document.get("problem_size")
    if isinstance(problem, int | str):
        problem = [problem]
    if not (isinstance(problem, list) and all(isinstance(p, int | str) for p in problem)):
        problem = None
    return TunerCache(
        kernel_name=_name(document.get("kernel_name")),
        device_name=_name(document.get("device_name")),
        problem_size=problem,
        tune_params_keys=keys,
        configs=configs,
        failed=failed,
    )
