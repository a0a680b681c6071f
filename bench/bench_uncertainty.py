"""Uncertainty: fits that never fall apart, intervals that mean what they say, shortlists that
explore at the price of exploiting.

Usage: python -m bench.bench_uncertainty [--devices N] [--repeats R]

1. Combinations only, noise-free: every run load-bound (the compute figures enter no run), and
   every run latency-bound (stage time the same for every tile within 1 %): training error and
   the held-out error of new runs of the same kind, i.e. within the measured tiles (targets
   < 0.1 % and <= 0.5 %); held-out runs of larger tiles than any measured are only bounded
   by the runs: for those, whether the truth lies in the 10-90 % interval.
2. 3 % noise: per hidden device 40 training runs, 40 held-out; held-out mean error (<= 4 %)
   and the share of held-out true times inside their 10-90 % posterior interval (70-90 %).
3. Cost: POST /optimize-tiling's solve (in-process, no cache) with the default shortlist
   (top_k 5, explore, 128 posterior draws) against top_k 1 exploit on the same request:
   median of R runs, ratio measured in one run (target <= 1.5x).
Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

from app.convert.explore import solve
from app.convert.optimize import to_problem
from app.schemas.optimize import OptimizeTilingRequest
from bench.common import command_line, median_seconds
from device_profiles import get_profile
from perfmodel.calibration import GemmWsMeasurement, apply_gemm_ws, fit_gemm_ws
from perfmodel.calibration.gemm_ws import predict_gemm_ws_interval_us, predict_gemm_ws_us
from perfmodel.gemm_ws import GemmShape, Tiling
from tests.calibration_cases import BASE, draw_machine, draw_runs, measure, simulated_time_us


def _runs(pairs: list[tuple[GemmShape, Tiling]]) -> list[GemmWsMeasurement]:
    return [
        GemmWsMeasurement(s.m, s.n, s.k, "fp16", t.tile_m, t.tile_n, t.tile_k, t.buffer_depth, 1.0)
        for s, t in pairs
    ]


def combinations(devices: int) -> list[tuple[str, float, float, int, float]]:
    """Per case: (case, worst training max error %, worst held-out max error % over held-out
    runs within the measured tiles, held-out runs beyond them, share of those whose true time
    lies in the 10-90 % interval) over ``devices`` hidden devices."""
    out = []
    for case in ("load-bound", "latency-bound"):
        train_worst = held_worst = 0.0
        beyond: list[bool] = []
        for seed in range(devices):
            rng = np.random.default_rng(1000 + seed)
            truth = draw_machine(rng)
            if case == "load-bound":
                truth = dataclasses.replace(
                    truth, load_throughput_elements_per_us=30.0, compute_throughput_macs_per_us=1e6
                )
            else:
                truth = dataclasses.replace(
                    truth,
                    load_throughput_elements_per_us=1e6,
                    compute_throughput_macs_per_us=1e9,
                    load_startup_latency_us=2.0,
                    compute_startup_latency_us=0.5,
                )
            training = draw_runs(rng, 30, depths=(2, 3, 4))
            result = fit_gemm_ws(BASE, measure(truth, training, rng))
            calibrated = apply_gemm_ws(BASE, result)
            held = draw_runs(rng, 20, depths=(2, 3))
            # a run "of the same kind" stays within the measured tiles: its MACs and loads per
            # stage were seen; past them the runs only bound the figures (see the note)
            most_macs = max(t.tile_m * t.tile_n * t.tile_k for _, t in training)
            inside = [(s, t) for s, t in held if t.tile_m * t.tile_n * t.tile_k <= most_macs]
            outside = [(s, t) for s, t in held if (s, t) not in inside]
            errors = [
                100 * abs(predict_gemm_ws_us(calibrated, r) / simulated_time_us(s, t, truth) - 1)
                for r, (s, t) in zip(_runs(inside), inside, strict=True)
            ]
            if outside:
                _, low, high = predict_gemm_ws_interval_us(BASE, result, _runs(outside))
                true = np.array([simulated_time_us(s, t, truth) for s, t in outside])
                beyond += list((low <= true) & (true <= high))
            train_worst = max(train_worst, result.training_error.max_abs_pct)
            held_worst = max(held_worst, max(errors, default=0.0))
        covered = float(np.mean(beyond)) if beyond else float("nan")
        out.append((case, train_worst, held_worst, len(beyond), covered))
    return out


def noisy(devices: int) -> tuple[float, float]:
    """(held-out mean error %, share of held-out true times inside the 10-90 % interval)."""
    covered: list[bool] = []
    errors: list[float] = []
    for seed in range(devices):
        rng = np.random.default_rng(2000 + seed)
        truth = draw_machine(rng)
        result = fit_gemm_ws(BASE, measure(truth, draw_runs(rng, 40), rng, noise=0.03), folds=0)
        held = draw_runs(rng, 40)
        predicted, low, high = predict_gemm_ws_interval_us(BASE, result, _runs(held))
        true = np.array([simulated_time_us(s, t, truth) for s, t in held])
        covered += list((low <= true) & (true <= high))
        errors += list(100 * np.abs(predicted / true - 1))
    return float(np.mean(errors)), float(np.mean(covered))


def cost(repeats: int) -> list[tuple[str, float, float, float]]:
    """(problem, top_k 1 exploit ms, top_k 5 explore ms, ratio)."""
    profile = get_profile("rtx-a6000")
    table_1 = {"tile_m": [32, 64, 128], "tile_n": [32, 64, 128], "tile_k": [32, 64, 128]}
    problems = {
        "4096^3, default space": {"m": 4096, "n": 4096, "k": 4096},
        "1024x512x1024, Table 1 space": {"m": 1024, "n": 512, "k": 1024, "search_space": table_1},
    }
    out = []
    for label, body in problems.items():
        times = []
        for extra in ({"top_k": 1, "shortlist": "exploit"}, {}):
            request = OptimizeTilingRequest.model_validate({**body, "device": "rtx-a6000", **extra})

            def run(request: OptimizeTilingRequest = request) -> None:
                _, problem = to_problem(request, profile)
                solve(request, profile, problem, 10.0)

            times.append(1000 * median_seconds(run, repeats))
        out.append((label, times[0], times[1], times[1] / times[0]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"command: {command_line()}\n")
    ok = True
    print(
        "| runs (noise-free) | worst training max error | worst held-out max error (within "
        "the measured tiles) | held-out runs beyond them | their truth inside the interval |"
    )
    print("|---|---|---|---|---|")
    for case, train, held, beyond, covered in combinations(args.devices):
        print(
            f"| all {case}, {args.devices} devices | {train:.4f} % | {held:.4f} % | {beyond} | "
            f"{100 * covered:.0f} % |"
        )
        ok &= train < 0.1 and held <= 0.5
    mean_error, coverage = noisy(args.devices)
    print(f"\n3 % noise, {args.devices} devices x 40 held-out runs: held-out mean error")
    print(f"{mean_error:.2f} % (target <= 4 %), 10-90 % intervals cover {100 * coverage:.1f} %")
    print("of the true times (target 70-90 %)\n")
    ok &= mean_error <= 4.0 and 0.7 <= coverage <= 0.9
    print("| request (rtx-a6000) | top_k 1 exploit, ms | top_k 5 explore, ms | ratio |")
    print("|---|---|---|---|")
    for label, exploit_ms, explore_ms, ratio in cost(args.repeats):
        print(f"| {label} | {exploit_ms:.1f} | {explore_ms:.1f} | {ratio:.2f}x |")
        ok &= ratio <= 1.5
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
