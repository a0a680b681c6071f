"""Health, readiness, metrics, request ids and JSON logs; problem+json on every error."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from app.errors import HANDLERS
from app.logging import JsonFormatter, request_id_var
from app.service import Service
from kperf_client.client import KperfClient
from tests.app.service_helpers import (
    clean_environ,
    in_app,
    make_settings,
    metric_value,
    problem,
)

__all__ = ["clean_environ"]


def test_healthz_readyz_and_readyz_failing_when_the_pool_is_down() -> None:
    async def scenario(client: KperfClient) -> None:
        assert (await client.http.get("/healthz")).json() == {"status": "ok"}
        ready = await client.http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"] == {
            "profiles_loaded": True,
            "z3_usable": True,
            "pool_alive": True,
        }
        service: Service = client.app.state.service  # type: ignore[union-attr]
        await service.pool.stop()
        down = await client.http.get("/readyz")
        assert down.status_code == 503
        assert down.json()["checks"]["pool_alive"] is False
        assert (await client.http.get("/healthz")).status_code == 200  # still live
        refused = await client.http.post("/optimize-tiling", json=problem())
        assert refused.status_code == 503 and "retry-after" in refused.headers

    in_app(scenario)


def test_metrics_count_requests_per_route_and_status_and_solves() -> None:
    async def scenario(client: KperfClient) -> None:
        await client.http.post("/optimize-tiling", json=problem())
        await client.http.post("/optimize-tiling", json=problem(m=0))
        await client.http.get("/devices/rtx-a6000")
        await client.http.get("/no/such/route")
        text = (await client.http.get("/metrics")).text
        counts = {
            ("/optimize-tiling", "POST", "200"): 1,
            ("/optimize-tiling", "POST", "422"): 1,
            # the route template, not the raw path: bounded label values
            ("/devices/{device_id}", "GET", "200"): 1,
            ("unmatched", "GET", "404"): 1,
        }
        for (route, method, status), expected in counts.items():
            labels = {"route": route, "method": method, "status": status}
            assert metric_value(text, "kperf_http_requests_total", **labels) == expected
            assert (
                metric_value(text, "kperf_http_request_duration_seconds_count", **labels)
                == expected
            )
        assert (
            metric_value(
                text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome="ok"
            )
            == 1
        )
        assert "kperf_queue_depth 0.0" in text
        assert "kperf_worker_restarts_total" in text or "kperf_worker_restarts" in text

    in_app(scenario)


def test_request_id_is_honoured_echoed_or_generated() -> None:
    async def scenario(client: KperfClient) -> None:
        given = await client.http.get("/healthz", headers={"X-Request-ID": "job-42.a"})
        assert given.headers["x-request-id"] == "job-42.a"
        # an id that could inject into headers/logs is replaced, not echoed
        unsafe = await client.http.get("/healthz", headers={"X-Request-ID": "a b\tc" * 50})
        generated = await client.http.get("/healthz")
        for response in (unsafe, generated):
            assert len(response.headers["x-request-id"]) == 32
        assert unsafe.headers["x-request-id"] != generated.headers["x-request-id"]
        error = await client.http.post(
            "/optimize-tiling", json={"m": 1}, headers={"X-Request-ID": "err-1"}
        )
        assert error.headers["x-request-id"] == "err-1"

    in_app(scenario)


def test_access_log_is_json_with_the_request_id() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
            record.rendered = JsonFormatter().format(record)  # type: ignore[attr-defined]

    handler = Keep()

    async def scenario(client: KperfClient) -> None:
        logging.getLogger("kperf.access").addHandler(handler)
        try:
            await client.http.post(
                "/optimize-tiling", json=problem(), headers={"X-Request-ID": "trace-7"}
            )
        finally:
            logging.getLogger("kperf.access").removeHandler(handler)

    in_app(scenario, make_settings(log_level="INFO"))
    lines = [json.loads(r.rendered) for r in records]  # type: ignore[attr-defined]
    line = next(entry for entry in lines if entry.get("request_id") == "trace-7")
    assert line["route"] == "/optimize-tiling" and line["status"] == 200
    assert line["cache"] == "miss" and line["duration_ms"] > 0
    assert request_id_var.get() == "-", "the id does not leak out of the request"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [
        ("GET", "/nowhere", None, 404, None),  # unknown route
        ("DELETE", "/optimize-tiling", None, 405, None),  # wrong method
        ("POST", "/optimize-tiling", b"{not json", 422, "body"),  # malformed JSON
        ("POST", "/optimize-tiling", {"m": 1, "n": 1, "k": 1}, 422, None),  # no device
        ("POST", "/optimize-tiling", problem(device="nope"), 422, "device"),
        ("POST", "/optimize-tiling", problem(top_k=0), 422, "top_k"),
        ("POST", "/optimize-tiling/batch", {"problems": []}, 422, "problems"),
        ("GET", "/devices/nope", None, 404, "device"),
    ],
)
def test_every_error_is_problem_json_naming_the_field(method, path, body, status, field) -> None:
    async def scenario(client: KperfClient) -> None:
        if isinstance(body, bytes):
            response = await client.http.request(
                method, path, content=body, headers={"content-type": "application/json"}
            )
        else:
            response = await client.http.request(method, path, json=body)
        assert response.status_code == status
        assert response.headers["content-type"] == "application/problem+json"
        document = response.json()
        assert document["status"] == status
        assert {"type", "title", "detail", "errors"} <= document.keys()
        if field is not None:
            assert field in [e["field"] for e in document["errors"]]

    in_app(scenario)


def test_every_service_error_class_has_a_handler() -> None:
    from app import pool, service

    classes = [
        pool.PoolSaturated,
        pool.PoolClosed,
        pool.WorkerTimeout,
        pool.WorkerMemoryExceeded,
        pool.WorkerCrashed,
        service.RequestFieldError,
    ]
    for cls in classes:
        assert any(issubclass(cls, handled) for handled in HANDLERS), cls


def test_core_packages_do_not_import_the_http_layer() -> None:
    code = (
        "import sys, solver, perfmodel, perfmodel.gemm_ws, device_profiles; "
        "bad = [m for m in ('fastapi', 'app', 'starlette') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
