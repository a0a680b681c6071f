"""/predict-kernel against real timings of a tuned kernel: the dedispersion brute-force caches.

Usage: python -m bench.bench_real_kernels [--per-gpu 150] [--seed 20251127] [--calibrate 8]
           [--gpus A100,A6000,A4000] [--cache-dir DIR] [--record] [--residuals]

Data: ``../shared/data/real-kernels/dedispersion/`` (read in place, never copied; PROVENANCE.md
there): Kernel Tuner brute-force caches of one dedispersion kernel on an A100-PCIE-40GB, an RTX
A6000 and an RTX A4000, 11,130 configurations each, mean of 32 launches, clocks not locked.
H100: this project's own timings of 449 of those configurations on an H100 SXM
(``bench/h100/run4``, median of 5 launches; bench/h100/README.md), an outside check of the
sm_90 profile, not one of the shared datasets.

Per GPU, a seeded sample of ``--per-gpu`` configurations is built to PTX as Kernel Tuner built
it (kperf_client.ptx_build: prefixed defines, the channel-loop pragma removed, nvcc -ptx for
the GPU's arch; registers per thread from ptxas -v; cached in ``--cache-dir``) and predicted
on the GPU's profile (perfmodel.manybsp.predict_kernel, the /predict-kernel core) at the
profile's clock. Reported: Spearman's rank correlation of predicted and measured times, and
the median, mean and p90 of |predicted - measured| / measured, uncalibrated and after the MAP
calibration (perfmodel.calibration.many_bsp.fit_many_bsp) on ``--calibrate`` configurations of
the sample (seeded), evaluated on the rest. A GPU's measured times are converted to cycles at
the profile's clock for the fit, as /calibrate does with a clock, and fitted under the priors
the profile cites, as /calibrate fits.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scipy.stats import spearmanr

from bench.common import command_line, record_results
from device_profiles.loader import PROFILE_DIR, load_profile_file
from device_profiles.priors import many_bsp_priors
from kperf_client.ptx_build import PtxBuilder
from perfmodel.calibration.many_bsp import apply_many_bsp, fit_many_bsp
from perfmodel.calibration.records import ManyBspMeasurement
from perfmodel.manybsp import DeviceFigures, PredictRequest, device_from_profile, predict_kernel

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "real-kernels" / "dedispersion"
KERNEL = "dedispersion_kernel"
#: GPU -> (CSV file, profile id, nvcc arch); the H100 rows are this project's own timings of
#: 449 of the configurations on a lent H100 SXM (bench/h100/README.md, run4: 5 launches each)
GPUS: dict[str, tuple[Path, str, str]] = {
    "A100": (DATA / "dedispersion_A100.csv", "a100", "sm_80"),
    "A6000": (DATA / "dedispersion_A6000.csv", "rtx-a6000", "sm_86"),
    "A4000": (DATA / "dedispersion_A4000.csv", "rtx-a4000", "sm_86"),
    "H100": (REPO / "bench/h100/run4/dedispersion_h100.csv", "h100", "sm_90"),
}
TUNABLES = (
    "block_size_x",
    "block_size_y",
    "block_size_z",
    "tile_size_x",
    "tile_size_y",
    "tile_stride_x",
    "tile_stride_y",
    "loop_unroll_factor_channel",
)


@dataclass(frozen=True)
class Row:
    params: dict[str, int]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    measured_ms: float


@dataclass(frozen=True)
class Metrics:
    n: int
    spearman: float
    median: float
    mean: float
    p90: float
    ratio: float  #: median of predicted / measured

    def cells(self) -> str:
        return (
            f"{self.n} | {self.spearman:.3f} | {100 * self.median:.1f} % | "
            f"{100 * self.mean:.1f} % | {100 * self.p90:.1f} % | {self.ratio:.2f}"
        )


def read_rows(path: Path) -> list[Row]:
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            rows.append(
                Row(
                    params={k: int(r[k]) for k in TUNABLES},
                    grid=(int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"])),
                    block=(int(r["block_x"]), int(r["block_y"]), int(r["block_z"])),
                    measured_ms=float(r["time_ms"]),
                )
            )
    return rows


def metrics(predicted: Sequence[float], measured: Sequence[float]) -> Metrics:
    errors = sorted(abs(p - m) / m for p, m in zip(predicted, measured, strict=True))
    rho = float(spearmanr(predicted, measured).statistic)
    ratios = [p / m for p, m in zip(predicted, measured, strict=True)]
    p90 = errors[min(len(errors) - 1, math.ceil(0.9 * len(errors)) - 1)]
    return Metrics(
        len(errors),
        rho,
        statistics.median(errors),
        statistics.fmean(errors),
        p90,
        statistics.median(ratios),
    )


def request_for(row: Row, builder: PtxBuilder, figures: DeviceFigures) -> PredictRequest:
    built = builder.build(row.params, row.grid, row.block)
    regs = built.resources.registers_per_thread if built.resources else None
    return PredictRequest(
        ptx=built.ptx,
        device=figures,
        grid=row.grid,
        block=row.block,
        kernel=KERNEL,
        registers_per_thread=regs,
    )


def residuals_by_tunable(sample: Sequence[Row], predicted_ms: Sequence[float]) -> list[str]:
    """Per tunable and value: the median of r = ln(predicted / measured) over the sample's
    configurations with that value, centred on the median r of all (a value whose effect the
    model misses stands out; block_size_y in bins of 64)."""
    r = [math.log(p / row.measured_ms) for row, p in zip(sample, predicted_ms, strict=True)]
    centre = statistics.median(r)
    lines = []
    for name in TUNABLES:
        groups: dict[int, list[float]] = {}
        for row, v in zip(sample, r, strict=True):
            value = row.params[name]
            key = value // 64 * 64 if name == "block_size_y" else value
            groups.setdefault(key, []).append(v - centre)
        if len(groups) > 1:
            cells = ", ".join(
                f"{k}: {statistics.median(g):+.3f} ({len(g)})" for k, g in sorted(groups.items())
            )
            lines.append(f"{name}: {cells}")
    return lines


def run_gpu(
    gpu: str, per_gpu: int, seed: int, n_calibrate: int, cache_dir: Path, residuals: bool = False
) -> tuple[Metrics, Metrics | None, float]:
    csv_path, profile_id, arch = GPUS[gpu]
    rows = read_rows(csv_path)
    sample = random.Random(f"{seed}:{gpu}").sample(rows, min(per_gpu, len(rows)))
    profile = load_profile_file(PROFILE_DIR / f"{profile_id}.json")
    figures = device_from_profile(profile)
    clock = figures.clock_mhz
    assert clock is not None
    builder = PtxBuilder(DATA / "dedispersion.cu", arch=arch, kernel=KERNEL, cache_dir=cache_dir)
    started = time.perf_counter()
    requests = [request_for(r, builder, figures) for r in sample]
    predicted_ms = [predict_kernel(q).estimate.kernel_exec_cycle / clock / 1e3 for q in requests]
    seconds = time.perf_counter() - started
    measured = [r.measured_ms for r in sample]
    uncalibrated = metrics(predicted_ms, measured)
    if residuals:
        for line in residuals_by_tunable(sample, predicted_ms):
            print(f"{gpu} residual ln(pred/meas) by {line}", flush=True)
    if n_calibrate <= 0 or n_calibrate >= len(sample):
        return uncalibrated, None, seconds
    chosen = set(random.Random(f"{seed}:{gpu}:calibrate").sample(range(len(sample)), n_calibrate))
    runs = [
        ManyBspMeasurement(requests[i], measured[i] * 1e3 * clock)  # ms -> cycles at the clock
        for i in sorted(chosen)
    ]
    # the priors the profile cites, as POST /calibrate fits
    priors = many_bsp_priors(profile)
    fit = fit_many_bsp(figures, runs, folds=min(5, n_calibrate), seed=seed, priors=priors)
    calibrated = apply_many_bsp(figures, fit)
    rest = [i for i in range(len(sample)) if i not in chosen]
    predicted_rest = [
        predict_kernel(
            dataclasses.replace(requests[i], device=calibrated)
        ).estimate.kernel_exec_cycle
        / clock
        / 1e3
        for i in rest
    ]
    return uncalibrated, metrics(predicted_rest, [measured[i] for i in rest]), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-gpu", type=int, default=150)
    parser.add_argument("--seed", type=int, default=20251127)
    parser.add_argument("--calibrate", type=int, default=8)
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument(
        "--cache-dir", type=Path, default=Path.home() / ".cache" / "kperf" / "ptx-dedispersion"
    )
    parser.add_argument(
        "--record", action="store_true", help="replace its section of bench/RESULTS.md"
    )
    parser.add_argument(
        "--residuals",
        action="store_true",
        help="print the uncalibrated residuals' medians by tunable value",
    )
    args = parser.parse_args()
    lines = [
        "| GPU | profile | n | Spearman | median err | mean err | p90 err | pred/meas |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for gpu in args.gpus.split(","):
        unc, cal, seconds = run_gpu(
            gpu, args.per_gpu, args.seed, args.calibrate, args.cache_dir, args.residuals
        )
        profile = GPUS[gpu][1]
        lines.append(f"| {gpu} uncalibrated | {profile} | {unc.cells()} |")
        if cal is not None:
            lines.append(f"| {gpu} calibrated on {args.calibrate} | {profile} | {cal.cells()} |")
        print(lines[-2] if cal is not None else "", lines[-1], f"({seconds:.0f} s)", flush=True)
    table = "\n".join(lines)
    print(table)
    if args.record:
        record_results(
            "Many-BSP on real kernels",
            command_line(),
            table,
            "Dedispersion on A100, RTX A6000, RTX A4000 and our H100",
        )


if __name__ == "__main__":
    main()
