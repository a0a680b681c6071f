"""POST /optimize-tiling under both GeMM-WS pipeline models over HTTP: the request field and each
profile's default, the answer's per-candidate fields against the stage-by-stage simulators,
async-copy spaces and candidate lists against a brute force, explore shortlists, the cache key,
batches, residency limits and their 4xx, and the picture's refusal for async answers."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from perfmodel.gemm_ws import GemmShape, SmLimits, Tiling, simulate
from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation, simulate_async
from tests.gemm_ws_cases import A6000, brute_force_order

#: the paper's A6000 figures (§4.2) inline, with the CC 8.6 residency limits typed in from the
#: CUDA C++ Programming Guide's table (16 CTAs, 100 KiB of shared memory per SM, 1536 threads,
#: 64 K registers)
A6000_LIMITS = {
    "max_blocks_per_sm": 16,
    "shared_memory_per_sm_bytes": 102400,
    "max_threads_per_sm": 1536,
    "registers_per_sm": 65536,
}
A6000_PARAMS = {**dataclasses.asdict(A6000), **A6000_LIMITS}


def _candidate_fields(tiling: Tiling) -> dict[str, int]:
    """A candidate names its tile and depth (group_m and split_k are search-space dimensions)."""
    return {k: getattr(tiling, k) for k in ("tile_m", "tile_n", "tile_k", "buffer_depth")}


SPACE = {
    "tile_m": [32, 64, 128],
    "tile_n": [64, 128],
    "tile_k": [16, 32, 64],
    "buffer_depth": {"min": 1, "max": 6},
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, cache_path=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _post(client: TestClient, **body: Any) -> Any:
    return client.post("/optimize-tiling", json=body)


def _ok(client: TestClient, **body: Any) -> dict[str, Any]:
    r = _post(client, **body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _limits(threads: int | None = None, registers: int | None = None) -> SmLimits:
    return SmLimits(
        A6000_LIMITS["max_blocks_per_sm"],
        A6000_LIMITS["shared_memory_per_sm_bytes"],
        A6000_LIMITS["registers_per_sm"],
        A6000_LIMITS["max_threads_per_sm"],
        threads,
        registers,
    )


def _brute_force_async(shape: GemmShape, limits: SmLimits, tilings: Any) -> list[AsyncSimulation]:
    sims = []
    for t in tilings:
        smem = t.shared_memory_bytes(2)
        if smem > A6000.shared_memory_per_block_bytes or limits.ctas_per_sm(smem) < 1:
            continue
        sims.append(simulate_async(shape, t, A6000, limits, 2))
    return sorted(sims, key=brute_force_order)


def _space_tilings() -> list[Tiling]:
    return [
        Tiling(*v)
        for v in itertools.product(SPACE["tile_m"], SPACE["tile_n"], SPACE["tile_k"], range(1, 7))
    ]


def _tiling(c: dict[str, Any]) -> Tiling:
    return Tiling(c["tile_m"], c["tile_n"], c["tile_k"], c["buffer_depth"])


def _without_elapsed(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "solver": {**body["solver"], "elapsed_ms": None}}


def test_default_model_per_device_and_explicit_default_answers_the_same(
    client: TestClient,
) -> None:
    problem = {"m": 1024, "n": 1024, "k": 1024, "shortlist": "exploit"}
    paper = _ok(client, **problem, device="rtx-a6000")
    assert paper["pipeline_model"] == "paper"  # published figures: the paper's model
    named = _ok(client, **problem, device="rtx-a6000", pipeline_model="paper")
    assert _without_elapsed(named) == _without_elapsed(paper)
    # estimated GeMM-WS figures on a compute capability >= 8.0 device default to async-copy
    assert _ok(client, **problem, device="h100")["pipeline_model"] == "async-copy"
    forced = _ok(client, **problem, device="h100", pipeline_model="paper")
    assert forced["pipeline_model"] == "paper"
    # inline figures default to the paper model
    assert _ok(client, **problem, device_params=A6000_PARAMS)["pipeline_model"] == "paper"


@pytest.mark.parametrize("solver", ["certified", "z3-search"])
@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (4096, 512, 2048), (160, 96, 8192)])
def test_async_space_equals_brute_force(
    client: TestClient, shape: tuple[int, int, int], solver: str
) -> None:
    body = _ok(
        client,
        m=shape[0],
        n=shape[1],
        k=shape[2],
        device_params=A6000_PARAMS,
        pipeline_model="async-copy",
        search_space=SPACE,
        shortlist="exploit",
        solver=solver,
        top_k=5,
    )
    expected = _brute_force_async(GemmShape(*shape), _limits(), _space_tilings())[:5]
    assert body["status"] == "optimal" and body["pipeline_model"] == "async-copy"
    assert body["solver"]["mode"] == solver
    if solver == "certified":
        assert [c["outcome"] for c in body["solver"]["certificate"]] == ["unsat"]
    assert [_tiling(c) for c in body["candidates"]] == [s.tiling for s in expected]
    for got, sim in zip(body["candidates"], expected, strict=True):
        assert got["predicted_time_us"] == pytest.approx(sim.overall_time_ns / 1000)
        assert got["math_wait_us"] == pytest.approx(sim.total_math_wait_ns / 1000)
        assert got["ctas_per_sm"] == sim.ctas_per_sm
        assert got["stages_in_flight"] == sim.stages_in_flight
        assert got["bound"] == sim.bound.value
        assert got["waves"] == sim.waves
        assert got["load_latency_us"] == pytest.approx(A6000.load_startup_latency_us)
        assert got["t_load_a_us"] + got["t_load_b_us"] == pytest.approx(
            sim.durations.issue_ns / 1000
        )
        assert got["t_math_us"] == pytest.approx(sim.durations.math_ns / 1000)
    rejected = body["search"]["rejected"]
    assert body["search"]["feasible"] == len(
        _brute_force_async(GemmShape(*shape), _limits(), _space_tilings())
    )
    assert sum(rejected.values()) + body["search"]["feasible"] == len(_space_tilings())


def test_paper_candidates_report_one_cta_and_their_slots(client: TestClient) -> None:
    body = _ok(
        client,
        m=2048,
        n=2048,
        k=2048,
        device="rtx-a6000",
        memory_model="dram-stream",
        shortlist="exploit",
        top_k=8,
    )
    for c in body["candidates"]:
        sim = simulate(GemmShape(2048, 2048, 2048), _tiling(c), A6000)
        math_bound = not sim.load_bound
        assert c["bound"] == ("math" if math_bound else "load")
        assert c["ctas_per_sm"] == 1 and c["load_latency_us"] is None
        depth = c["buffer_depth"]
        assert c["stages_in_flight"] == (depth if math_bound else min(depth, 2))


def test_registers_without_threads_are_ignored(client: TestClient) -> None:
    body = {"m": 512, "n": 512, "k": 512, "device": "h100", "search_space": SPACE}
    plain = _ok(client, **body, shortlist="exploit")
    ignored = _ok(client, **body, shortlist="exploit", registers_per_thread=255)
    assert ignored["candidates"] == plain["candidates"]


def test_threads_and_registers_limit_ctas_per_sm(client: TestClient) -> None:
    common = {
        "m": 2048,
        "n": 2048,
        "k": 2048,
        "device_params": A6000_PARAMS,
        "pipeline_model": "async-copy",
        "search_space": {**SPACE, "tile_m": [32], "tile_n": [64], "tile_k": [16]},
        "shortlist": "exploit",
    }
    free = _ok(client, **common)
    # 512 threads x 64 registers = 32 K registers: 2 CTAs of the SM's 64 K registers
    tight = _ok(client, **common, threads_per_cta=512, registers_per_thread=64)
    assert free["best"]["ctas_per_sm"] > 2
    assert tight["best"]["ctas_per_sm"] <= 2
    sim = simulate_async(
        GemmShape(2048, 2048, 2048), _tiling(tight["best"]), A6000, _limits(512, 64), 2
    )
    assert tight["best"]["predicted_time_us"] == pytest.approx(sim.overall_time_ns / 1000)
    assert tight["best"]["ctas_per_sm"] == sim.ctas_per_sm


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"threads_per_cta": 0}, "threads_per_cta"),
        ({"threads_per_cta": 2048}, "threads_per_cta"),
        ({"threads_per_cta": 256, "registers_per_thread": 256}, "registers_per_thread"),
        # 1024 threads x 255 registers exceed the SM's 64 K registers: no CTA fits
        ({"threads_per_cta": 1024, "registers_per_thread": 255}, "registers_per_thread"),
        ({"pipeline_model": "async"}, "pipeline_model"),
    ],
)
def test_bad_residency_fields_are_422_naming_them(
    client: TestClient, extra: dict[str, Any], field: str
) -> None:
    body = {"m": 512, "n": 512, "k": 512, "device": "h100", **extra}
    r = _post(client, **body)
    assert r.status_code == 422, r.text
    fields = [e["field"] for e in r.json()["errors"]]
    assert any(f == field or f.endswith("." + field) for f in fields), fields


def test_async_candidate_list_equals_brute_force_and_names_rejections(client: TestClient) -> None:
    # the SM holds less shared memory than a CTA may ask for: the per-SM limit rejects
    params = {**A6000_PARAMS, "shared_memory_per_sm_bytes": 40960}
    limits = dataclasses.replace(_limits(), shared_memory_per_sm_bytes=40960)
    tilings = [
        Tiling(128, 128, 32, 4),  # 64 KiB: over the SM's 40 KiB
        Tiling(64, 64, 32, 2),
        Tiling(64, 64, 32, 2),  # a repeat: same group
        Tiling(64, 128, 16, 3),
        Tiling(32, 64, 32, 3),
        Tiling(256, 256, 64, 4),  # 256 KiB: over the CTA's 99 KiB
    ]
    candidates = [{**_candidate_fields(t), "params": {"i": i}} for i, t in enumerate(tilings)]
    for solver in ("certified", "z3-search"):
        body = _ok(
            client,
            m=3000,
            n=2000,
            k=4096,
            device_params=params,
            pipeline_model="async-copy",
            candidates=candidates,
            shortlist="exploit",
            solver=solver,
        )
        expected = _brute_force_async(GemmShape(3000, 2000, 4096), limits, set(tilings))
        assert body["status"] == "optimal"
        ranked = list(dict.fromkeys(_tiling(c) for c in body["candidates"]))
        assert ranked == [s.tiling for s in expected]
        assert {c["input_index"] for c in body["candidates"]} == {1, 2, 3, 4}
        assert [(r["input_index"], r["constraint"]) for r in body["infeasible"]] == [
            (0, "shared_memory_per_sm"),
            (5, "shared_memory_per_block"),
        ]
        assert body["search"]["rejected"] == {
            "shared_memory_per_block": 1,
            "shared_memory_per_sm": 1,
        }


@pytest.mark.parametrize("listed", [False, True])
def test_async_explore_shortlist(client: TestClient, listed: bool) -> None:
    problem: dict[str, Any] = {"m": 4096, "n": 4096, "k": 4096, "device": "h100", "top_k": 4}
    if listed:
        problem["candidates"] = [
            _candidate_fields(t) for t in _space_tilings() if t.buffer_depth > 1
        ][:60]
    else:
        problem["search_space"] = SPACE
    explore = _ok(client, **problem)
    exploit = _ok(client, **problem, shortlist="exploit")
    assert explore["pipeline_model"] == exploit["pipeline_model"] == "async-copy"
    assert explore["shortlist"]["belief"] == "priors" and explore["shortlist"]["draws"] == 128
    # rank 1 is the proven optimum in both modes
    assert _tiling(explore["best"]) == _tiling(exploit["best"])
    assert explore["status"] == "optimal"
    shares = [c["probability_best"] for c in explore["candidates"]]
    assert all(0 <= p <= 1 for p in shares) and sum(shares) <= 1 + 1e-9
    for c in explore["candidates"]:
        assert c["interval_low_us"] <= c["interval_high_us"]
        assert c["bound"] in ("latency", "load", "math") and c["ctas_per_sm"] >= 1


def test_cache_key_holds_the_effective_model(client: TestClient) -> None:
    problem = {"m": 1536, "n": 1536, "k": 768, "device": "a100", "search_space": SPACE}
    first = _post(client, **problem)
    assert first.headers["x-cache"] == "miss"
    # null is a100's default, async-copy: the same answer, from the cache
    named = _post(client, **problem, pipeline_model="async-copy")
    assert named.headers["x-cache"] == "hit" and named.json() == first.json()
    other = _post(client, **problem, pipeline_model="paper")
    assert other.headers["x-cache"] == "miss" and other.json()["pipeline_model"] == "paper"
    threads = _post(client, **problem, threads_per_cta=256)
    assert threads.headers["x-cache"] == "miss"


def test_batch_mixes_models(client: TestClient) -> None:
    problems = [
        {"m": 1000, "n": 1000, "k": 1000, "device": "rtx-a6000", "search_space": SPACE},
        {"m": 1000, "n": 1000, "k": 1000, "device": "h100", "search_space": SPACE},
        {
            "m": 1000,
            "n": 1000,
            "k": 1000,
            "device_params": A6000_PARAMS,
            "pipeline_model": "async-copy",
            "search_space": SPACE,
            "shortlist": "exploit",
        },
    ]
    r = client.post("/optimize-tiling/batch", json={"problems": problems})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [i["result"]["pipeline_model"] for i in items] == ["paper", "async-copy", "async-copy"]
    expected = _brute_force_async(GemmShape(1000, 1000, 1000), _limits(), _space_tilings())
    assert _tiling(items[2]["result"]["best"]) == expected[0].tiling


def test_async_timeline_lists_issue_arrival_and_math(client: TestClient) -> None:
    body = _ok(
        client,
        m=512,
        n=512,
        k=1024,
        device_params=A6000_PARAMS,
        pipeline_model="async-copy",
        search_space={"tile_m": [64], "tile_n": [64], "tile_k": [32], "buffer_depth": [3]},
        include_timeline=True,
    )
    sim = simulate_async(GemmShape(512, 512, 1024), Tiling(64, 64, 32, 3), A6000, _limits(), 2)
    timeline = body["timeline"]
    assert len(timeline) == sim.stages == 32
    for stage, event in zip(timeline, sim.events, strict=True):
        assert stage["load_a_start_us"] == pytest.approx(event.issue_start_ns / 1000)
        assert stage["arrival_us"] == pytest.approx(event.arrival_ns / 1000)
        assert stage["math_start_us"] == pytest.approx(event.math_start_ns / 1000)


def test_picture_of_an_async_answer_draws_its_ranked_candidate_under_async_copy(
    client: TestClient,
) -> None:
    body = {
        "m": 512,
        "n": 512,
        "k": 512,
        "device": "h100",
        "memory_model": "dram-stream",
        "shortlist": "exploit",
    }
    answer = _ok(client, **body)
    assert answer["pipeline_model"] == "async-copy"
    svg = {"accept": "image/svg+xml"}
    for rank in (1, 2):
        r = client.post(f"/optimize-tiling?candidate_rank={rank}", json=body, headers=svg)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("image/svg+xml")
        text = r.text
        c = answer["candidates"][rank - 1]
        tiling = f"{c['tile_m']}×{c['tile_n']}×{c['tile_k']}, buffer depth {c['buffer_depth']}"
        assert "async-copy timeline" in text and tiling in text and f"rank {rank}" in text
    paper = client.post("/optimize-tiling", json={**body, "pipeline_model": "paper"}, headers=svg)
    assert paper.status_code == 200 and paper.headers["content-type"].startswith("image/svg+xml")
    assert "async-copy timeline" not in paper.text
