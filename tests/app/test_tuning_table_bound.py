"""The table's stated worst loss against brute force over every M of the range: each M's
entry (the engines' nearest key) and each M's optimum simulated stage by stage
(perfmodel.gemm_ws.simulate, simulate_async), not by the scorer the table uses."""

from __future__ import annotations

import dataclasses
import random

import pytest

from app.convert.candidates import problem_of
from app.convert.tuning_table import build_table
from app.schemas.optimize import OptimizeTilingRequest
from app.schemas.tuning_table import TuningTableRequest
from device_profiles import get_profile
from perfmodel.gemm_ws import GemmShape, Tiling, simulate
from perfmodel.gemm_ws_async import simulate_async
from solver.candidates_async import AsyncCandidateProblem
from tests.gemm_ws_cases import A6000

TILES_M = (16, 32, 64, 128)
TILES_N = (32, 64, 128)
TILES_K = (32, 64)
DEPTHS = (2, 4)


def _brute_worst_loss(table: dict[str, object], request: TuningTableRequest) -> float:
    profile = get_profile(request.device) if request.device else None
    base = OptimizeTilingRequest.model_validate(
        {
            "m": 1,
            "n": request.n,
            "k": request.k,
            "dtype": request.dtype,
            "device": request.device,
            "device_params": request.device_params.model_dump() if request.device_params else None,
            "candidates": [
                {"tile_m": tm, "tile_n": tn, "tile_k": tk, "buffer_depth": d}
                for tm in TILES_M
                for tn in TILES_N
                for tk in TILES_K
                for d in DEPTHS
            ],
        }
    )
    _, problem = problem_of(base, profile)
    limit = problem.machine.shared_memory_per_block_bytes
    tilings = [t for t in problem.tilings if limit is None or t.shared_memory_bytes(1) <= limit]

    def time(t: Tiling, m: int) -> int:
        shape = GemmShape(m, request.n, request.k)
        if isinstance(problem, AsyncCandidateProblem):
            limits = problem.effective_limits
            return simulate_async(shape, t, problem.machine, limits, 1).overall_time_ns
        return simulate(shape, t, problem.machine).overall_time_ns

    entries = table["entries"]
    assert isinstance(entries, list)
    keys = [e.m for e in entries]
    chosen = {
        e.m: Tiling(e.tiling.tile_m, e.tiling.tile_n, e.tiling.tile_k, e.tiling.buffer_depth)
        for e in entries
    }
    worst = 0.0
    for m in range(keys[0], keys[-1] + 1):
        nearest = min(keys, key=lambda x, m=m: abs(x - m))
        worst = max(worst, time(chosen[nearest], m) / min(time(t, m) for t in tilings) - 1)
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
    measured = _brute_worst_loss({"entries": answer.entries}, request)
    assert answer.loss_over_range.worst_loss >= measured - 1e-12
    # tiles are multiples of 16 and M enters only through tile counts: the bound is exact
    assert answer.loss_over_range.worst_loss == pytest.approx(measured, abs=1e-9)
