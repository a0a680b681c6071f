"""solver/tuning_table against brute force: the choice under max_distinct_configs is the best
of every subset, the pieces split the range as the engines' nearest-key lookup does, the
bound covers every M of a random monotone instance, and the file names are the loaders'."""

from __future__ import annotations

import itertools
import random

import pytest

from solver.tuning_table import (
    EngineFormat,
    engine_device_name,
    engine_file_name,
    nearest_key_index,
    num_stages_for,
    pieces,
    select,
    worst_loss,
)
from solver.tuning_table.loss import sample_points


def _brute_minimax(times: list[list[int]], most: int) -> float:
    configs = range(len(times[0]))
    best = float("inf")
    for size in range(1, most + 1):
        for subset in itertools.combinations(configs, size):
            worst = max(min(row[c] for c in subset) / min(row) - 1 for row in times)
            best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(60))
def test_selection_is_the_best_subset(seed: int) -> None:
    rng = random.Random(seed)
    keys, configs = rng.randint(2, 7), rng.randint(2, 7)
    times = [[rng.randint(100, 400) for _ in range(configs)] for _ in range(keys)]
    preferred = [row.index(min(row)) for row in times]
    most = rng.randint(1, 3)
    chosen = select(times, preferred, most)
    assert chosen.exact
    assert chosen.distinct <= most
    expected = _brute_minimax(times, most)
    assert chosen.worst_key_loss == pytest.approx(expected, abs=1e-12)
    assert chosen.lower_bound_loss == pytest.approx(expected, abs=1e-12)
    # the stated loss is what the chosen entries lose
    stated = max(row[c] / min(row) - 1 for row, c in zip(times, chosen.chosen, strict=True))
    assert chosen.worst_key_loss == pytest.approx(stated)


def test_without_a_limit_every_key_keeps_its_optimum() -> None:
    times = [[3, 1, 2], [1, 2, 3], [2, 3, 1]]
    chosen = select(times, [1, 0, 2], None)
    assert chosen.chosen == (1, 0, 2) and chosen.worst_key_loss == 0 and chosen.z3_checks == 0


@pytest.mark.parametrize("seed", range(30))
def test_pieces_follow_the_engines_nearest_key(seed: int) -> None:
    rng = random.Random(seed)
    keys = sorted(rng.sample(range(1, 700), rng.randint(1, 9)))
    step = rng.choice([1, 7, 16, 64])
    parts = pieces(keys, step)
    covered = [m for p in parts for m in range(p.first_m, p.last_m + 1)]
    assert covered == list(range(keys[0], keys[-1] + 1))
    for part in parts:
        for m in range(part.first_m, part.last_m + 1):
            # the engines' code, as written in their loaders' callers
            nearest = min(keys, key=lambda x, m=m: abs(x - m))
            assert keys[part.key_index] == nearest == keys[nearest_key_index(keys, m)]
        assert (part.last_m - 1) // step == (
            part.first_m - 1
        ) // step or part.first_m == part.last_m


@pytest.mark.parametrize("seed", range(30))
def test_the_bound_holds_for_every_m_of_a_monotone_instance(seed: int) -> None:
    rng = random.Random(seed)
    keys = sorted(rng.sample(range(1, 900), rng.randint(2, 8)))
    configs = rng.randint(2, 6)
    # step functions of M, non-decreasing, with jumps anywhere (not only at the pieces' ends)
    jumps = [sorted(rng.sample(range(1, 900), 12)) for _ in range(configs)]
    base = [rng.randint(50, 120) for _ in range(configs)]
    rise = [rng.randint(5, 40) for _ in range(configs)]

    def time(c: int, m: int) -> int:
        return base[c] + rise[c] * sum(j < m for j in jumps[c])

    chosen = [rng.randrange(configs) for _ in keys]
    parts = pieces(keys, rng.choice([8, 16, 32]))
    times_at = {m: [time(c, m) for c in range(configs)] for m in sample_points(parts)}
    bound = worst_loss(parts, chosen, times_at)
    measured = max(
        time(chosen[nearest_key_index(keys, m)], m) / min(time(c, m) for c in range(configs)) - 1
        for m in range(keys[0], keys[-1] + 1)
    )
    assert bound.worst_loss >= measured - 1e-12


def test_file_names_are_the_loaders() -> None:
    device = engine_device_name("NVIDIA H100 (SXM5)")
    assert device == "NVIDIA_H100_80GB_HBM3"
    assert (
        engine_file_name(EngineFormat.VLLM, 1536, 7168, device, "fp8", (128, 128))
        == "N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,"
        "block_shape=[128,128].json"
    )
    assert engine_file_name(EngineFormat.SGLANG, 1, 2, "X", "fp8", (64, 32)).endswith(
        "block_shape=[64, 32].json"
    )
    assert engine_device_name(None, "NVIDIA A100-SXM4-80GB") == "NVIDIA_A100-SXM4-80GB"
    assert engine_device_name("unknown") is None
    calibrated = "NVIDIA H100 (SXM5), calibrated (gemm-ws, async-copy)"
    assert engine_device_name(calibrated) == device


def test_num_stages_are_tritons_buffers() -> None:
    # inverse of Triton's pipeliner (kperf_client.triton_configs.buffer_depth_of)
    from kperf_client.triton_configs import buffer_depth_of

    for capability in ("8.0", "8.6", "9.0", None):
        for depth in range(1, 8):
            assert buffer_depth_of(num_stages_for(depth, capability), capability) == depth
