"""POST /calibrate with runs that leave out their configuration (a library's own pick):
synthetic runs timed on a hidden device as the L2-aware model's optimum are fitted back, runs
with and without configurations mix in one fit, and bad sets are refused naming the run."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.convert.configless_core import check_configless, library_runs
from app.main import create_app
from app.settings import Settings
from device_profiles.loader import get_profile
from device_profiles.memory import memory_model_device
from perfmodel.calibration.configless import FITTED, LibraryRun, RunModel, scaled
from perfmodel.errors import CalibrationInputError
from tests.app.service_helpers import clean_environ

__all__ = ["clean_environ"]

DEVICE = memory_model_device(get_profile("h100"), "fp16")
#: the hidden GPU: slower MATH, faster L2, longer latency and launch than the h100 profile
HIDDEN = (-0.25, 0.15, 0.0, 0.4, 0.3, 0.0, 0.0, 0.0)
SIZES = (256, 512, 1024, 2048, 4096)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, log_level="WARNING", cache_path=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return [(rng.choice(SIZES), rng.choice(SIZES), rng.choice(SIZES)) for _ in range(count)]


def _time_us(m: int, n: int, k: int, config: tuple[int, ...] | None, log_scale: Any) -> float:
    run = LibraryRun(m, n, k, "fp16", 1.0, config=None if config is None else (*config, 1, 1))  # type: ignore[arg-type]
    return RunModel(run, DEVICE, 0).predict_us(scaled(DEVICE.base, log_scale))


def _runs(shapes: list[tuple[int, int, int]], configured: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, (m, n, k) in enumerate(shapes):
        config = (128, 128, 64, 3) if configured and i % 2 else None
        run: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": "fp16"}
        if config is not None:
            run.update(zip(("tile_m", "tile_n", "tile_k", "buffer_depth"), config, strict=True))
        run["measured_time_us"] = _time_us(m, n, k, config, HIDDEN)
        out.append(run)
    return out


def _held_out_errors(answer: dict[str, Any], shapes: list[tuple[int, int, int]]) -> list[float]:
    """The fit's recovered optimum times (its figures as log scales of the base) against the
    hidden device's on shapes the fit did not see."""
    values = {f["name"]: f for f in answer["fitted"]}
    log_scale = [math.log(values[n]["value"] / values[n]["base_value"]) for n, _ in FITTED]
    return [
        abs(_time_us(m, n, k, None, log_scale) / _time_us(m, n, k, None, HIDDEN) - 1)
        for m, n, k in shapes
    ]


def _calibrate(client: TestClient, runs: list[dict[str, Any]]) -> Any:
    return client.post(
        "/calibrate", json={"model": "gemm-ws", "base_device": "h100", "measurements": runs}
    )


def test_configless_runs_recover_the_hidden_optimum_times(client: TestClient) -> None:
    held_out = _shapes(12, 2)
    base = [abs(_time_us(*s, None, (0.0,) * 8) / _time_us(*s, None, HIDDEN) - 1) for s in held_out]
    response = _calibrate(client, _runs(_shapes(10, 1)))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["configless_runs"] == list(range(10))
    assert np.median(base) > 0.1  # the base is far off (more than 3x the target below)
    assert np.median(_held_out_errors(answer, held_out)) < 0.03
    profile = client.get(f"/devices/{answer['device']}").json()
    l2 = next(f for f in answer["fitted"] if f["name"] == "l2_bandwidth_gb_per_s")
    assert profile["memory"]["l2_bandwidth_gb_per_s"]["value"] == pytest.approx(l2["value"])


def test_runs_with_and_without_configurations_mix_in_one_fit(client: TestClient) -> None:
    # 16 runs, the documented calibration set: with 10 (5 of them one configuration) this
    # draw leaves the L2 bandwidth and the latency scale nearly interchangeable
    runs = _runs(_shapes(16, 3), configured=True)
    response = _calibrate(client, runs)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["configless_runs"] == [i for i, r in enumerate(runs) if "tile_m" not in r]
    assert 0 < len(answer["configless_runs"]) < len(runs)
    assert np.median(_held_out_errors(answer, _shapes(12, 4))) < 0.03


def test_a_partial_configuration_is_refused_naming_the_missing_field(client: TestClient) -> None:
    runs = _runs(_shapes(2, 5))
    runs[1].update(tile_m=128, tile_n=128)
    response = _calibrate(client, runs)
    assert response.status_code == 422
    assert "measurements.1" in response.text
    assert "tile_k" in response.text and "buffer_depth" in response.text


def test_mixed_element_types_in_a_configless_set_are_refused(client: TestClient) -> None:
    runs = _runs(_shapes(2, 6))
    runs[1]["dtype"] = "fp32"
    response = _calibrate(client, runs)
    assert response.status_code == 422
    # the runs are fitted in canonical order: either run may be the one that differs
    fields = {e["field"] for e in response.json()["errors"]}
    assert fields <= {"measurements.0.dtype", "measurements.1.dtype"} and fields


def test_a_shape_no_configuration_runs_is_refused_naming_the_run() -> None:
    h100 = get_profile("h100")
    hardware = h100.hardware.model_copy(
        update={
            "shared_memory_per_block_bytes": h100.hardware.sm_count.model_copy(update={"value": 64})
        }
    )
    tiny = h100.model_copy(update={"hardware": hardware})
    with pytest.raises(CalibrationInputError) as caught:
        check_configless(tiny, _runs(_shapes(1, 7)))
    assert caught.value.field.startswith("measurements[0]")


def test_recorded_configless_runs_refit_and_bad_ones_are_refused(client: TestClient) -> None:
    first = client.post(
        "/calibrate",
        json={
            "model": "gemm-ws",
            "base_device": "h100",
            "measurements": _runs(_shapes(5, 8)),
            "name": "torch-timed",
        },
    )
    assert first.status_code == 200, first.text
    partial = {**_runs(_shapes(1, 9))[0], "buffer_depth": 2}
    refused = client.post(
        "/devices/torch-timed/measurements", json={"model": "gemm-ws", "measurements": [partial]}
    )
    assert refused.status_code == 422
    assert "measurements.0" in refused.text and "tile_m" in refused.text
    more = _runs(_shapes(3, 9), configured=True)
    added = client.post(
        "/devices/torch-timed/measurements", json={"model": "gemm-ws", "measurements": more}
    )
    assert added.status_code == 200, added.text
    refit = client.post("/devices/torch-timed/recalibrate", json={})
    assert refit.status_code == 200, refit.text
    answer = refit.json()
    assert answer["measurement_count"] == 8
    assert len(answer["configless_runs"]) == 5 + sum("tile_m" not in r for r in more)
    assert np.median(_held_out_errors(answer, _shapes(12, 10))) < 0.05


def test_configless_runs_on_a_base_without_memory_figures_are_refused(client: TestClient) -> None:
    h100 = get_profile("h100").model_dump(mode="json")
    response = client.post(
        "/calibrate",
        json={
            "model": "gemm-ws",
            "base_device_params": {
                "sm_count": int(h100["hardware"]["sm_count"]["value"]),
                **{k: v["value"] for k, v in h100["gemm_ws"].items() if v is not None},
            },
            "measurements": _runs(_shapes(2, 11)),
        },
    )
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "base_device"
    assert "memory" in response.text


def test_a_configured_run_no_sm_holds_in_a_mixed_set_is_refused_naming_it(
    client: TestClient,
) -> None:
    runs = _runs(_shapes(2, 12))
    runs[1].update(tile_m=256, tile_n=256, tile_k=256, buffer_depth=8)  # 8 MB of fp16 stages
    response = _calibrate(client, runs)
    assert response.status_code == 422, response.text
    fields = {e["field"] for e in response.json()["errors"]}
    assert fields <= {"measurements.0", "measurements.1"} and fields


def test_a_configured_runs_threads_and_registers_reach_the_fit() -> None:
    """A run that names its kernel's threads and registers is fitted with them: its CTAs per
    SM are the register file's bound, not shared memory's."""
    document = {
        "m": 4096,
        "n": 4096,
        "k": 1024,
        "dtype": "fp16",
        "measured_time_us": 100.0,
        "tile_m": 64,
        "tile_n": 64,
        "tile_k": 32,
        "buffer_depth": 2,
        "threads_per_cta": 256,
        "registers_per_thread": 128,
    }
    (run,) = library_runs([document])
    assert (run.threads_per_cta, run.registers_per_thread) == (256, 128)
    resident = int(RunModel(run, DEVICE, 0).model.ctas_per_sm[0])
    registers = DEVICE.limits.registers_per_sm
    assert registers is not None
    assert resident == registers // (256 * 128)
