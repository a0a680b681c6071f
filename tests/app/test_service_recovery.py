"""Through the HTTP API (in-process app, real worker pool): a request that crashes its worker,
/readyz reporting the pool and the persistent cache truthfully."""

from __future__ import annotations

from pathlib import Path

import pytest

import app.jobs
from kperf_client.client import KperfClient
from tests.app import pool_jobs
from tests.app.service_helpers import clean_environ, in_app, make_settings, metric_value, problem

__all__ = ["clean_environ"]


def test_request_that_kills_every_worker_it_runs_on_is_a_typed_500(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_job = app.jobs.optimize_job

    async def scenario(client: KperfClient) -> None:
        monkeypatch.setattr(app.jobs, "optimize_job", pool_jobs.die_optimize)
        response = await client.http.post("/optimize-tiling", json=problem())
        # retried once on a fresh worker (the first death may not have been its fault); the
        # second convicts it: a problem+json 500, the only 5xx a crash may cause
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/problem+json"
        body = response.json()
        assert body["title"] == "Worker crashed" and "2 attempts" in body["detail"]
        monkeypatch.setattr(app.jobs, "optimize_job", real_job)
        assert (await client.http.post("/optimize-tiling", json=problem())).status_code == 200
        text = (await client.http.get("/metrics")).text
        assert metric_value(text, "kperf_worker_restarts_total", reason="crash") == 2
        assert (
            metric_value(
                text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome="crash"
            )
            == 1
        )
        ready = (await client.http.get("/readyz")).json()
        assert ready["status"] == "ready" and ready["workers_alive"] == 1

    in_app(scenario)


def test_readyz_reports_a_bypassed_persistent_cache(tmp_path: Path) -> None:
    corrupt = tmp_path / "cache.sqlite3"
    corrupt.write_bytes(b"this is not sqlite" * 100)

    async def scenario(client: KperfClient) -> dict[str, object]:
        response = await client.http.get("/readyz")
        # the service answers from the solver: still ready, but says what it lost
        assert response.status_code == 200
        body: dict[str, object] = response.json()
        return body

    body = in_app(scenario, make_settings(cache_path=corrupt))
    store = body["store"]
    assert isinstance(store, dict) and store["backend"] == "sqlite"
    assert store["status"] == "degraded: store"
    assert "not a database" in str(store["reason"])


def test_readyz_reports_each_worker_and_true_counts(tmp_path: Path) -> None:
    async def scenario(client: KperfClient) -> dict[str, object]:
        body: dict[str, object] = (await client.http.get("/readyz")).json()
        return body

    body = in_app(scenario, make_settings(workers=2, cache_path=tmp_path / "ok.sqlite3"))
    assert body["store"] == {"backend": "sqlite", "status": "ok", "reason": None}
    workers = body["workers"]
    assert isinstance(workers, list) and [w["state"] for w in workers] == ["idle", "idle"]
    assert (body["workers_alive"], body["workers_idle"], body["workers_busy"]) == (2, 2, 0)
    assert body["workers_starting"] == 0
