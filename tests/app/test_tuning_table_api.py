"""POST /tuning-table over HTTP: the file loads with the engines' lookup (reimplemented from
their documented form), every value is in the space asked for, the picture, and 4xx naming
the field."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

H100 = {"n": 1536, "k": 7168, "device": "h100"}
SPACE = {
    "tile_m": [16, 64, 128],
    "tile_n": [64, 128],
    "tile_k": [64, 128],
    "buffer_depth": [2, 3, 4],
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(workers=1, cache_path=None))) as test_client:
        yield test_client


def _engine_file_name(engine: str, n: int, k: int, cuda_name: str, block: list[int]) -> str:
    """How the engines' loaders name the file (vLLM fp8_utils / SGLang fp8_kernel
    get_w8a8_block_fp8_configs): the device name with blanks as underscores; SGLang writes
    a space after the block shape's comma."""
    device = cuda_name.replace(" ", "_")
    sep = "," if engine == "vllm" else ", "
    shape = f"[{block[0]}{sep}{block[1]}]"
    return f"N={n},K={k},device_name={device},dtype=fp8_w8a8,block_shape={shape}.json"


def _engine_lookup(directory: Path, file_name: str, m: int) -> dict[str, Any]:
    """The engines' reading code: json.load, int keys, the entry nearest to M (first wins)."""
    with open(directory / file_name, encoding="utf-8") as f:
        configs = {int(key): value for key, value in json.load(f).items()}
    return configs[min(configs.keys(), key=lambda x: abs(x - m))]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_file_loads_with_the_engines_lookup(
    client: TestClient, engine: str, tmp_path: Path
) -> None:
    keys = [1, 16, 64, 256, 1024, 4096]
    body = {
        **H100,
        "m_values": keys,
        "search_space": SPACE,
        "num_warps": [8, 4],
        "group_size_m": [16, 1],
        "format": engine,
    }
    answer = client.post("/tuning-table", json=body)
    assert answer.status_code == 200, answer.text
    table = answer.json()
    name = _engine_file_name(engine, 1536, 7168, "NVIDIA H100 80GB HBM3", [128, 128])
    assert table["file_name"] == name
    (tmp_path / table["file_name"]).write_text(json.dumps(table["file"]), encoding="utf-8")
    # Triton on sm_90 allocates num_stages buffers: the depths asked for are the stages
    allowed = {
        "BLOCK_SIZE_M": set(SPACE["tile_m"]),
        "BLOCK_SIZE_N": set(SPACE["tile_n"]),
        "BLOCK_SIZE_K": set(SPACE["tile_k"]),
        "GROUP_SIZE_M": {16},
        "num_warps": {8},
        "num_stages": set(SPACE["buffer_depth"]),
    }
    by_key = {e["m"]: e for e in table["entries"]}
    rng = random.Random(5)
    for m in keys + [rng.randint(1, 8192) for _ in range(40)] + [8, 40, 160, 640]:
        entry = _engine_lookup(tmp_path, name, m)
        assert set(entry) == set(allowed)
        for field, value in entry.items():
            assert type(value) is int and value in allowed[field], (field, value)
        nearest = min(keys, key=lambda x: abs(x - m))
        assert entry == by_key[nearest]["config"]
    assert [e["m"] for e in table["entries"]] == keys
    assert table["status"] == "optimal" and table["solver"]["keys_certified"] == len(keys)


def test_candidates_params_are_the_entries_and_echoed(client: TestClient) -> None:
    candidates = [
        {"tile_m": tm, "tile_n": 128, "tile_k": 128, "buffer_depth": 3, "params": params}
        for tm, params in itertools.product(
            (16, 64, 128),
            ({"num_warps": 4, "GROUP_SIZE_M": 8, "note": "a"}, {"num_warps": 8, "GROUP_SIZE_M": 1}),
        )
    ]
    body = {**H100, "m_values": [1, 128, 2048], "candidates": candidates}
    table = client.post("/tuning-table", json=body).json()
    for entry in table["entries"]:
        listed = candidates[entry["input_index"]]
        assert entry["params"] == listed["params"]
        # the model cannot tell the two params apart: the first listed of the tiling is written
        assert entry["input_index"] % 2 == 0
        assert entry["config"]["num_warps"] == 4 and entry["config"]["GROUP_SIZE_M"] == 8
        assert entry["config"]["BLOCK_SIZE_M"] == listed["tile_m"]


def test_max_distinct_configs_bounds_the_table(client: TestClient) -> None:
    body = {**H100, "search_space": SPACE, "max_distinct_configs": 2}
    table = client.post("/tuning-table", json=body).json()
    distinct = {json.dumps(v, sort_keys=True) for v in table["file"].values()}
    assert len(distinct) <= 2 == table["selection"]["max_distinct_configs"]
    assert table["selection"]["exact"] is True
    worst = max(e["loss"] for e in table["entries"])
    assert worst == pytest.approx(table["selection"]["worst_key_loss"])
    # the range bound covers the keys themselves
    assert table["loss_over_range"]["worst_loss"] >= worst - 1e-12


def test_the_picture(client: TestClient) -> None:
    answer = client.post(
        "/tuning-table",
        json={**H100, "search_space": SPACE, "m_values": [1, 64, 512]},
        headers={"accept": "image/svg+xml"},
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("image/svg+xml")
    svg = answer.text
    for gid in ("entry", "optimum", "loss-band", "key-1", "key-64", "key-512", "summary"):
        assert f'id="{gid}"' in svg


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"m_values": []}, "m_values"),
        ({"m_values": list(range(1, 66))}, "m_values"),
        ({"m_values": [4, 8, 4]}, "m_values"),
        ({"max_distinct_configs": 0}, "max_distinct_configs"),
        (
            {"candidates": [{"tile_m": 256, "tile_n": 256, "tile_k": 128, "buffer_depth": 8}]},
            "candidates",
        ),
        (
            {"candidates": [{"tile_m": 64, "tile_n": 64, "tile_k": 96, "buffer_depth": 2}]},
            "candidates.0.tile_k",
        ),
        ({"dtype": "fp16"}, "format"),
        ({"device": "no-such-gpu", "format": "json"}, "device"),
        (
            {
                "device": None,
                "device_params": {
                    "sm_count": 4,
                    "t_init_us": 1,
                    "t_epilogue_us": 1,
                    "load_startup_latency_us": 1,
                    "load_throughput_elements_per_us": 1000,
                    "compute_throughput_macs_per_us": 10000,
                },
            },
            "device_name",
        ),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(
    client: TestClient, extra: dict[str, Any], field: str
) -> None:
    answer = client.post(
        "/tuning-table",
        json={**H100, "search_space": SPACE, **extra}
        if "candidates" not in extra
        else {**H100, **extra},
    )
    assert 400 <= answer.status_code < 500, answer.text[:300]
    fields = [e["field"] for e in answer.json()["errors"]]
    assert any(re.sub(r"^body\.", "", f) == field for f in fields), fields
