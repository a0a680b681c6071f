"""POST /optimize-tiling with an explicit candidate list (an autotuner's), over HTTP: ranking
against the stage-by-stage simulator, rejections against the search-space path, params echoed
byte for byte, groups, the batch endpoint, the cache key, and 4xx naming the field."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.schemas.optimize import MAX_CANDIDATE_PARAMS_BYTES, MAX_CANDIDATES
from app.settings import Settings
from perfmodel.gemm_ws import GemmShape, Tiling, simulate
from solver.search_space import shared_memory_fits
from tests.gemm_ws_cases import A6000, brute_force_order

#: the paper's A6000 figures (§4.2) as inline device_params
A6000_PARAMS = dataclasses.asdict(A6000)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, cache_path=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


CANDIDATE_FIELDS = ("tile_m", "tile_n", "tile_k", "buffer_depth")


def _candidate(tiling: Tiling, params: dict[str, Any] | None = None) -> dict[str, Any]:
    # a candidate names its tile and depth (group_m and split_k are search-space dimensions)
    out: dict[str, Any] = {k: getattr(tiling, k) for k in CANDIDATE_FIELDS}
    if params is not None:
        out["params"] = params
    return out


def _body(tilings: list[Tiling], **extra: Any) -> dict[str, Any]:
    return {
        "m": 1024,
        "n": 1024,
        "k": 1024,
        "device_params": A6000_PARAMS,
        "candidates": [_candidate(t, {"i": i}) for i, t in enumerate(tilings)],
        **extra,
    }


def _random_tilings(rng: random.Random, count: int) -> list[Tiling]:
    tiles = (16, 32, 64, 128, 256)
    return [
        Tiling(rng.choice(tiles), rng.choice(tiles), rng.choice(tiles), rng.randint(1, 8))
        for _ in range(count)
    ]


@pytest.mark.parametrize("seed", range(4))
def test_ranking_equals_brute_force_with_the_simulator(client: TestClient, seed: int) -> None:
    rng = random.Random(seed)
    tilings = _random_tilings(rng, 30)
    m, n, k = rng.randint(64, 4096), rng.randint(64, 4096), rng.randint(64, 4096)
    body = _body(tilings, m=m, n=n, k=k, shortlist="exploit")
    answer = client.post("/optimize-tiling", json=body).json()
    shape = GemmShape(m, n, k)
    feasible = {t for t in tilings if shared_memory_fits(t, 2, A6000.shared_memory_per_block_bytes)}
    expected = sorted((simulate(shape, t, A6000) for t in feasible), key=brute_force_order)
    assert answer["status"] == "optimal"
    # one entry per requested feasible candidate, groups in rank order, request order inside
    want = [
        (rank, i, s.overall_time_ns / 1000)
        for rank, s in enumerate(expected, start=1)
        for i, t in enumerate(tilings)
        if t == s.tiling
    ]
    got = [(c["rank"], c["input_index"], c["predicted_time_us"]) for c in answer["candidates"]]
    assert got == want
    assert answer["best"]["input_index"] == want[0][1]
    assert all(c["params"] == {"i": c["input_index"]} for c in answer["candidates"])


def test_infeasible_ones_are_listed_with_the_space_paths_constraint(client: TestClient) -> None:
    tilings = _random_tilings(random.Random(7), 40)
    answer = client.post("/optimize-tiling", json=_body(tilings)).json()
    limit = A6000.shared_memory_per_block_bytes
    rejected = [i for i, t in enumerate(tilings) if not shared_memory_fits(t, 2, limit)]
    assert rejected, "the case must reject some"
    assert [e["input_index"] for e in answer["infeasible"]] == rejected
    for entry in answer["infeasible"]:
        index = entry["input_index"]
        t = tilings[index]
        assert entry["constraint"] in answer["search"]["rejected"]
        assert entry["params"] == {"i": index}
        assert (entry["tile_m"], entry["tile_n"], entry["tile_k"], entry["buffer_depth"]) == (
            t.tile_m,
            t.tile_n,
            t.tile_k,
            t.buffer_depth,
        )
        assert str(t.shared_memory_bytes(2)) in entry["reason"]
        # the search-space path rejects the same configuration under the same name
        space = {k: [v] for k, v in dataclasses.asdict(t).items()}
        refused = client.post(
            "/optimize-tiling",
            json={"m": 1024, "n": 1024, "k": 1024, "device_params": A6000_PARAMS}
            | {"search_space": space},
        )
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["rejected"] == {entry["constraint"]: 1}
    assert answer["search"]["rejected"] == {"shared_memory_per_block": len(rejected)}
    assert answer["search"]["candidates_considered"] == len(tilings)


def test_params_are_echoed_byte_for_byte(client: TestClient) -> None:
    params = (
        '{"num_warps":8,"GROUP_SIZE_M":8,"cfg":{"list":[1,2.5,-0.125,null,true,"\u00e9t\u00e9"],'
        '"deep":{"a":{"b":[[],{}]}},"big":12345678901234567890}}'
    )
    raw = (
        '{"m":2048,"n":2048,"k":2048,"device":"rtx-a6000","memory_model":"dram-stream",'
        '"candidates":['
        f'{{"tile_m":128,"tile_n":128,"tile_k":32,"buffer_depth":4,"params":{params}}},'
        '{"tile_m":64,"tile_n":64,"tile_k":64,"buffer_depth":3}]}'
    )
    response = client.post(
        "/optimize-tiling", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    # in the ranked entry and in best (the answer is compact UTF-8 JSON)
    assert response.content.count(params.encode()) == 2
    assert response.json()["candidates"][1]["params"] is None


def test_equal_tilings_form_one_group(client: TestClient) -> None:
    same = Tiling(128, 128, 32, 4)
    tilings = [same, Tiling(64, 64, 64, 3), same, Tiling(128, 64, 64, 2), same]
    answer = client.post("/optimize-tiling", json=_body(tilings)).json()
    entries = answer["candidates"]
    group = [e for e in entries if e["input_index"] in (0, 2, 4)]
    assert [e["input_index"] for e in group] == [0, 2, 4]
    fields = ("rank", "predicted_time_us", "probability_best", "interval_low_us", "math_wait_us")
    for name in fields:
        assert len({e[name] for e in group}) == 1, name
    # probability_best is the group's: it sums to 1 over the groups (one value per rank)
    per_rank = {e["rank"]: e["probability_best"] for e in entries}
    assert sorted(per_rank) == [1, 2, 3]
    assert sum(per_rank.values()) == pytest.approx(1.0)
    assert answer["shortlist"]["draws"] > 0
    assert answer["best"]["input_index"] == entries[0]["input_index"]
    assert entries[0]["rank"] == 1


def test_top_k_counts_ranks_and_z3_search_agrees(client: TestClient) -> None:
    tilings = _random_tilings(random.Random(3), 25)
    full = client.post("/optimize-tiling", json=_body(tilings, shortlist="exploit")).json()
    for solver in ("certified", "z3-search"):
        cut = client.post(
            "/optimize-tiling",
            json=_body(tilings, top_k=2, shortlist="exploit", solver=solver),
        ).json()
        assert cut["status"] == "optimal"
        assert cut["solver"]["mode"] == solver
        assert {c["rank"] for c in cut["candidates"]} == {1, 2}
        assert cut["candidates"] == [c for c in full["candidates"] if c["rank"] <= 2]


def test_a_timeline_is_the_best_candidates(client: TestClient) -> None:
    tilings = [Tiling(64, 64, 64, 3), Tiling(128, 128, 32, 4)]
    answer = client.post("/optimize-tiling", json=_body(tilings, include_timeline=True)).json()
    best = answer["best"]
    assert len(answer["timeline"]) == best["stages"]


def test_batch_items_take_candidates_and_the_cache_key_covers_params(client: TestClient) -> None:
    tilings = [Tiling(64, 64, 64, 3), Tiling(128, 128, 32, 4)]

    def problem(tag: str) -> dict[str, Any]:
        body = _body(tilings, m=3000)
        body["candidates"] = [_candidate(t, {"tag": tag}) for t in tilings]
        return body

    def solve(*tags: str) -> list[dict[str, Any]]:
        answer = client.post(
            "/optimize-tiling/batch", json={"problems": [problem(t) for t in tags]}
        )
        assert answer.status_code == 200, answer.text
        items: list[dict[str, Any]] = answer.json()["items"]
        return items

    first, second = solve("a", "b")
    assert first["status"] == second["status"] == "ok"
    assert {c["params"]["tag"] for c in first["result"]["candidates"]} == {"a"}
    assert {c["params"]["tag"] for c in second["result"]["candidates"]} == {"b"}
    (again,) = solve("a")
    assert again["cache"] == "hit"
    assert again["result"] == first["result"]


def _problem(response: Any) -> tuple[int, list[str]]:
    return response.status_code, [e["field"] for e in response.json()["errors"]]


def test_bad_candidate_lists_are_4xx_naming_the_field(client: TestClient) -> None:
    one = [Tiling(64, 64, 64, 2)]
    post = client.post
    both = post("/optimize-tiling", json=_body(one, search_space={"tile_m": [64]}))
    assert _problem(both) == (422, ["candidates"])
    empty = post("/optimize-tiling", json=_body([]))
    assert _problem(empty) == (422, ["candidates"])
    many = post("/optimize-tiling", json=_body(one * (MAX_CANDIDATES + 1)))
    assert _problem(many) == (422, ["candidates"])
    fat = _body(one)
    fat["candidates"][0]["params"] = {"x": "y" * MAX_CANDIDATE_PARAMS_BYTES}
    assert _problem(post("/optimize-tiling", json=fat)) == (422, ["candidates.0.params"])
    not_object = _body(one)
    not_object["candidates"][0]["params"] = [1, 2]
    assert _problem(post("/optimize-tiling", json=not_object)) == (422, ["candidates.0.params"])
    zero = _body(one)
    zero["candidates"][0]["tile_k"] = 0
    assert _problem(post("/optimize-tiling", json=zero)) == (422, ["candidates.0.tile_k"])
    huge = post("/optimize-tiling", json=_body([Tiling(256, 256, 256, 8)]))
    assert _problem(huge) == (422, ["candidates"])
    assert huge.json()["errors"][0]["rejected"] == {"shared_memory_per_block": 1}
    assert "candidates" in json.dumps(huge.json())


def test_the_largest_list_is_answered(client: TestClient) -> None:
    tilings = _random_tilings(random.Random(11), MAX_CANDIDATES)
    answer = client.post("/optimize-tiling", json=_body(tilings)).json()
    assert answer["status"] == "optimal"
    ranked = len(answer["candidates"]) + len(answer["infeasible"])
    assert ranked == MAX_CANDIDATES


def test_the_picture_of_a_rank_is_its_groups_tiling(client: TestClient) -> None:
    """candidate_rank counts ranks: a group of two entries at rank 1 leaves rank 2 third."""
    tilings = [Tiling(128, 128, 32, 4), Tiling(128, 128, 32, 4), Tiling(64, 64, 64, 3)]
    body = _body(tilings, shortlist="exploit")
    answer = client.post("/optimize-tiling", json=body).json()
    assert [c["rank"] for c in answer["candidates"]] == [1, 1, 2]
    second = answer["candidates"][2]
    svg = client.post(
        "/optimize-tiling?candidate_rank=2", json=body, headers={"accept": "image/svg+xml"}
    )
    assert svg.status_code == 200
    drawn = f"{second['tile_m']}×{second['tile_n']}×{second['tile_k']}, buffer depth "
    assert f"{drawn}{second['buffer_depth']}, rank 2" in svg.text
    beyond = client.post(
        "/optimize-tiling?candidate_rank=3", json=body, headers={"accept": "image/svg+xml"}
    )
    assert beyond.status_code == 404
