"""POST /optimize-tiling with pipeline_model (issue 17): default per profile, the async-copy
answer against the model's own simulator, and field errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.convert.optimize import default_pipeline_model
from app.main import create_app
from app.settings import Settings
from device_profiles import get_profile
from device_profiles.schema import REQUIRED_GEMM_WS_FIGURES, DeviceProfile
from perfmodel.gemm_ws import GemmShape, Tiling
from perfmodel.gemm_ws_async import PipelineModel, SmLimits, simulate_async
from tests.gemm_ws_cases import A6000

SEARCH = {
    "tile_m": [32, 64, 128],
    "tile_n": [32, 64, 128],
    "tile_k": [32, 64],
    "buffer_depth": [2, 3, 4, 6],
}
PROFILES = Path(__file__).resolve().parents[2] / "device_profiles"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, cache_path=None, cache_memory_items=0)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _post(client: TestClient, **body: Any) -> Any:
    return client.post("/optimize-tiling", json=body)


def test_the_papers_device_defaults_to_the_paper_model(client: TestClient) -> None:
    r = _post(client, m=1024, n=1024, k=1024, device="rtx-a6000", search_space=SEARCH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["pipeline_model"] == "paper"
    for c in body["candidates"]:
        assert c["ctas_per_sm"] == 1
        assert c["bound"] in ("load", "math")
        assert 1 <= c["stages_in_flight"] <= c["buffer_depth"]


def test_async_copy_answer_matches_the_simulator(client: TestClient) -> None:
    r = _post(
        client,
        m=2048,
        n=2048,
        k=4096,
        device="rtx-a6000",
        search_space=SEARCH,
        pipeline_model="async-copy",
        include_timeline=True,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["pipeline_model"] == "async-copy"
    assert body["status"] == "optimal"
    # CC 8.6: 16 resident blocks, 100 KB shared memory per SM (CUDA guide), fp16.
    limits = SmLimits(16, 102400, 65536, 1536)
    times = []
    for c in body["candidates"]:
        tiling = Tiling(c["tile_m"], c["tile_n"], c["tile_k"], c["buffer_depth"])
        sim = simulate_async(GemmShape(2048, 2048, 4096), tiling, A6000, limits, 2)
        assert c["predicted_time_us"] == pytest.approx(sim.overall_time_ns / 1000)
        assert c["ctas_per_sm"] == sim.ctas_per_sm
        assert c["stages_in_flight"] == sim.stages_in_flight
        assert c["bound"] == sim.bound.value
        assert c["ctas_per_sm"] * c["shared_memory_bytes"] <= 102400
        times.append(c["predicted_time_us"])
    assert times == sorted(times)
    timeline = body["timeline"]
    assert all(s["data_arrival_us"] <= s["math_start_us"] for s in timeline)


def _estimated(profile_id: str) -> DeviceProfile:
    raw = json.loads((PROFILES / f"{profile_id}.json").read_text())
    raw["schema_version"] = 2
    cited = {"value": 1.0, "source": "test estimate", "estimate": True}
    raw["gemm_ws"] = dict.fromkeys(REQUIRED_GEMM_WS_FIGURES, cited)
    return DeviceProfile.model_validate(raw)


def test_default_pipeline_model_rule() -> None:
    assert default_pipeline_model(get_profile("rtx-a6000")) is PipelineModel.PAPER
    assert default_pipeline_model(None) is PipelineModel.PAPER
    assert default_pipeline_model(_estimated("a100")) is PipelineModel.ASYNC_COPY
    assert default_pipeline_model(_estimated("h100")) is PipelineModel.ASYNC_COPY
    assert default_pipeline_model(_estimated("v100")) is PipelineModel.PAPER


def test_threads_without_registers_is_a_field_error(client: TestClient) -> None:
    r = _post(
        client,
        m=256,
        n=256,
        k=256,
        device="rtx-a6000",
        pipeline_model="async-copy",
        threads_per_cta=256,
    )
    assert r.status_code == 422, r.text
    assert "registers_per_thread" in r.text


def test_unknown_pipeline_model_is_a_field_error(client: TestClient) -> None:
    r = _post(client, m=256, n=256, k=256, device="rtx-a6000", pipeline_model="tma")
    assert r.status_code == 422
    assert "pipeline_model" in r.text


def test_registers_limit_ctas_per_sm(client: TestClient) -> None:
    # 256 threads x 255 registers = 65280 of the SM's 65536: one CTA per SM whatever the tile.
    r = _post(
        client,
        m=4096,
        n=4096,
        k=1024,
        device="rtx-a6000",
        search_space=SEARCH,
        pipeline_model="async-copy",
        threads_per_cta=256,
        registers_per_thread=255,
    )
    assert r.status_code == 200, r.text
    assert {c["ctas_per_sm"] for c in r.json()["candidates"]} == {1}
