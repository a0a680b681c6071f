"""Each shortlist rank says why it holds that rank (``why``), and what it says holds in the
answer: the draws it cites are its P(best) x draws, the tie it cites is a tiling of equal
simulated time, and the point order it cites is ascending predicted time."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from app.convert.shortlist_why import Ranked, reasons
from perfmodel.gemm_ws import GemmShape, Tiling, simulate
from tests.app.test_optimize_api import client
from tests.gemm_ws_cases import A6000

__all__ = ["client"]  # the module's in-process app, shared with the optimize API tests

#: the paper's Table 1 row the README shows; its default space holds tilings that tie the
#: optimum (TM and TN swapped), which then follow slower tilings that win some draws (the
#: paper's DRAM-stream loads, whose times the brute force below simulates)
PROBLEM = {
    "m": 1024,
    "n": 512,
    "k": 1024,
    "device": "rtx-a6000",
    "memory_model": "dram-stream",
}


def _answer(client: TestClient, **extra: Any) -> Any:
    r = client.post("/optimize-tiling", json={**PROBLEM, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _time_us(c: dict[str, Any]) -> float:
    tiling = Tiling(c["tile_m"], c["tile_n"], c["tile_k"], c["buffer_depth"])
    return simulate(GemmShape(1024, 512, 1024), tiling, A6000).overall_time_ns / 1000


def test_explore_ranks_say_which_rule_placed_them(client: TestClient) -> None:
    body = _answer(client, top_k=8)
    draws = body["shortlist"]["draws"]
    assert body["shortlist"]["mode"] == "explore" and draws > 0
    ranks = body["candidates"]
    assert ranks[0]["why"].startswith("proven optimum")
    assert body["status"] == "optimal"
    ties = 0
    for i, c in enumerate(ranks[1:], start=1):
        p = c["probability_best"]
        if p > 0:
            assert f"the fastest in {round(p * draws)} of {draws} draws" in c["why"]
            continue
        earlier = [j + 1 for j in range(i) if _time_us(ranks[j]) == _time_us(c)]
        if earlier:
            ties += 1
            assert c["why"].startswith(f"predicts the same time as rank {earlier[0]} ")
            # it follows every rank that wins some draw, however slower they are
            assert all(r["probability_best"] == 0 for r in ranks[i:])
        else:
            assert c["why"].startswith("the fastest in no draw")
    assert ties >= 1, "the space's swapped-tile twin of the optimum"


def test_exploit_ranks_follow_the_point_estimate(client: TestClient) -> None:
    ranks = _answer(client, shortlist="exploit", top_k=4)["candidates"]
    times = [_time_us(c) for c in ranks]
    assert times == sorted(times)
    for c in ranks[1:]:
        assert c["why"] == f"next fastest under the device's point figures (point rank {c['rank']})"


def test_reasons_of_each_rule() -> None:
    entries = [Ranked(10.0, 0.5), Ranked(20.0, 0.25), Ranked(10.0, 0.0), Ranked(30.0, 0.0)]
    got = reasons(entries, proven=True, mode="explore", belief="calibration", draws=128)
    assert got[0].startswith("proven optimum")
    assert "the fastest in 32 of 128 draws from the device's calibrated posterior" in got[1]
    assert got[2].startswith("predicts the same time as rank 1 (10.0 us)")
    assert got[3].startswith("the fastest in no draw")
    unproven = reasons(entries[:1], proven=False, mode="explore", belief="priors", draws=128)
    assert unproven[0].startswith("best found within the time limit")
    # nothing drawn (a space too large, or exploit): the point estimate's order throughout
    for mode, belief, draws in (("explore", "none", 0), ("exploit", "priors", 128)):
        rest = reasons(entries, proven=True, mode=mode, belief=belief, draws=draws)[1:]
        assert rest == [
            f"next fastest under the device's point figures (point rank {r})" for r in (2, 3, 4)
        ]
