"""Both pipeline models on public measurements: the CUTLASS 2.x TF32 cp.async sweep on an RTX
3090 (../shared/data/real-gemm/cutlass_tf32_rtx3090, 36 configs at 8192^3, stages 2-5).

Each model's six GeMM-WS figures are fitted on a random half of the configs (least squares on
log time, scipy, the same generic fit for both models: perfmodel.calibration.fit_gemm_ws
fits the paper model only), then scored on the other half (median |error|) and over all 36
configs (does the predicted top 5 hold one within 3 % of the measured best?).

Second part: the Kernel Tuner ``Xgemm`` caches (../shared/data/real-gemm/kt_xgemm_sgemm4096,
fp32 4096^3, single-buffered: buffer depth 1): the best time per (MWG, NWG, KWG) tile, each
model fitted on 8 random tiles, Spearman rank correlation over the other tiles.

Usage: python -m bench.bench_pipeline_real [--splits N]
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
from functools import partial
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from bench.common import command_line
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, overall_time_closed_form_ns
from perfmodel.gemm_ws_async import SmLimits, overall_time_async_closed_form_ns

DATA = (
    Path(__file__).resolve().parents[2]
    / "shared/data/real-gemm/cutlass_tf32_rtx3090/multisize_results.csv"
)
#: RTX 3090 (GA102, CC 8.6): 82 SMs (NVIDIA GeForce RTX 3090 specifications: 10,496 CUDA
#: cores = 82 SMs x 128); 16 resident blocks, 100 KB shared memory per SM, 99 KB per block
#: (CUDA C++ Programming Guide, technical specifications, CC 8.6)
SM_COUNT = 82
LIMITS = SmLimits(max_blocks_per_sm=16, shared_memory_per_sm_bytes=102400)
#: starting point of the fit (RTX A6000 figures of the paper, §4.2; the A6000 is also GA102)
START = (1.68, 1.543, 0.77, 0.01, 152.96, 24610.0)

Row = tuple[GemmShape, Tiling, float]

XGEMM = DATA.parents[1] / "kt_xgemm_sgemm4096/xgemm_sgemm4096_all.csv"
#: (SMs, SM limits) per GPU of the Xgemm caches. SMs: NVIDIA A100 whitepaper (108), GeForce
#: RTX 3090 (82), RTX 2080 Ti (68), TITAN RTX (72) specifications. Resident blocks and shared
#: memory per SM: CUDA C++ Programming Guide, technical specifications (CC 8.0: 32, 164 KB;
#: CC 8.6: 16, 100 KB; CC 7.5: 16, 64 KB).
XGEMM_GPUS: dict[str, tuple[int, SmLimits]] = {
    "A100": (108, SmLimits(32, 167936)),
    "RTX_3090": (82, SmLimits(16, 102400)),
    "RTX_2080_Ti": (68, SmLimits(16, 65536)),
    "RTX_Titan": (72, SmLimits(16, 65536)),
}


def _rows() -> list[Row]:
    with open(DATA, encoding="utf-8") as f:
        return [
            (
                GemmShape(int(r["M"]), int(r["N"]), int(r["K"])),
                Tiling(int(r["tb_m"]), int(r["tb_n"]), int(r["tb_k"]), int(r["stages"])),
                float(r["mean_time_ms"]) * 1000,
            )
            for r in csv.DictReader(f)
            if r["case"] == "case1"
        ]


def _machine(x: np.ndarray, sm_count: int = SM_COUNT) -> GemmWsMachine:
    # x: logs of the six GeMM-WS figures in GemmWsMachine field order (t_init_us first)
    t = [float(v) for v in np.exp(x)]
    return GemmWsMachine(sm_count, t[0], t[1], t[2], t[3], t[4], t[5])


def _predict_us(
    model: str,
    machine: GemmWsMachine,
    shape: GemmShape,
    tiling: Tiling,
    limits: SmLimits = LIMITS,
) -> float:
    if model == "paper":
        return overall_time_closed_form_ns(shape, tiling, machine) / 1000
    return overall_time_async_closed_form_ns(shape, tiling, machine, limits, 4) / 1000


def _fit(
    model: str, train: list[Row], sm_count: int = SM_COUNT, limits: SmLimits = LIMITS
) -> GemmWsMachine:
    def residuals(x: np.ndarray) -> np.ndarray:
        machine = _machine(x, sm_count)
        return np.array(
            [np.log(_predict_us(model, machine, s, t, limits) / y) for s, t, y in train]
        )

    found = least_squares(residuals, np.log(np.array(START)), diff_step=1e-3, max_nfev=400)
    return _machine(found.x, sm_count)


def _xgemm_rows(gpu: str) -> list[Row]:
    best: dict[tuple[int, int, int], float] = {}
    with open(XGEMM, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["gpu"] != gpu:
                continue
            key = (int(r["MWG"]), int(r["NWG"]), int(r["KWG"]))
            best[key] = min(best.get(key, float("inf")), float(r["time_ms"]) * 1000)
    shape = GemmShape(4096, 4096, 4096)
    return [(shape, Tiling(tm, tn, tk, 1), y) for (tm, tn, tk), y in sorted(best.items())]


def _xgemm_rho(model: str, gpu: str, splits: int) -> tuple[int, float]:
    sm_count, limits = XGEMM_GPUS[gpu]
    rows = _xgemm_rows(gpu)
    rhos = []
    for seed in range(splits):
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        train, test = [rows[i] for i in order[:8]], [rows[i] for i in order[8:]]
        machine = _fit(model, train, sm_count, limits)
        predicted = [_predict_us(model, machine, s, t, limits) for s, t, _ in test]
        rhos.append(_spearman(predicted, [y for _, _, y in test]))
    return len(rows), statistics.median(rhos)


def _score(model: str, rows: list[Row], splits: int) -> tuple[float, int, list[float]]:
    errors, hits, rhos = [], 0, []
    best = min(y for _, _, y in rows)
    for seed in range(splits):
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        train = [rows[i] for i in order[: len(rows) // 2]]
        test = [rows[i] for i in order[len(rows) // 2 :]]
        machine = _fit(model, train)
        predict = partial(_predict_row, model, machine)
        errors += [abs(predict(r) / r[2] - 1) for r in test]
        top5 = sorted(rows, key=predict)[:5]
        hits += any(y <= 1.03 * best for _, _, y in top5)
        rhos.append(_spearman([predict(r) for r in test], [r[2] for r in test]))
    return statistics.median(errors), hits, rhos


def _predict_row(model: str, machine: GemmWsMachine, row: Row) -> float:
    return _predict_us(model, machine, row[0], row[1])


def _spearman(a: list[float], b: list[float]) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--splits", type=int, default=5)
    args = parser.parse_args()
    if not DATA.exists():
        print(f"skipped: {DATA} absent")
        return
    rows = _rows()
    print(f"command: {command_line()}\n")
    print(
        f"| model | held-out median abs error (over {args.splits} random halves) "
        "| splits whose predicted top 5 holds a config within 3 % of the measured best "
        "| held-out Spearman rho (median) |"
    )
    print("|---|---|---|---|")
    for model in ("paper", "async-copy"):
        error, hits, rhos = _score(model, rows, args.splits)
        print(
            f"| {model} | {error * 100:.1f} % | {hits}/{args.splits} "
            f"| {statistics.median(rhos):.2f} |"
        )
    if not XGEMM.exists():
        return
    print(
        "\n| GPU (Xgemm, depth 1) | tiles | paper: median Spearman rho "
        f"(fit on 8 tiles, {args.splits} random splits) | async-copy: median Spearman rho |"
    )
    print("|---|---|---|---|")
    for gpu in XGEMM_GPUS:
        tiles, paper_rho = _xgemm_rho("paper", gpu, args.splits)
        _, async_rho = _xgemm_rho("async-copy", gpu, args.splits)
        print(f"| {gpu} | {tiles} | {paper_rho:.2f} | {async_rho:.2f} |")


if __name__ == "__main__":
    main()
