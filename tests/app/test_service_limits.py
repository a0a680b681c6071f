"""Time limits, back-pressure, size limits and the memory cap, through the HTTP API."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

import app.jobs
from kperf_client.client import KperfClient, KperfError
from tests.app import pool_jobs
from tests.app.service_helpers import (
    clean_environ,
    in_app,
    make_settings,
    problem,
    wait_until_all_workers_busy,
)

__all__ = ["clean_environ"]

#: client-side allowance on top of the issue's bound: ASGI + JSON + event loop on a busy box
ALLOWANCE_S = 0.15


def bound(limit_s: float) -> float:
    return limit_s * 1.2 + 0.1


def multiples(step: int, count: int) -> dict[str, int]:
    return {"min": step, "max": step * count, "multiple_of": step}


async def timed(
    client: KperfClient, body: dict[str, object]
) -> tuple[int, dict[str, object], float]:
    start = time.monotonic()
    try:
        answer = await client.optimize(body)
        status, document = 200, answer.response.model_dump(mode="json")
    except KperfError as exc:
        status, document = exc.status, exc.problem
    return status, document, time.monotonic() - start


@pytest.mark.slow
def test_solve_that_cannot_finish_returns_within_limit_and_pool_stays_healthy() -> None:
    # 48^3 tile shapes x 64 buffer depths x 8 K splits x 8 raster groups under the L2-reuse
    # term (450 million configurations): far beyond 1 s of solving (48^3 x 64 alone, under
    # the default memory model, is solved within the second)
    limit = 1.0
    huge = problem(
        m=1_000_003,
        n=999_983,
        k=1_048_573,
        time_limit_s=limit,
        search_space={
            "tile_m": multiples(16, 48),
            "tile_n": multiples(16, 48),
            "tile_k": multiples(16, 48),
            "buffer_depth": {"min": 1, "max": 64},
            "split_k": [1, 2, 3, 4, 5, 6, 7, 8],
            "group_m": [1, 2, 3, 4, 5, 6, 7, 8],
        },
        memory_model="l2-reuse",
    )

    async def scenario(client: KperfClient) -> None:
        status, document, elapsed = await timed(client, huge)
        assert elapsed <= bound(limit) + ALLOWANCE_S, elapsed
        # either the solver's own best-so-far, or the pool killed it: never a 500
        assert (status, document.get("status")) in ((200, "timeout"), (504, 504)), document
        if status == 504:
            assert document["errors"][0]["field"] == "time_limit_s"
        # healthy afterwards: a normal problem is solved to optimality
        status, document, _ = await timed(client, problem())
        assert (status, document["status"]) == (200, "optimal")
        ready = await client.readyz()
        assert ready["status"] == "ready" and ready["workers_alive"] == 1

    in_app(scenario, make_settings(max_search_space_candidates=1 << 45))


@pytest.mark.slow
def test_large_solve_answers_best_so_far_within_the_bound() -> None:
    limit = 1.0
    large = problem(
        m=100_003,
        n=99_983,
        k=104_857,
        time_limit_s=limit,
        search_space={
            "tile_m": multiples(16, 32),
            "tile_n": multiples(16, 32),
            "tile_k": multiples(16, 32),
            "buffer_depth": {"min": 1, "max": 8},
        },
    )

    async def scenario(client: KperfClient) -> None:
        status, document, elapsed = await timed(client, large)
        assert elapsed <= bound(limit) + ALLOWANCE_S, elapsed
        assert status in (200, 504)
        if status == 200:
            assert document["status"] in ("timeout", "optimal")
            assert document["candidates"], "a timeout answer still carries the best so far"

    in_app(scenario)


def test_queue_full_answers_503_with_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.jobs, "optimize_job", pool_jobs.slow_optimize)

    async def scenario(client: KperfClient) -> None:
        first = asyncio.ensure_future(timed(client, problem(m=1100)))
        await wait_until_all_workers_busy(client)  # and the queue (size 0) holds nobody
        status, document, elapsed = await timed(client, problem(m=1200))
        assert status == 503
        assert document["_retry_after"] == "1"
        assert document["title"] == "Service busy" and document["errors"]
        assert elapsed < 0.5, "refused at once, not after waiting"
        assert (await first)[0] == 200
        metrics = (await client.http.get("/metrics")).text
        assert 'kperf_rejected_requests_total{reason="queue_full"}' in metrics

    in_app(scenario, make_settings(queue_size=0))


def test_body_over_the_limit_is_413_problem_json() -> None:
    async def scenario(client: KperfClient) -> None:
        big = b'{"m": 1, "pad": "' + b"x" * 5000 + b'"}'
        declared = await client.http.post(
            "/optimize-tiling", content=big, headers={"content-type": "application/json"}
        )

        async def chunks():  # no Content-Length: the limit must hold while streaming
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        streamed = await client.http.post(
            "/optimize-tiling", content=chunks(), headers={"content-type": "application/json"}
        )
        for response in (declared, streamed):
            assert response.status_code == 413
            assert response.headers["content-type"] == "application/problem+json"
            body = response.json()
            assert body["status"] == 413 and body["errors"][0]["field"] == "body"
            assert "4096 bytes" in body["errors"][0]["reason"]
        small = await client.http.post("/optimize-tiling", json=problem())
        assert small.status_code == 200

    in_app(scenario, make_settings(max_body_bytes=4096, max_ptx_bytes=2048))


def test_a_streamed_body_passes_through_whole_and_each_refusal_is_counted_once() -> None:
    # nothing is buffered by the limit any more: a chunked body under it must reach the
    # endpoint whole, byte for byte, and one over it is one rejection in the metrics
    async def scenario(client: KperfClient) -> None:
        good = json.dumps(problem()).encode()

        async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
            for i in range(0, len(data), size):
                yield data[i : i + size]

        headers = {"content-type": "application/json"}
        streamed = await client.http.post(
            "/optimize-tiling", content=chunks(good, 7), headers=headers
        )
        direct = await client.http.post("/optimize-tiling", content=good, headers=headers)
        assert streamed.status_code == direct.status_code == 200
        assert streamed.json()["best"] == direct.json()["best"]

        async def refused() -> float:
            text = (await client.http.get("/metrics")).text
            prefix = 'kperf_rejected_requests_total{reason="body_too_large"}'
            return sum(
                float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)
            )

        before = await refused()
        big = b'{"m": 1, "pad": "' + b"x" * 9000 + b'"}'
        over = await client.http.post(
            "/optimize-tiling", content=chunks(big, 1000), headers=headers
        )
        assert over.status_code == 413 and over.json()["errors"][0]["field"] == "body"
        assert await refused() == before + 1

    in_app(scenario, make_settings(max_body_bytes=4096, max_ptx_bytes=2048))


def test_a_large_malformed_body_is_a_422_naming_the_position() -> None:
    # above 64 KiB the body is decoded off the event loop: its JSON error must come back as a
    # small body's does, naming the body and the character where decoding stopped
    async def scenario(client: KperfClient) -> None:
        for pad in (1, 100_000):
            body = b'{"m": 1024, "pad": "' + b"x" * pad + b'", }'
            response = await client.http.post(
                "/optimize-tiling", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 422
            (error,) = response.json()["errors"]
            assert error["field"] == "body"
            assert f"character {len(body) - 1}" in error["reason"]

    in_app(scenario, make_settings(max_body_bytes=1 << 20, max_ptx_bytes=1 << 19))


def test_limits_from_settings_name_the_field() -> None:
    async def scenario(client: KperfClient) -> None:
        cases = [
            (problem(time_limit_s=5.0), "time_limit_s"),
            (
                problem(search_space={"tile_m": {"min": 16, "max": 4096, "multiple_of": 16}}),
                "search_space",
            ),
        ]
        for body, field in cases:
            with pytest.raises(KperfError) as info:
                await client.optimize(body)
            assert info.value.status == 422
            assert [f for f, _ in info.value.field_errors] == [field]

    in_app(
        scenario,
        make_settings(
            max_time_limit_s=2.0, default_time_limit_s=1.0, max_search_space_candidates=10_000
        ),
    )


def test_configured_maximum_above_the_schema_default_is_honoured() -> None:
    # KPERF_MAX_TIME_LIMIT_S may go up to an hour; the request schema once capped every request
    # at 120 s whatever the server allowed
    async def scenario(client: KperfClient) -> None:
        answer = await client.optimize(problem(time_limit_s=200.0))
        assert answer.response.status == "optimal"
        with pytest.raises(KperfError) as info:
            await client.optimize(problem(time_limit_s=301.0))
        assert info.value.status == 422
        assert [f for f, _ in info.value.field_errors] == ["time_limit_s"]
        assert "300" in str(info.value)

    in_app(scenario, make_settings(max_time_limit_s=300.0))


def test_memory_cap_fails_that_request_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    real_job = app.jobs.optimize_job

    async def scenario(client: KperfClient) -> None:
        monkeypatch.setattr(app.jobs, "optimize_job", pool_jobs.greedy_optimize)
        with pytest.raises(KperfError) as info:
            await client.optimize(problem())
        assert info.value.status == 422
        assert "memory limit" in str(info.value)
        monkeypatch.setattr(app.jobs, "optimize_job", real_job)
        answer = await client.optimize(problem())
        assert answer.response.status == "optimal"

    in_app(scenario, make_settings(worker_memory_limit_bytes=1024**3))
