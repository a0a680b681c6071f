"""Does the model rank real tilings? The GeMM-WS memory model against a Triton sweep on an H100.

Usage: python -m bench.bench_h100_triton [--seed 0] [--train 16]

Data: ``bench/h100/run2/triton_sweep.csv``, this project's own measurement (bench/h100/README.md):
a blocked Triton matmul with grouped raster, every tiling of (BLOCK_M, BLOCK_N in 64-256,
BLOCK_K 32-128, stages 2-5, GROUP_M 1 or 8) that fits shared memory, 156 in bf16 and 100 in
tf32, on 12 shapes. ``run3`` is the same sweep a minute later: its agreement with run2 is the
measurement's own floor.

Per dtype and shape, each tiling is predicted as a configured run (tile_m/n/k = BLOCK_M/N/K,
buffer_depth = stages, group_m = GROUP_M, split_k 1, threads per CTA = 32 x num_warps) with
the h100 profile's figures, then after fitting them (perfmodel.calibration.configless.fit)
on ``--train`` seeded random tilings of the dtype drawn from all shapes. Columns:
- Spearman between predicted and measured times over the shape's tilings;
- pick: measured time of the model's fastest tiling over the measured best (1.00 = it found
  the best);
- top 5: the best measured time among the model's five fastest over the measured best (the
  shortlist a tuner would benchmark);
- random: the median tiling's time over the best (what a blind pick costs);
- median |predicted / measured - 1|;
- run3: Spearman of run3 against run2, and run3's fastest tiling timed in run2 over run2's best.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from bench.common import command_line
from device_profiles import get_profile
from device_profiles.memory import memory_model_device
from perfmodel.calibration.configless import Device, LibraryRun, RunModel, fit
from perfmodel.gemm_ws_memory_model import MemoryModelFigures

HERE = Path(__file__).resolve().parent / "h100"
Shape = tuple[int, int, int]


def read_sweep(path: Path) -> dict[str, dict[Shape, list[LibraryRun]]]:
    """dtype -> shape -> one configured run per tiling, in file order."""
    out: dict[str, dict[Shape, list[LibraryRun]]] = defaultdict(lambda: defaultdict(list))
    with open(path, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["error"]:
                continue
            config = (
                int(r["block_m"]),
                int(r["block_n"]),
                int(r["block_k"]),
                int(r["stages"]),
                int(r["group_m"]),
                1,
            )
            shape = (int(r["m"]), int(r["n"]), int(r["k"]))
            out[r["dtype"]][shape].append(
                LibraryRun(
                    *shape,
                    r["dtype"],
                    float(r["median_us"]),
                    config=config,
                    threads_per_cta=32 * int(r["num_warps"]),
                )
            )
    return out


def ranking(predicted: Sequence[float], measured: Sequence[float]) -> tuple[float, ...]:
    """Spearman, pick regret, top-5 regret, median |predicted / measured - 1|."""
    p, m = np.asarray(predicted), np.asarray(measured)
    order = np.argsort(p)
    best = float(m.min())
    return (
        float(spearmanr(p, m).statistic),
        float(m[order[0]]) / best,
        float(m[order[:5]].min()) / best,
        float(np.median(np.abs(p / m - 1))),
    )


def predictions(
    runs: Sequence[LibraryRun], device: Device, figures: MemoryModelFigures
) -> list[float]:
    return [RunModel(r, device, i).predict_us(figures) for i, r in enumerate(runs)]


def report(seed: int, train: int) -> list[str]:
    sweep = read_sweep(HERE / "run2/triton_sweep.csv")
    repeat = read_sweep(HERE / "run3/triton_sweep.csv")
    rows = [
        "| dtype | shape (m x n x k) | tilings | uncalibrated: Spearman / pick / top 5 / median err"
        f" | calibrated on {train}: Spearman / pick / top 5 / median err | random pick "
        "| run3 vs run2: Spearman / pick |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype, shapes in sweep.items():
        device = memory_model_device(get_profile("h100"), dtype)
        pool = [r for runs in shapes.values() for r in runs]
        chosen = random.Random(f"{seed}:{dtype}").sample(pool, train)
        fitted = fit(chosen, device).figures
        summary: dict[str, list[tuple[float, ...]]] = defaultdict(list)
        for shape, runs in shapes.items():
            measured = [r.measured_time_us for r in runs]
            base = ranking(predictions(runs, device, device.base), measured)
            cal = ranking(predictions(runs, device, fitted), measured)
            blind = statistics.median(measured) / min(measured)
            again = {r.config: r.measured_time_us for r in repeat[dtype][shape]}
            second = [again[r.config] for r in runs]
            retest = (
                float(spearmanr(second, measured).statistic),
                measured[int(np.argmin(second))] / min(measured),
            )
            summary["base"].append(base)
            summary["cal"].append(cal)
            summary["blind"].append((blind,))
            summary["retest"].append(retest)
            rows.append(
                f"| {dtype} | {shape[0]} x {shape[1]} x {shape[2]} | {len(runs)} "
                f"| {_cells(base)} | {_cells(cal)} | {blind:.2f} "
                f"| {retest[0]:.2f} / {retest[1]:.2f} |"
            )
        med = {key: tuple(np.median(np.array(v), axis=0)) for key, v in summary.items()}
        rows.append(
            f"| **{dtype}, median of shapes** | | | {_cells(med['base'])} | {_cells(med['cal'])} "
            f"| {med['blind'][0]:.2f} | {med['retest'][0]:.2f} / {med['retest'][1]:.2f} |"
        )
    return rows


def _cells(values: Sequence[float]) -> str:
    rho, pick, top5, err = values
    return f"{rho:.2f} / {pick:.2f} / {top5:.2f} / {100 * err:.0f} %"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=16)
    args = parser.parse_args(argv)
    print(f"command: {command_line()}\n")
    for row in report(args.seed, args.train):
        print(row, flush=True)


if __name__ == "__main__":
    main()
