"""Small certified solves in the service's own thread (app/inline.py) against the pool path.

Oracle: the same service with the inline thread off (every solve in a worker); the answers
must be the same bytes but for the solve's elapsed time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import time
from typing import Any

import pytest

import app.jobs
import solver.per_configuration
import solver.problem
from app.inline import InlineRunner
from app.service import Service
from kperf_client.client import KperfClient
from perfmodel import gemm_ws_scoring as scoring
from solver.errors import SolverTimeout
from tests.app.service_helpers import in_app, make_settings, metric_value, problem
from tests.gemm_ws_cases import A6000, TABLE_1

INLINE = make_settings(inline_max_configurations=1024)
POOL = make_settings(inline_max_configurations=0)
TABLE_1_SPACE = {"tile_m": [32, 64, 128], "tile_n": [32, 64, 128], "tile_k": [32, 64, 128]}
_ELAPSED = re.compile(rb'"elapsed_ms":[-+.0-9eE]+')


def _service(client: KperfClient) -> Service:
    service: Service = client.app.state.service  # type: ignore[union-attr]
    return service


def _inline_runs(client: KperfClient) -> int:
    runner = _service(client).inline
    return 0 if runner is None else runner.jobs_run


async def _warm(client: KperfClient) -> None:
    """Wait for the start-up warm-up to free the inline thread."""
    runner = _service(client).inline
    assert isinstance(runner, InlineRunner)
    deadline = time.monotonic() + 30
    while runner._busy.locked():
        assert time.monotonic() < deadline, "the inline warm-up never finished"
        await asyncio.sleep(0.01)


def _bodies() -> list[dict[str, Any]]:
    """Table 1 problems in the paper's space (both shortlists, top_k 1 and 5, a profile and
    inline figures, a candidate list), then random small spaces, dtypes and wave models."""
    bodies: list[dict[str, Any]] = []
    for (m, n, k), _ in TABLE_1:
        for top_k, shortlist in ((1, "explore"), (5, "exploit")):
            bodies.append(
                problem(m=m, n=n, k=k, top_k=top_k, shortlist=shortlist, search_space=TABLE_1_SPACE)
            )
    bodies.append(
        problem(
            candidates=[
                {"tile_m": 128, "tile_n": 128, "tile_k": 32, "buffer_depth": 4, "params": {"w": 4}},
                {"tile_m": 128, "tile_n": 128, "tile_k": 32, "buffer_depth": 4, "params": {"w": 8}},
                {"tile_m": 64, "tile_n": 64, "tile_k": 64, "buffer_depth": 3},
                {"tile_m": 256, "tile_n": 128, "tile_k": 64, "buffer_depth": 4},
            ]
        )
    )
    rng = random.Random(19)
    tiles = [16, 32, 48, 64, 96, 128, 256]
    for _ in range(12):
        space = {
            "tile_m": sorted(rng.sample(tiles, rng.randint(1, 3))),
            "tile_n": sorted(rng.sample(tiles, rng.randint(1, 3))),
            "tile_k": sorted(rng.sample(tiles, rng.randint(1, 3))),
            "buffer_depth": sorted(rng.sample(range(1, 9), rng.randint(1, 4))),
            "enforce_shared_memory": rng.random() < 0.7,
        }
        bodies.append(
            problem(
                m=rng.randint(1, 8192),
                n=rng.randint(1, 8192),
                k=rng.randint(1, 8192),
                dtype=rng.choice(["fp16", "bf16", "fp32"]),
                wave_time_model=rng.choice(["paper", "include-last-math"]),
                top_k=rng.randint(1, 6),
                shortlist=rng.choice(["explore", "exploit"]),
                search_space=space,
            )
        )
    return bodies


def _answers(settings: Any, bodies: list[dict[str, Any]]) -> tuple[list[tuple[int, bytes]], int]:
    async def scenario(client: KperfClient) -> tuple[list[tuple[int, bytes]], int]:
        if _service(client).inline is not None:
            await _warm(client)
        out = []
        for body in bodies:
            response = await client.http.post("/optimize-tiling", json=body)
            assert response.headers.get("x-cache") in ("miss", None), body
            out.append((response.status_code, _ELAPSED.sub(b'"elapsed_ms":0', response.content)))
        return out, _inline_runs(client)

    result: tuple[list[tuple[int, bytes]], int] = in_app(scenario, settings)
    return result


def test_inline_answers_are_the_pool_answers_byte_for_byte() -> None:
    bodies = _bodies()
    inline, ran_inline = _answers(INLINE, bodies)
    pooled, ran_pooled = _answers(POOL, bodies)
    assert ran_pooled == 0
    # every request is small: each answer was solved in the thread (errors: none expected)
    assert [status for status, _ in inline] == [200] * len(bodies)
    assert ran_inline == len(bodies)
    for body, got, expected in zip(bodies, inline, pooled, strict=True):
        assert got == expected, body


def test_what_is_not_small_and_certified_goes_to_the_pool() -> None:
    others = [
        problem(include_timeline=True, search_space=TABLE_1_SPACE),
        problem(solver="z3-search", search_space=TABLE_1_SPACE),
        # 9 x 9 x 4 x 4 = 1296 configurations: above the threshold
        problem(
            search_space={
                "tile_m": [16, 32, 48, 64, 80, 96, 112, 128, 256],
                "tile_n": [16, 32, 48, 64, 80, 96, 112, 128, 256],
                "tile_k": [16, 32, 64, 128],
                "buffer_depth": [2, 3, 4, 5],
            }
        ),
    ]

    async def scenario(client: KperfClient) -> None:
        await _warm(client)
        for body in others:
            response = await client.http.post("/optimize-tiling", json=body)
            assert response.status_code == 200, response.text
        assert _inline_runs(client) == 0
        text = (await client.http.get("/metrics")).text
        ok = metric_value(
            text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome="ok"
        )
        assert ok == len(others)

    in_app(scenario, INLINE)


def test_a_busy_thread_sends_small_requests_to_the_pool_and_the_bound_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that ignores its limit in the thread is answered 504 at the request's bound
    (limit + 20 % + 100 ms); while it keeps the thread, small requests are solved by the pool
    (whose workers, other processes, do not see this test's patch)."""
    from app.convert import explore

    real = explore.solve

    def stuck_when_m_is_777(request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.m == 777:
            time.sleep(1.5)
        return real(request, *args, **kwargs)

    monkeypatch.setattr(explore, "solve", stuck_when_m_is_777)

    async def scenario(client: KperfClient) -> None:
        await _warm(client)
        limit = 0.5
        started = time.monotonic()
        stuck = await client.http.post("/optimize-tiling", json=problem(m=777, time_limit_s=limit))
        elapsed = time.monotonic() - started
        assert stuck.status_code == 504, stuck.text
        assert stuck.json()["errors"][0]["field"] == "time_limit_s"
        assert limit <= elapsed <= limit * 1.2 + 0.1 + 0.3, elapsed
        # the thread still holds the stuck job: this one is a pool solve
        runs = _inline_runs(client)
        other = await client.http.post("/optimize-tiling", json=problem(m=778))
        assert other.status_code == 200 and other.json()["status"] == "optimal"
        assert _inline_runs(client) == runs
        await asyncio.sleep(1.5)  # the stuck job ends; the thread is free again
        again = await client.http.post("/optimize-tiling", json=problem(m=779))
        assert again.status_code == 200 and _inline_runs(client) == runs + 1
        text = (await client.http.get("/metrics")).text
        timeouts = metric_value(
            text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome="timeout"
        )
        assert timeouts == 1

    in_app(scenario, INLINE)


def test_the_job_gets_what_is_left_of_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real = app.jobs.optimize_job

    def spy(
        request_json: dict[str, Any], profile_json: Any, prepared: Any, time_limit_s: float
    ) -> Any:
        seen.append(time_limit_s)
        return real(request_json, profile_json, prepared, time_limit_s)

    monkeypatch.setattr(app.jobs, "optimize_job", spy)

    async def scenario(client: KperfClient) -> None:
        await _warm(client)
        response = await client.http.post("/optimize-tiling", json=problem(time_limit_s=2.0))
        assert response.status_code == 200 and _inline_runs(client) == 1

    in_app(scenario, INLINE)
    # the request's limit less what reading it took and the answer's margin
    assert len(seen) == 1 and 1.5 < seen[0] < 2.0


def test_a_wrong_incumbent_is_still_caught_in_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scorer made to rank the true optimum last: Z3's certificate, checked in the
    service's own thread, refutes the incumbent; the answer comes from the Z3 search and the
    mismatch is counted."""
    real = scoring.score_configurations

    def wrong(*args: Any, **kwargs: Any) -> scoring.Scores:
        scores = real(*args, **kwargs)
        best = int(scores.overall_time_ns[0].argmin())
        times = scores.overall_time_ns.copy()
        times[:, best] = 1 << 58
        return scoring.Scores(times, scores.total_math_wait_ns)

    real_ranking = solver.per_configuration.rank_scored

    def wrong_ranking(*args: Any) -> Any:
        # the solver's ranking only: the explore shortlist scores with the model's own scorer
        with monkeypatch.context() as patch:
            patch.setattr(scoring, "score_configurations", wrong)
            return real_ranking(*args)

    monkeypatch.setattr(solver.per_configuration, "rank_scored", wrong_ranking)
    monkeypatch.setattr(solver.problem, "STRICT_CERTIFICATE", False)
    # the paper's A6000 figures and space: Table 1's answer is known
    body = {
        "m": 1024,
        "n": 1024,
        "k": 1024,
        "device_params": dataclasses.asdict(A6000),
        "search_space": {**TABLE_1_SPACE, "enforce_shared_memory": False},
        "top_k": 1,
    }

    async def scenario(client: KperfClient) -> None:
        await _warm(client)
        response = await client.http.post("/optimize-tiling", json=body)
        assert response.status_code == 200, response.text
        assert _inline_runs(client) == 1
        document = response.json()
        assert document["solver"]["certificate_mismatches"] == 1
        assert [c["outcome"] for c in document["solver"]["certificate"]] == ["sat"]
        # Table 1's answer for 1024^3 all the same, from the Z3 search
        best = document["best"]
        assert (best["tile_m"], best["tile_n"], best["tile_k"]) == TABLE_1[0][1]
        text = (await client.http.get("/metrics")).text
        assert metric_value(text, "kperf_certificate_mismatches_total") == 1

    in_app(scenario, INLINE)


def test_a_stopped_pool_refuses_small_requests_too() -> None:
    async def scenario(client: KperfClient) -> None:
        await _warm(client)
        await _service(client).pool.stop()
        refused = await client.http.post("/optimize-tiling", json=problem())
        assert refused.status_code == 503 and "retry-after" in refused.headers
        assert _inline_runs(client) == 0

    in_app(scenario, INLINE)


def test_a_solver_timeout_in_the_thread_names_the_clients_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = app.jobs.optimize_job

    def times_out(request_json: Any, profile_json: Any, prepared: Any, time_limit_s: float) -> Any:
        if request_json["m"] == 1024:
            raise SolverTimeout(time_limit_s)  # the limit the job got: less than the client's
        return real(request_json, profile_json, prepared, time_limit_s)

    monkeypatch.setattr(app.jobs, "optimize_job", times_out)

    async def scenario(client: KperfClient) -> None:
        await _warm(client)
        response = await client.http.post("/optimize-tiling", json=problem(time_limit_s=0.7))
        assert response.status_code == 504, response.text
        assert "time limit of 0.7 s" in response.json()["detail"]
        # the failed job gave the thread back: the next small solve runs in it
        after = await client.http.post("/optimize-tiling", json=problem(m=1000))
        assert after.status_code == 200 and _inline_runs(client) == 1
        text = (await client.http.get("/metrics")).text
        timeouts = metric_value(
            text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome="timeout"
        )
        assert timeouts == 1

    in_app(scenario, INLINE)
