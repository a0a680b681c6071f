"""Both pipeline models on public measurements, calibrated by the product's own MAP fit
(perfmodel.calibration.fit_gemm_ws, the same engine and cited priors as POST /calibrate):
the CUTLASS 2.x TF32 cp.async sweep on an RTX 3090 (../shared/data/real-gemm/cutlass_tf32_rtx3090,
36 configs at 8192^3, stages 2-5; threads per CTA from the warp tiles).

Each model's six GeMM-WS figures are fitted on a random half of the configs, starting from and
held by the priors of the rtx-a6000 profile (GA102 like the RTX 3090; its SM count replaced by
the 3090's 82, runs as fp32 with the profile's fp32 ratios), then scored on the other half
(median |error|) and over all 36 configs (does the predicted top 5 hold one within 3 % of the
measured best?).

Second part: the Kernel Tuner ``Xgemm`` caches (../shared/data/real-gemm/kt_xgemm_sgemm4096,
fp32 4096^3, single-buffered: buffer depth 1): the best time per (MWG, NWG, KWG) tile, each
model fitted on 8 random tiles, Spearman rank correlation over the other tiles. Priors: the
a100 profile's for the A100, the rtx-a6000 profile's for the three GeForce/TITAN GPUs (no
Turing profile ships); each GPU's own SM count and SM limits.

Usage: python -m bench.bench_pipeline_real [--splits N]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import random
import statistics
from pathlib import Path

import numpy as np

from app.convert.optimize import gemm_ws_machine
from bench.common import command_line
from device_profiles import get_profile
from device_profiles.pipeline import sm_limits
from device_profiles.priors import gemm_ws_dtype_ratios, gemm_ws_priors
from device_profiles.schema import DeviceProfile
from perfmodel.calibration import GemmWsMeasurement, apply_gemm_ws, fit_gemm_ws
from perfmodel.calibration.gemm_ws import predict_run_us
from perfmodel.gemm_ws import GemmWsMachine, SmLimits
from perfmodel.pipelines import PipelineSettings, resolve

DATA = (
    Path(__file__).resolve().parents[2]
    / "shared/data/real-gemm/cutlass_tf32_rtx3090/multisize_results.csv"
)
#: RTX 3090 (GA102, CC 8.6): 82 SMs (NVIDIA GeForce RTX 3090 specifications: 10,496 CUDA
#: cores = 82 SMs x 128); 16 resident blocks, 100 KB shared memory, 1536 threads, 64 K
#: registers per SM (CUDA C++ Programming Guide, technical specifications, CC 8.6: the
#: rtx-a6000 profile's, also CC 8.6)
SM_COUNT = 82
MODELS = ("paper", "async-copy")

XGEMM = DATA.parents[1] / "kt_xgemm_sgemm4096/xgemm_sgemm4096_all.csv"
#: (profile whose priors are used, SMs, SM limits) per GPU of the Xgemm caches. SMs: NVIDIA
#: A100 whitepaper (108), GeForce RTX 3090 (82), RTX 2080 Ti (68), TITAN RTX (72)
#: specifications. Resident blocks and shared memory per SM: CUDA C++ Programming Guide,
#: technical specifications (CC 8.0: 32, 164 KB; CC 8.6: 16, 100 KB; CC 7.5: 16, 64 KB).
XGEMM_GPUS: dict[str, tuple[str, int, SmLimits]] = {
    "A100": ("a100", 108, SmLimits(32, 167936)),
    "RTX_3090": ("rtx-a6000", 82, SmLimits(16, 102400)),
    "RTX_2080_Ti": ("rtx-a6000", 68, SmLimits(16, 65536)),
    "RTX_Titan": ("rtx-a6000", 72, SmLimits(16, 65536)),
}


@dataclasses.dataclass(frozen=True)
class Device:
    """What a fit needs of a device: base figures, cited priors, dtype ratios, SM limits."""

    base: GemmWsMachine
    profile: DeviceProfile
    limits: SmLimits

    def fit(self, model: str, train: list[GemmWsMeasurement], seed: int) -> GemmWsMachine:
        result = fit_gemm_ws(
            self.base,
            train,
            folds=0,
            seed=seed,
            priors=gemm_ws_priors(self.profile),
            dtype_ratios=gemm_ws_dtype_ratios(self.profile),
            pipeline=resolve(model, PipelineSettings(limits=self.limits)),
        )
        return apply_gemm_ws(self.base, result)

    def predict(self, model: str, machine: GemmWsMachine, run: GemmWsMeasurement) -> float:
        ratios = gemm_ws_dtype_ratios(self.profile)
        return predict_run_us(
            machine, run, resolve(model, PipelineSettings(limits=self.limits)), ratios
        )


def _device(profile_id: str, sm_count: int, limits: SmLimits | None = None) -> Device:
    profile = get_profile(profile_id)
    # the service's fp16 figures of the profile, on the data's GPU's SM count, without the
    # per-block shared-memory limit (the sweep's configs all ran)
    base = dataclasses.replace(
        gemm_ws_machine(profile), sm_count=sm_count, shared_memory_per_block_bytes=None
    )
    return Device(base, profile, limits or sm_limits(profile))


def _rows() -> list[GemmWsMeasurement]:
    with open(DATA, encoding="utf-8") as f:
        return [
            GemmWsMeasurement(
                int(r["M"]),
                int(r["N"]),
                int(r["K"]),
                "fp32",
                int(r["tb_m"]),
                int(r["tb_n"]),
                int(r["tb_k"]),
                int(r["stages"]),
                float(r["mean_time_ms"]) * 1000,
                # one warp per warp tile of the threadblock tile
                threads_per_cta=32
                * (int(r["tb_m"]) // int(r["warp_m"]))
                * (int(r["tb_n"]) // int(r["warp_n"])),
            )
            for r in csv.DictReader(f)
            if r["case"] == "case1"
        ]


def _xgemm_rows(gpu: str) -> list[GemmWsMeasurement]:
    best: dict[tuple[int, int, int], float] = {}
    with open(XGEMM, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["gpu"] != gpu:
                continue
            key = (int(r["MWG"]), int(r["NWG"]), int(r["KWG"]))
            best[key] = min(best.get(key, float("inf")), float(r["time_ms"]) * 1000)
    return [
        GemmWsMeasurement(4096, 4096, 4096, "fp32", tm, tn, tk, 1, y)
        for (tm, tn, tk), y in sorted(best.items())
    ]


def _xgemm_rho(model: str, gpu: str, splits: int) -> tuple[int, float]:
    profile_id, sm_count, limits = XGEMM_GPUS[gpu]
    device = _device(profile_id, sm_count, limits)
    rows = _xgemm_rows(gpu)
    rhos = []
    for seed in range(splits):
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        train, test = [rows[i] for i in order[:8]], [rows[i] for i in order[8:]]
        machine = device.fit(model, train, seed)
        predicted = [device.predict(model, machine, r) for r in test]
        rhos.append(_spearman(predicted, [r.measured_time_us for r in test]))
    return len(rows), statistics.median(rhos)


def _score(
    model: str, rows: list[GemmWsMeasurement], splits: int
) -> tuple[float, int, list[float]]:
    device = _device("rtx-a6000", SM_COUNT)
    errors, hits, rhos = [], 0, []
    best = min(r.measured_time_us for r in rows)
    for seed in range(splits):
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        train = [rows[i] for i in order[: len(rows) // 2]]
        test = [rows[i] for i in order[len(rows) // 2 :]]
        machine = device.fit(model, train, seed)

        def predict(run: GemmWsMeasurement, machine: GemmWsMachine = machine) -> float:
            return device.predict(model, machine, run)

        errors += [abs(predict(r) / r.measured_time_us - 1) for r in test]
        top5 = sorted(rows, key=predict)[:5]
        hits += any(r.measured_time_us <= 1.03 * best for r in top5)
        rhos.append(_spearman([predict(r) for r in test], [r.measured_time_us for r in test]))
    return statistics.median(errors), hits, rhos


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
    for model in MODELS:
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
