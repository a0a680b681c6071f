"""Reading Kernel Tuner cache files, checked against Kernel Tuner's own reader, and the seeded
draw of configurations to calibrate on."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kperf_client.kt_cache import CacheFormatError, TunedConfig, read_cache
from kperf_client.kt_calibrate import choose

KEYS = ["block_size_x", "tile_size_x", "use_padding"]
FAILURES: list[Any] = ["InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig", 1e20]


def tuning_text(rng: random.Random, closed: bool) -> str:
    """A cache as Kernel Tuner writes it: header, one appended line per configuration, and
    ``}\\n}`` once closed; some configurations failed."""
    header = {"kernel_name": "k", "problem_size": [4096, "tile_size_x*2"],
              "tune_params_keys": KEYS, "objective": "time", "cache": {}}  # fmt: skip
    text = json.dumps(header, indent="")[:-3]
    for bx in (16, 32, 64, 128):
        for tile in (1, 2, 3):
            for pad in (0, 1):
                time: Any = rng.uniform(0.1, 9.0)
                if rng.random() < 0.25:
                    time = rng.choice(FAILURES)
                entry = {"block_size_x": bx, "tile_size_x": tile, "use_padding": pad,
                         "time": time, "times": [time] * 3}  # fmt: skip
                text += "\n" + json.dumps({f"{bx},{tile},{pad}": entry})[1:-1] + ","
    return text[:-1] + "}\n}" if closed else text


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "unclosed"])
def test_measured_configurations_are_those_kernel_tuner_reads(tmp_path: Path, closed: bool) -> None:
    kt_util = pytest.importorskip("kernel_tuner.util")
    path = tmp_path / "cache.json"
    path.write_text(tuning_text(random.Random(5), closed))
    expected = kt_util.read_cache(str(path), open_cache=False)["cache"]
    measured = {k: e for k, e in expected.items() if "__error__" not in e and e["time"] < 1e20}
    tuning = read_cache(path)
    assert [c.key for c in tuning.configs] == list(measured)
    assert tuning.failed == len(expected) - len(measured) > 0
    for config in tuning.configs:
        entry = measured[config.key]
        assert config.time_ms == entry["time"]
        assert list(config.params.items()) == [(k, entry[k]) for k in KEYS]
    assert tuning.problem_size == [4096, "tile_size_x*2"] and tuning.kernel_name == "k"
    gz = tmp_path / "cache.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert read_cache(gz) == tuning


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1, 2]", "no 'cache' object"),
        ('{"cache": {}}', "tune_params_keys"),
        ('{"tune_params_keys": ["a"], "cache": {"1": {"b": 1, "time": 1.0}}}', "lacks a"),
        ('{"tune_params_keys": ["a"], "cache": {"1": {"a": [1], "time": 1.0}}}', "not a number"),
        ("tuning", "not JSON"),
    ],
)
def test_what_is_not_a_cache_is_refused_with_the_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(CacheFormatError, match=reason):
        read_cache(path)


def test_the_draw_is_seeded_without_replacement_in_cache_order() -> None:
    configs = [TunedConfig(str(i), {"x": i}, 1.0 + i) for i in range(40)]
    first = choose(configs, 8, seed=1)
    assert first == choose(configs, 8, seed=1)
    assert len({c.key for c in first}) == 8
    assert [int(c.key) for c in first] == sorted(int(c.key) for c in first)
    draws = {tuple(c.key for c in choose(configs, 8, seed=s)) for s in range(20)}
    assert len(draws) > 15  # seeds draw different subsets
    assert choose(configs, None, 0) == configs == choose(configs, 40, 0) == choose(configs, 99, 0)
    with pytest.raises(ValueError, match="at least 1"):
        choose(configs, 0, 0)
