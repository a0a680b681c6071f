"""Explicit candidate lists (what autotuners send) vs a search space, on the worker path, in
one run.

Usage: python -m bench.bench_candidates [--repeats N]

Each request runs as a worker runs it (app.jobs.optimize_job: conversion, certified solve,
explore shortlist over 128 posterior draws, response encoding), in process, cache off. The
baseline is the default request (the default space, 875 configurations, top_k 5); the lists are
a Triton-like autotune list (24 configs: 4 tile shapes x 3 stage counts x 2 num_warps) and
random lists of 256 and 4,096 tilings (every feasible one ranked). Prints Markdown for
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from typing import Any

from app.convert.candidates import prepare
from app.jobs import optimize_job
from app.schemas.optimize import OptimizeTilingRequest
from bench.common import command_line, median_seconds
from device_profiles import get_profile

DEVICE = "rtx-a6000"
SHAPE = {"m": 4096, "n": 4096, "k": 4096}


def _triton_like() -> list[dict[str, Any]]:
    """A typical @triton.autotune config list: tile shapes x num_stages x num_warps."""
    tiles = [(128, 128, 32), (128, 64, 32), (64, 128, 32), (64, 64, 64)]
    return [
        {
            "tile_m": tm,
            "tile_n": tn,
            "tile_k": tk,
            "buffer_depth": stages,
            "params": {"num_warps": warps, "num_stages": stages, "GROUP_SIZE_M": 8},
        }
        for (tm, tn, tk), stages, warps in itertools.product(tiles, (3, 4, 5), (4, 8))
    ]


def _random(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tiles = (16, 32, 48, 64, 96, 128, 192, 256)
    return [
        {
            "tile_m": rng.choice(tiles),
            "tile_n": rng.choice(tiles),
            "tile_k": rng.choice(tiles),
            "buffer_depth": rng.randint(1, 8),
            "params": {"i": i},
        }
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    profile = get_profile(DEVICE)
    profile_json = profile.model_dump(mode="json")
    cases: list[tuple[str, dict[str, Any]]] = [
        ("default space, top_k 5 (baseline)", {}),
        ("Triton-like list, 24 configs", {"candidates": _triton_like()}),
        ("random list, 256", {"candidates": _random(256, 1)}),
        ("random list, 4,096", {"candidates": _random(4096, 2)}),
    ]
    rows = []
    baseline = None
    for name, extra in cases:
        request = {**SHAPE, "device": DEVICE, **extra}

        def run(request: dict[str, Any] = request) -> None:
            prepared = prepare(OptimizeTilingRequest.model_validate(request), profile)
            answer = json.loads(optimize_job(request, profile_json, prepared, 60.0).body)
            assert answer["status"] == "optimal", answer["status"]

        seconds = median_seconds(run, args.repeats)
        baseline = baseline or seconds
        rows.append(f"| {name} | {seconds * 1000:.1f} | {seconds / baseline:.2f} |")
    print(f"`{command_line()}` ({DEVICE}, {SHAPE['m']}^3, explore shortlist, medians)\n")
    print("| request | worker path ms | ratio to the default space |")
    print("|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
