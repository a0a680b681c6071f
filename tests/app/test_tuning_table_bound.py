"""The table's stated worst loss against brute force over every M of the range: each M's
entry (the engines' nearest key) and each M's optimum simulated stage by stage (the
pipeline model's event simulator), not by the scorer the table uses."""

from __future__ import annotations

import dataclasses
import random

import pytest

from app.convert.tuning_table import build_table, table_model
from app.schemas.tuning_table import TuningTableRequest, TuningTableResponse
from device_profiles import get_profile
from perfmodel.gemm_ws import Tiling
from tests.gemm_ws_cases import A6000

TILES_M = (16, 32, 64, 128)
TILES_N = (32, 64, 128)
TILES_K = (32, 64)
DEPTHS = (2, 4)


def _brute_worst_loss(answer: TuningTableResponse, request: TuningTableRequest) -> float:
    """max over every M of the range of t(entry of the nearest key, M) / t*(M) - 1, each time
    from the model's event simulator (not the scorer the table's bound reads)."""
    model = table_model(request, get_profile(request.device) if request.device else None)
    feasible = model.tilings
    keys = [e.m for e in answer.entries]
    chosen = {
        e.m: Tiling(e.tiling.tile_m, e.tiling.tile_n, e.tiling.tile_k, e.tiling.buffer_depth)
        for e in answer.entries
    }
    worst = 0.0
    for m in range(keys[0], keys[-1] + 1):
        nearest = min(keys, key=lambda x, m=m: abs(x - m))
        optimum = min(model.simulate_ns(t, m) for t in feasible)
        worst = max(worst, model.simulate_ns(chosen[nearest], m) / optimum - 1)
    return worst


@pytest.mark.parametrize("seed", range(6))
def test_the_stated_worst_loss_bounds_every_m(seed: int) -> None:
    rng = random.Random(seed)
    keys = sorted(rng.sample(range(1, 400), rng.randint(2, 6)))
    device: dict[str, object] = (
        {"device": "h100"}
        if seed % 2
        else {
            "device_params": dataclasses.asdict(A6000),
            "device_name": "NVIDIA RTX A6000",
            "compute_capability": "8.6",
        }
    )
    request = TuningTableRequest.model_validate(
        {
            "n": rng.choice([256, 1024, 3000, 7168]),
            "k": rng.choice([128, 512, 1000]),
            "m_values": keys,
            "search_space": {
                "tile_m": list(TILES_M),
                "tile_n": list(TILES_N),
                "tile_k": list(TILES_K),
                "buffer_depth": list(DEPTHS),
            },
            "max_distinct_configs": rng.choice([None, 1, 2]),
            "loss_sample_step": rng.choice([16, 32]),
            **device,
        }
    )
    answer = build_table(request, get_profile("h100") if seed % 2 else None, 60.0).response
    measured = _brute_worst_loss(answer, request)
    assert answer.loss_over_range.worst_loss >= measured - 1e-12
    # tiles are multiples of 16 and M enters only through tile counts: the bound is exact
    assert answer.loss_over_range.worst_loss == pytest.approx(measured, abs=1e-9)
