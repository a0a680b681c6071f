"""Calibration speed (targets: 1,000 GeMM-WS measurements <= 2 s median; 200 Many-BSP
measurements of the paper kernels <= 10 s median). Exits 1 when a target is missed.

Usage: python -m bench.bench_calibration [--repeats R] [--seed S]

GeMM-WS: 1,000 runs (random shapes 256..8192, tiles 16..256, depth 1..4) simulated from
random hidden figures with 2 % log-normal noise; fit_gemm_ws with the defaults (six figures,
5-fold cross-validation). Many-BSP: per paper device, 200 launches of the three worked-example
kernels (Hotspot, KNN, MM) with grid.x drawn from 1..3x the paper's, cycles from hidden
figures (mu 2.4, block_lnch_ovh 900, warp_lnch_ovh 25) with 2 % noise; fit_many_bsp with the
defaults (three figures, 5 folds), PTX analysis included in the timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import numpy as np

from bench.common import command_line, median_seconds
from perfmodel.calibration import (
    CalibrationResult,
    ManyBspMeasurement,
    fit_gemm_ws,
    fit_many_bsp,
    predict_many_bsp_cycles,
)
from tests.calibration_cases import BASE, draw_machine, draw_runs, measure
from tests.perfmodel.manybsp.conftest import CASES, paper_request

GEMM_TARGET_S = 2.0
MANY_BSP_TARGET_S = 10.0
HIDDEN = {"mu": 2.4, "block_launch_overhead_cycles": 900.0, "warp_launch_overhead_cycles": 25.0}


def many_bsp_measurements(device: str, count: int, seed: int) -> list[ManyBspMeasurement]:
    rng = np.random.default_rng(seed)
    cases = [c for c in CASES if c["device"] == device]
    out = []
    for i in range(count):
        request = paper_request(cases[i % len(cases)])
        grid_x = int(rng.integers(1, 3 * request.grid[0] + 1))
        request = dataclasses.replace(request, grid=(grid_x, *request.grid[1:]))
        truth = dataclasses.replace(
            request.device, device=dataclasses.replace(request.device.device, **HIDDEN)
        )
        cycles = predict_many_bsp_cycles(truth, request) * math.exp(rng.normal(0.0, 0.02))
        out.append(ManyBspMeasurement(request, cycles))
    return out


def summary(result: CalibrationResult) -> str:
    figures = ", ".join(
        f"{f.name}={f.value:.4g}" + ("" if f.identifiable else " (not identifiable)")
        for f in result.fitted
    )
    cv = result.cross_validation_error
    cv_text = f"{cv.mean_abs_pct:.2f}% / {cv.max_abs_pct:.2f}%" if cv else "n/a"
    return (
        f"{figures}; training error mean/max {result.training_error.mean_abs_pct:.2f}% / "
        f"{result.training_error.max_abs_pct:.2f}%; 5-fold CV mean/max {cv_text}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"command: {command_line()}\n")
    print("| calibration | measurements | median s | target s | met |")
    print("|---|---|---|---|---|")
    notes = []
    ok = True

    rng = np.random.default_rng(args.seed)
    truth = draw_machine(rng)
    gemm = measure(truth, draw_runs(rng, 1000), rng, noise=0.02)
    seconds = median_seconds(lambda: fit_gemm_ws(BASE, gemm), args.repeats)
    ok &= seconds <= GEMM_TARGET_S
    print(f"| GeMM-WS, 6 figures, 5 folds | 1000 | {seconds:.3f} | {GEMM_TARGET_S} | "
          f"{seconds <= GEMM_TARGET_S} |")  # fmt: skip
    notes.append(f"GeMM-WS: {summary(fit_gemm_ws(BASE, gemm))}")

    for device in ("gtx-760", "940mx"):
        data = many_bsp_measurements(device, 200, args.seed)
        base = data[0].request.device
        seconds = median_seconds(lambda d=data, b=base: fit_many_bsp(b, d), args.repeats)
        ok &= seconds <= MANY_BSP_TARGET_S
        print(f"| Many-BSP {device}, 3 figures, 5 folds | 200 | {seconds:.3f} | "
              f"{MANY_BSP_TARGET_S} | {seconds <= MANY_BSP_TARGET_S} |")  # fmt: skip
        notes.append(f"Many-BSP {device}: {summary(fit_many_bsp(base, data))}")
    print()
    for note in notes:
        print(note)
    print(f"GeMM-WS hidden figures: {truth}")
    print(f"Many-BSP hidden figures: {HIDDEN}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
