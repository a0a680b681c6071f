"""POST /optimize-tiling with the L2-reuse memory term: split_k and group_m searched and
reported with DRAM bytes and the L2 hit rate; the default wherever a profile has a memory
section, with the paper's DRAM-stream loads kept for explicit requests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from device_profiles import get_profile
from device_profiles.memory import memory_model_device
from device_profiles.pipeline import sm_limits
from perfmodel.gemm_ws_memory_model import Recurrences, ShapeModel, Space

SPACE = {"tile_m": [64, 128], "tile_n": [64, 128], "tile_k": [32, 64], "buffer_depth": [2, 4]}
NEW_FIELDS = {"group_m", "split_k", "dram_bytes", "l2_hit_rate"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, cache_path=None, cache_memory_items=0)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _post(client: TestClient, **body: Any) -> Any:
    base = {"m": 1024, "n": 1024, "k": 8192, "device": "h100", "dtype": "fp16"}
    return client.post("/optimize-tiling", json={**base, **body})


def _without_elapsed(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "solver": {**body["solver"], "elapsed_ms": None}}


def test_the_default_is_the_l2_reuse_term_with_raster_searched(client: TestClient) -> None:
    """No memory_model and no group_m/split_k: the answer is the explicit l2-reuse answer
    over group_m {1, 8} and split_k {1, 2, 4, 8, 16} (all fill 8192 / 32 k tiles), and says
    so; dram-stream asked for explicitly keeps the paper's loads and reports no raster."""
    default = _post(client, search_space=SPACE)
    raster = {**SPACE, "group_m": [1, 8], "split_k": [1, 2, 4, 8, 16]}
    explicit = _post(client, search_space=raster, memory_model="l2-reuse")
    paper = _post(client, search_space=SPACE, memory_model="dram-stream")
    assert default.status_code == explicit.status_code == paper.status_code == 200, default.text
    assert _without_elapsed(default.json()) == _without_elapsed(explicit.json())
    assert default.json()["memory_model"] == "l2-reuse"
    assert default.json()["search"]["candidates_considered"] == 16 * 2 * 5
    assert paper.json()["memory_model"] == "dram-stream"
    assert paper.json()["search"]["candidates_considered"] == 16
    for candidate in paper.json()["candidates"]:
        assert not NEW_FIELDS & candidate.keys()
    for candidate in default.json()["candidates"]:
        assert NEW_FIELDS <= candidate.keys()


def test_split_k_searched_by_default_only_where_a_slice_holds_a_stage(
    client: TestClient,
) -> None:
    """K = 96 with tile_k 32 has three k tiles: the default split_k is {1, 2}, so no slice is
    empty and the answer is the explicit one over that set."""
    space = {"tile_m": [64], "tile_n": [64], "tile_k": [32], "buffer_depth": [2]}
    problem = {"m": 512, "n": 512, "k": 96, "device": "h100", "dtype": "fp16"}
    r = client.post("/optimize-tiling", json={**problem, "search_space": space})
    raster = {**space, "group_m": [1, 8], "split_k": [1, 2]}
    explicit = client.post(
        "/optimize-tiling",
        json={**problem, "memory_model": "l2-reuse", "search_space": raster},
    )
    assert r.status_code == explicit.status_code == 200, r.text
    assert _without_elapsed(r.json()) == _without_elapsed(explicit.json())
    assert {c["split_k"] for c in r.json()["candidates"]} <= {1, 2}


def test_split_k_and_group_m_are_searched_and_reported(client: TestClient) -> None:
    wide = {**SPACE, "split_k": [1, 2, 4, 8], "group_m": [1, 8]}
    searched = _post(client, search_space=wide, memory_model="l2-reuse", shortlist="exploit")
    unrastered = {**SPACE, "split_k": [1], "group_m": [1]}
    plain = _post(client, search_space=unrastered, memory_model="l2-reuse", shortlist="exploit")
    assert searched.status_code == plain.status_code == 200, searched.text
    body, base = searched.json(), plain.json()
    assert body["status"] == "optimal"
    assert all(c["outcome"] == "unsat" for c in body["solver"]["certificate"])
    # a superset of configurations is never slower at its optimum
    assert body["best"]["predicted_time_us"] <= base["best"]["predicted_time_us"]
    for candidate in body["candidates"]:
        assert NEW_FIELDS <= candidate.keys()
        assert candidate["split_k"] in (1, 2, 4, 8) and candidate["group_m"] in (1, 8)
        assert 0.0 <= candidate["l2_hit_rate"] <= 1.0
        # DRAM bytes at least the compulsory A and B reads (fp16)
        assert candidate["dram_bytes"] >= 2 * (1024 * 8192 + 8192 * 1024) * 0.999
    assert body["search"]["candidates_considered"] == 16 * 4 * 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"search_space": {**SPACE, "split_k": [1, 300]}, "memory_model": "l2-reuse"},
            "search_space.split_k",
        ),
        (
            {"search_space": {**SPACE, "split_k": [1, 2]}, "memory_model": "dram-stream"},
            "search_space.split_k",
        ),
        (
            {"search_space": {**SPACE, "group_m": [8]}, "memory_model": "dram-stream"},
            "search_space.group_m",
        ),
        ({"memory_model": "l2-reuse", "solver": "z3-search"}, "solver"),
        ({"memory_model": "l2-cache"}, "memory_model"),
    ],
    ids=["split-k-beyond-k-tiles", "split-k-without-term", "group-m-without-term", "z3", "bad"],
)
def test_bad_memory_model_input_names_the_field(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    r = _post(client, **body)
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]], r.json()


def test_inline_device_params_have_no_memory_section(client: TestClient) -> None:
    params = {
        "sm_count": 84,
        "t_init_us": 1.68,
        "t_epilogue_us": 1.543,
        "load_startup_latency_us": 0.77,
        "compute_startup_latency_us": 0.0,
        "load_throughput_elements_per_us": 152.96,
        "compute_throughput_macs_per_us": 24610.0,
    }
    r = client.post(
        "/optimize-tiling",
        json={"m": 512, "n": 512, "k": 512, "device_params": params, "memory_model": "l2-reuse"},
    )
    assert r.status_code == 422, r.text
    assert "memory_model" in [e["field"] for e in r.json()["errors"]]


@pytest.mark.parametrize(
    ("shape", "config"),
    [
        ((4096, 4096, 4096), (128, 128, 32, 4, 8, 1)),
        ((1024, 1024, 8192), (128, 64, 32, 3, 1, 4)),
        ((8192, 256, 8192), (64, 256, 16, 6, 8, 2)),
        ((1000, 333, 4099), (64, 64, 64, 2, 1, 1)),
        ((128, 50000, 512), (64, 128, 32, 5, 8, 1)),
    ],
)
@pytest.mark.parametrize("pipeline", ["async-copy", "paper"])
def test_the_service_predicts_what_the_bench_predicts(
    client: TestClient,
    shape: tuple[int, int, int],
    config: tuple[int, int, int, int, int, int],
    pipeline: Recurrences,
) -> None:
    """One model in one place: the service's time of a configuration under l2-reuse is the
    prediction bench/bench_real.py compares with real GPUs (the memory model on the profile's
    figures, h100 tf32 as its XLA dataset), up to the service's rounding to ns."""
    m, n, k = shape
    tm, tn, tk, depth, group_m, split_k = config
    space = {
        "tile_m": [tm],
        "tile_n": [tn],
        "tile_k": [tk],
        "buffer_depth": [depth],
        "group_m": [group_m],
        "split_k": [split_k],
    }
    r = client.post(
        "/optimize-tiling",
        json={
            "m": m,
            "n": n,
            "k": k,
            "device": "h100",
            "dtype": "tf32",
            "pipeline_model": pipeline,
            "memory_model": "l2-reuse",
            "search_space": space,
        },
    )
    assert r.status_code == 200, r.text
    device = memory_model_device(get_profile("h100"), "tf32", pipeline)
    one = Space(
        *(np.array([v], dtype=np.int64) for v in config[:4]),
        *(np.array([v], dtype=np.int64) for v in (group_m, split_k)),
    )
    bench = ShapeModel(m, n, k, 4, one, device.sm_count, device.limits, pipeline)
    expected_us = float(bench.times_us(device.base)[0][0])
    assert r.json()["best"]["predicted_time_us"] == pytest.approx(expected_us, abs=1.5e-3)


def test_a_candidate_list_is_ranked_and_certified_under_the_memory_term(
    client: TestClient,
) -> None:
    """A candidate list (default shortlist, explore) under l2-reuse: certified, rank 1 the
    proven optimum, explored under the priors' draws of the same model's figures (each
    interval holds its point, probabilities sum to at most 1); the larger tile whose
    accumulators do not fit an SM is left out."""
    candidates = [
        {"tile_m": 128, "tile_n": 128, "tile_k": 32, "buffer_depth": 3},
        {"tile_m": 64, "tile_n": 128, "tile_k": 64, "buffer_depth": 2},
        {"tile_m": 256, "tile_n": 256, "tile_k": 32, "buffer_depth": 2},
    ]
    r = _post(client, memory_model="l2-reuse", candidates=candidates)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "optimal"
    assert all(c["outcome"] == "unsat" for c in body["solver"]["certificate"])
    assert body["shortlist"]["belief"] == "priors"
    assert body["candidates"]
    assert 2 not in [c["input_index"] for c in body["candidates"]]
    first = body["candidates"][0]
    assert first["predicted_time_us"] == body["best"]["predicted_time_us"]
    assert sum(c["probability_best"] for c in body["candidates"]) <= 1.0 + 1e-9
    for c in body["candidates"]:
        assert c["interval_low_us"] <= c["predicted_time_us"] <= c["interval_high_us"]


@pytest.mark.parametrize("pipeline", ["async-copy", "paper"])
def test_without_shared_memory_enforcement_every_model_drops_the_sm_limit(
    client: TestClient, pipeline: Recurrences
) -> None:
    """enforce_shared_memory false reaches the memory term whichever pipeline model answers:
    a buffer larger than one SM's shared memory (8 x 256 x 128 fp16 = 512 KiB > 228 KiB on
    the h100) is predicted as the bench's memory model predicts it without that limit."""
    space = {
        "tile_m": [128],
        "tile_n": [128],
        "tile_k": [128],
        "buffer_depth": [8],
        "group_m": [1],
        "split_k": [1],
        "enforce_shared_memory": False,
    }
    r = _post(client, search_space=space, memory_model="l2-reuse", pipeline_model=pipeline)
    assert r.status_code == 200, r.text
    profile = get_profile("h100")
    limits = sm_limits(profile, enforce_shared_memory=False)
    device = memory_model_device(profile, "fp16", pipeline, limits=limits)
    one = Space(*(np.array([v], dtype=np.int64) for v in (128, 128, 128, 8, 1, 1)))
    bench = ShapeModel(1024, 1024, 8192, 2, one, device.sm_count, device.limits, pipeline)
    assert bench.resident[0] >= 1
    expected_us = float(bench.times_us(device.base)[0][0])
    assert r.json()["best"]["predicted_time_us"] == pytest.approx(expected_us, abs=1.5e-3)


def test_a_cta_that_fits_no_sm_is_refused_under_every_pipeline_model(
    client: TestClient,
) -> None:
    """The request's CTA size reaches the memory term under the paper model as under
    async-copy: 1024 threads x 255 registers exceed the h100's 65,536 registers per SM, so no
    configuration is resident and both models refuse the request alike."""
    cta = {"threads_per_cta": 1024, "registers_per_thread": 255}
    answers = {
        pipeline: _post(
            client, search_space=SPACE, memory_model="l2-reuse", pipeline_model=pipeline, **cta
        )
        for pipeline in ("async-copy", "paper")
    }
    statuses = {pipeline: r.status_code for pipeline, r in answers.items()}
    assert statuses == {"async-copy": 422, "paper": 422}, answers["paper"].text
    errors = [r.json()["errors"] for r in answers.values()]
    assert errors[0] == errors[1]
    assert [e["field"] for e in errors[0]] == ["registers_per_thread"]
    # a CTA that fits keeps the paper model's answer (its stages never share an SM)
    fits = _post(
        client,
        search_space=SPACE,
        memory_model="l2-reuse",
        pipeline_model="paper",
        threads_per_cta=256,
        registers_per_thread=128,
    )
    plain = _post(client, search_space=SPACE, memory_model="l2-reuse", pipeline_model="paper")
    assert fits.status_code == plain.status_code == 200, fits.text
    assert fits.json()["best"] == plain.json()["best"]


def test_the_default_split_k_is_capped_by_the_smallest_tile_k_in_any_order(
    client: TestClient,
) -> None:
    """tile_k listed largest first: the cap is still ceil(k / smallest tile_k) = 256 / 32 = 8
    k tiles (split_k {1, 2, 4, 8}), not the first listed tile_k's 4."""
    space = {"tile_m": [64], "tile_n": [64], "tile_k": [64, 32], "buffer_depth": [2]}
    problem = {"m": 512, "n": 512, "k": 256, "device": "h100", "dtype": "fp16"}
    listed = client.post("/optimize-tiling", json={**problem, "search_space": space})
    ordered = {**space, "tile_k": [32, 64]}
    sorted_ = client.post("/optimize-tiling", json={**problem, "search_space": ordered})
    assert listed.status_code == sorted_.status_code == 200, listed.text
    assert listed.json()["search"] == sorted_.json()["search"]
    # 2 tile_k x 2 group_m x 4 split_k, those tile_k 64 cannot fill counted as rejected
    assert listed.json()["search"]["candidates_considered"] == 2 * 2 * 4
    assert listed.json()["best"] == sorted_.json()["best"]
