"""A long record refits within the default time limit: 2,000 stored runs, POST
/devices/{id}/recalibrate with no time limit given answers 200 (the outside probe saw a 504 at
2,059). The fit's cost was the BLAS library's threads contending inside each worker
(``app/pool.py``); bench/bench_recalibrate.py times 5,000."""

from __future__ import annotations

from typing import Any

import httpx

from kperf_client.client import KperfClient
from tests.app.calibration_helpers import gemm_ws_runs
from tests.app.service_helpers import in_app, make_settings

HISTORY = 2_000
POST_RUNS = 1_000


def history(count: int) -> list[dict[str, Any]]:
    """``count`` distinct runs (each seed draws new noise for the 36 tilings and shapes)."""
    runs: list[dict[str, Any]] = []
    seed = 0
    while len(runs) < count:
        runs += gemm_ws_runs(seed)
        seed += 1
    return runs[:count]


async def store_history(http: httpx.AsyncClient, runs: list[dict[str, Any]], name: str) -> None:
    """Calibrate ``name`` from the first 9 runs, then post the rest in batches."""
    made = await http.post(
        "/calibrate",
        json={"model": "gemm-ws", "base_device": "rtx-a6000", "name": name,
              "measurements": runs[:9], "time_limit_s": 120},
    )  # fmt: skip
    assert made.status_code == 200, made.text
    for start in range(9, len(runs), POST_RUNS):
        added = await http.post(
            f"/devices/{name}/measurements",
            json={"model": "gemm-ws", "measurements": runs[start : start + POST_RUNS]},
        )
        assert added.status_code == 200, added.text


def test_recalibrating_2000_stored_runs_answers_within_the_default_limit() -> None:
    runs = history(HISTORY)

    async def scenario(client: KperfClient) -> dict[str, Any]:
        await store_history(client.http, runs, "long")
        # no time_limit_s: the default's
        refit = await client.http.post("/devices/long/recalibrate", json={}, timeout=120)
        assert refit.status_code == 200, refit.text
        answer: dict[str, Any] = refit.json()
        return answer

    answer = in_app(scenario, make_settings(workers=1, max_calibration_measurements=HISTORY))
    assert answer["measurement_count"] == HISTORY
    # the hidden device's runs are fitted to their 2 % noise (tests/app/calibration_helpers.py)
    assert answer["training_error"]["mean_abs_pct"] < 5
