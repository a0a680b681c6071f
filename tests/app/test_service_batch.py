"""POST /optimize-tiling/batch: request order, per-item status, limits."""

from __future__ import annotations

from kperf_client.client import KperfClient, KperfError
from tests.app.service_helpers import (
    clean_environ,
    in_app,
    make_settings,
    problem,
    wait_until_all_workers_busy,
)

__all__ = ["clean_environ"]


def test_batch_answers_in_request_order_with_per_item_errors() -> None:
    problems = [
        problem(m=512),
        problem(device="nope"),  # unknown device: this item alone fails
        problem(m=768, search_space={"tile_m": {"min": 20, "max": 30, "multiple_of": 16}}),
        problem(m=512),  # same as the first
        problem(n=640),
    ]

    async def scenario(client: KperfClient) -> None:
        singles = {i: await client.optimize(problems[i]) for i in (0, 4)}
        answer = await client.optimize_batch(problems)
        assert [item.index for item in answer.items] == list(range(len(problems)))
        assert [item.status for item in answer.items] == ["ok", "error", "error", "ok", "ok"]
        # the batch gives the same answers as single requests (both from the cache here)
        for i, single in singles.items():
            item = answer.items[i]
            assert item.result == single.response and item.cache == "hit"
        unknown = answer.items[1].error
        assert unknown is not None and unknown.status == 422
        assert [e.field for e in unknown.errors] == ["problems.1.device"]
        empty_range = answer.items[2].error
        assert empty_range is not None and empty_range.status == 422
        assert empty_range.errors[0].field.startswith("problems.2.search_space")

    in_app(scenario)


def test_batch_longer_than_the_setting_is_refused() -> None:
    async def scenario(client: KperfClient) -> None:
        try:
            await client.optimize_batch([problem(m=100 + i) for i in range(3)])
        except KperfError as exc:
            assert exc.status == 422
            assert exc.field_errors[0][0] == "problems"
            assert "at most 2" in exc.field_errors[0][1]
        else:
            raise AssertionError("a 3-item batch must be refused when the limit is 2")

    in_app(scenario, make_settings(max_batch_items=2))


def test_batch_items_share_the_pool_concurrently() -> None:
    async def scenario(client: KperfClient) -> None:
        answer = await client.optimize_batch([problem(k=256 * (i + 1)) for i in range(4)])
        assert all(item.status == "ok" and item.cache == "miss" for item in answer.items)
        text = (await client.http.get("/metrics")).text
        assert 'kperf_solve_duration_seconds_count{kind="optimize-tiling",outcome="ok"} 4.0' in text

    in_app(scenario, make_settings(workers=2))


def test_batch_is_refused_with_503_when_the_queue_is_full(monkeypatch) -> None:
    import asyncio

    import app.jobs
    from tests.app import pool_jobs

    monkeypatch.setattr(app.jobs, "optimize_job", pool_jobs.slow_optimize)

    async def scenario(client: KperfClient) -> None:
        busy = asyncio.ensure_future(client.optimize(problem(m=1300)))
        await wait_until_all_workers_busy(client)  # and the queue (size 0) holds nobody
        response = await client.http.post(
            "/optimize-tiling/batch", json={"problems": [problem(m=1400)]}
        )
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.headers["content-type"] == "application/problem+json"
        assert (await busy).response.status == "optimal"

    in_app(scenario, make_settings(queue_size=0))
