"""Why the uncalibrated h100 optimum is slow on real bf16 GEMMs: its stage breakdown, figures
measured on the lent H100 (bench/h100/), and each suspect figure changed alone and together.

Usage: python -m bench.bench_h100_breakdown [--every N]

Prediction as perfmodel.calibration.configless: the configuration-less optimum of
``memory_model_device(get_profile("h100"), dtype)`` over the default space, no calibration.
Measured: bench/h100/run1/torch_matmul.csv (per-launch time of CUDA-graph replays, warm L2),
bench/h100/run7/kernels.csv (CUPTI device time of the same calls' kernels) and XLA's sm_90 table
(../shared/data/real-gemm/xla_sm90_tf32: a kernel tracer's median kernel time, tf32).

Figures derived here from our own measurements (docs/model-notes.md, "H100 bf16"):
- launch gap: run1's per-launch time minus run7's kernel time, median over a dtype's shapes;
- L2 bandwidth under a GEMM's loads: for one Triton tiling (bench/h100/run2 and run3
  triton_sweep.csv) at two k of the same m x n, the extra bytes its CTAs request over the
  extra time (fixed costs cancel); per pair of shapes the fifth-largest over tilings (a
  plateau, not one lucky tiling), then the median over pairs and runs;
- SM clock under a long bf16 GEMM: run6/clock.txt readings above 600 W.
``--every N`` predicts every N-th shape only (a quicker, rougher run).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.bench_h100_triton import read_sweep
from bench.common import command_line
from device_profiles import get_profile
from device_profiles.memory import memory_model_device
from perfmodel.calibration.configless import Device, LibraryRun, RunModel
from perfmodel.gemm_ws_memory_model import kernel_times

H100 = Path(__file__).resolve().parent / "h100"
XLA = (
    Path(__file__).resolve().parents[2] / "shared/data/real-gemm/xla_sm90_tf32/matmul_f32_sm90.csv"
)
Shape = tuple[int, int, int, int]  # b, m, n, k
#: shapes whose stage breakdown is printed (the finding's sizes, ~3 us to ~700 us in bf16)
BREAKDOWN: tuple[Shape, ...] = (
    (1, 256, 256, 256),
    (1, 1024, 1024, 1024),
    (1, 1024, 1024, 4096),
    (1, 2048, 2048, 2048),
    (1, 4096, 4096, 4096),
    (4, 4096, 4096, 4096),
)
#: bf16 per-launch time buckets (us) of the error by size
BUCKETS = (0.0, 4.5, 12.0, 50.0, 200.0, float("inf"))
#: (m, n, k1, k2) of the Triton sweep with one tiling at two k
TRITON_PAIRS = (
    (1024, 1024, 1024, 4096),
    (2048, 2048, 512, 4096),
    (4096, 4096, 256, 1024),
    (4096, 4096, 1024, 4096),
)
PLATEAU_RANK = 5
#: NVIDIA H100 Tensor Core GPU datasheet: H100 SXM dense FP16/BF16 tensor 989.4 TFLOPS (the
#: profile's compute prior is three quarters of it)
H100_DENSE_FP16_FLOPS = 989.4e12
PROFILE_MATH_FRACTION = 0.75
LARGEST: Shape = (4, 4096, 4096, 4096)


def _times(
    path: Path, key: str, dtype_column: str | None = "dtype"
) -> dict[tuple[str, Shape], float]:
    with open(path, encoding="utf-8") as f:
        return {
            (
                r[dtype_column] if dtype_column else "tf32",
                (int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"])),
            ): float(r[key])
            for r in csv.DictReader(f)
        }


def launch_gap_us() -> dict[str, float]:
    """Median per-launch (run1) minus kernel (run7) time per dtype."""
    launch = _times(H100 / "run1/torch_matmul.csv", "median_us")
    kernel = _times(H100 / "run7/kernels.csv", "kernel_us")
    out = {}
    for dtype in ("bf16", "tf32", "fp32"):
        gaps = [launch[key] - kernel[key] for key in kernel if key[0] == dtype]
        out[dtype] = statistics.median(gaps)
    return out


def l2_marginal_gb_per_s() -> tuple[float, list[str]]:
    """The L2 bandwidth a GEMM's loads reach (module docstring) and one line per pair."""
    lines, plateaus = [], []
    for run in ("run2", "run3"):
        shapes = read_sweep(H100 / run / "triton_sweep.csv")["bf16"]
        for m, n, k1, k2 in TRITON_PAIRS:
            # one tiling (configuration and warps) at both k
            longer = {(r.config, r.threads_per_cta): r for r in shapes[(m, n, k2)]}
            rates = []
            for short in shapes[(m, n, k1)]:
                long = longer.get((short.config, short.threads_per_cta))
                if short.config is None or long is None:
                    continue
                tm, tn, tk = short.config[:3]
                ctas = -(-m // tm) * -(-n // tn)

                def requested(
                    k: int, tm: int = tm, tn: int = tn, tk: int = tk, ctas: int = ctas
                ) -> int:
                    return ctas * (tm + tn) * (-(-k // tk) * tk) * 2  # bf16: 2 bytes

                extra_us = long.measured_time_us - short.measured_time_us
                if extra_us > 0:
                    rates.append((requested(k2) - requested(k1)) / extra_us / 1e3)
            rates.sort(reverse=True)
            plateau = rates[PLATEAU_RANK - 1]
            plateaus.append(plateau)
            lines.append(
                f"| {run} | {m} x {n}, k {k1} -> {k2} | {len(rates)} | {rates[0]:.0f} "
                f"| {plateau:.0f} |"
            )
    return statistics.median(plateaus), lines


def sustained_clock_mhz() -> float:
    """Median SM clock of run6's readings above 600 W (a long bf16 GEMM at the power cap)."""
    clocks = []
    for line in (H100 / "run6/clock.txt").read_text(encoding="utf-8").splitlines():
        found = re.search(r", (\d+) MHz, ([\d.]+) W", line)
        if found and float(found.group(2)) > 600:
            clocks.append(float(found.group(1)))
    return statistics.median(clocks)


@dataclass(frozen=True)
class Variant:
    label: str
    t_init_us: float | None = None
    #: the L2 bandwidth the GEMM sees (GB/s), whatever the clock ratio
    l2_effective_gb_per_s: float | None = None
    clock_ratio: float | None = None
    #: the tensor-core MATH figure times this (bf16 and tf32: the profile's tf32 ratio stays;
    #: fp32's FFMA figure is untouched)
    math_scale: float = 1.0


def achieved_math_fraction() -> float:
    """The largest bf16 product's kernel rate (run7, CUPTI) over the data sheet's dense rate:
    a lower bound on the fraction of peak the MMAs run at while a CTA computes (the wave
    tail, the fixed costs and the epilogue only lower the whole kernel's rate)."""
    kernel = _times(H100 / "run7/kernels.csv", "kernel_us")
    b, m, n, k = LARGEST
    return 2.0 * b * m * n * k / (kernel[("bf16", LARGEST)] * 1e-6) / H100_DENSE_FP16_FLOPS


def device_for(dtype: str, v: Variant) -> Device:
    """The h100 device for ``dtype`` with the variant's figures replaced."""
    device = memory_model_device(get_profile("h100"), dtype)
    base, mem = device.base, device.base.memory
    ratio = mem.sm_clock_ratio if v.clock_ratio is None or dtype == "fp32" else v.clock_ratio
    l2 = (
        mem.l2_bandwidth_gb_per_s
        if v.l2_effective_gb_per_s is None
        else v.l2_effective_gb_per_s / ratio
    )
    t_init = base.t_init_us if v.t_init_us is None else v.t_init_us
    memory = dataclasses.replace(mem, l2_bandwidth_gb_per_s=l2, sm_clock_ratio=ratio)
    figures = dataclasses.replace(
        base,
        compute_throughput_macs_per_us=base.compute_throughput_macs_per_us
        * (1.0 if dtype == "fp32" else v.math_scale),
        t_init_us=t_init,
        reduction_overhead_us=t_init,  # the reduction's fixed cost is its launch
        memory=memory,
        shared_memory_bytes_per_us=base.shared_memory_bytes_per_us / mem.sm_clock_ratio * ratio,
    )
    return dataclasses.replace(device, base=figures)


def predict(dtype: str, shapes: Sequence[Shape], device: Device) -> np.ndarray:
    out = []
    for b, m, n, k in shapes:
        run = LibraryRun(m, n, k, dtype, 1.0, b)
        out.append(RunModel(run, device, 0).predict_us(device.base))
    return np.array(out)


def _summary(ratios: np.ndarray) -> str:
    err = np.abs(ratios - 1)
    off = np.mean((ratios > 2) | (ratios < 0.5)) * 100
    return f"{np.median(err) * 100:.1f} % / x{np.median(ratios):.2f} / {off:.0f} %"


def breakdown(dtype: str, device: Device, measured: dict[tuple[str, Shape], float]) -> list[str]:
    kernel = _times(H100 / "run7/kernels.csv", "kernel_us")
    lines = []
    f = device.base
    for shape in BREAKDOWN:
        b, m, n, k = shape
        model = RunModel(LibraryRun(m, n, k, dtype, 1.0, b), device, 0).optimum(f)
        st, traffic = model.stage_times_us(f)
        total = float(kernel_times(st)[0][0])
        s = model.space
        config = (
            f"{s.tile_m[0]}x{s.tile_n[0]}x{s.tile_k[0]} D{s.buffer_depth[0]} g{s.group_m[0]} "
            f"s{s.split_k[0]}, {st.ctas[0]} CTAs, {st.ctas_per_sm[0]}/SM"
        )
        stores = float(st.store_per_cta[0]) * min(int(st.ctas[0]), device.sm_count)
        lines.append(
            f"| {dtype} | {b}x{m}x{n}x{k} | {measured[(dtype, shape)]:.2f} "
            f"| {kernel[(dtype, shape)]:.2f} | {total:.2f} | {config} | {st.stages[0]} "
            f"| {st.fixed[0]:.2f} | {st.issue[0]:.3f} | {st.latency[0]:.3f} | {st.math[0]:.3f} "
            f"| {st.epilogue[0] + st.epilogue_per_cta[0]:.2f} | {stores:.2f} "
            f"| {traffic.l2_hit_rate[0]:.2f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=1, help="predict every N-th shape only")
    args = parser.parse_args(argv)
    if not XLA.exists():
        print(f"skipped: {XLA} absent")
        return
    print(f"command: {command_line()}\n")

    gap = launch_gap_us()
    l2, l2_lines = l2_marginal_gb_per_s()
    clock = sustained_clock_mhz()
    math_fraction = achieved_math_fraction()
    print("Measured on the H100 (bench/h100/):\n")
    print(
        "- launch gap, run1 per-launch minus run7 kernel time, median: "
        + ", ".join(f"{d} {v:.2f} us" for d, v in gap.items())
    )
    print(f"- SM clock under a long bf16 GEMM at the power cap (run6): {clock:.0f} MHz")
    print(
        f"- MATH: the {'x'.join(map(str, LARGEST))} bf16 kernel runs at "
        f"{math_fraction * 100:.1f} % of the data sheet's 989.4 TFLOPS (profile: 75 %)"
    )
    print(f"- L2 bandwidth under a GEMM's loads (Triton slopes): {l2:.0f} GB/s\n")
    print("| run | shapes | tilings | largest GB/s | 5th largest GB/s |")
    print("|---|---|---|---|---|")
    print("\n".join(l2_lines))

    measured = _times(H100 / "run1/torch_matmul.csv", "median_us")
    kernel = _times(H100 / "run7/kernels.csv", "kernel_us")
    xla = _times(XLA, "time_us", dtype_column=None)
    shapes = sorted({s for _, s in measured})[:: args.every]

    print("\nStage breakdown of the uncalibrated optimum (profile as shipped; us):\n")
    print(
        "| dtype | b x m x n x k | per launch | kernel (CUPTI) | predicted | configuration "
        "| stages | fixed | issue | latency | MATH | epilogue | C stores | L2 hit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = Variant("profile as shipped")
    for dtype in ("bf16", "tf32"):
        print("\n".join(breakdown(dtype, device_for(dtype, base), measured)), flush=True)

    variants = (
        base,
        Variant(f"T_INIT = bf16 launch gap {gap['bf16']:.2f} us", t_init_us=gap["bf16"]),
        Variant(f"L2 = {l2:.0f} GB/s", l2_effective_gb_per_s=l2),
        Variant("tensor clock = clock_mhz (ratio 1)", clock_ratio=1.0),
        Variant("T_INIT gap + L2", t_init_us=gap["bf16"], l2_effective_gb_per_s=l2),
        Variant(
            "T_INIT gap + L2 + ratio 1",
            t_init_us=gap["bf16"],
            l2_effective_gb_per_s=l2,
            clock_ratio=1.0,
        ),
        Variant(
            f"T_INIT gap + L2 + MATH {math_fraction * 100:.0f} % of peak",
            t_init_us=gap["bf16"],
            l2_effective_gb_per_s=l2,
            math_scale=math_fraction / PROFILE_MATH_FRACTION,
        ),
    )
    print(
        f"\nUncalibrated optimum vs measured, {len(shapes)} shapes each: median |error| / "
        "median predicted:measured / share off by 2x\n"
    )
    header = "| figures | torch bf16 | torch tf32 | torch fp32 | XLA tf32 |"
    buckets = " | ".join(
        f"bf16 {lo:g}-{hi:g} us: ratio (n)" for lo, hi in zip(BUCKETS, BUCKETS[1:], strict=False)
    )
    print(f"{header} {buckets} |")
    print("|---" * (5 + len(BUCKETS) - 1) + "|")
    for v in variants:
        cells = []
        preds: dict[str, np.ndarray] = {}
        for dtype in ("bf16", "tf32", "fp32"):
            preds[dtype] = predict(dtype, shapes, device_for(dtype, v))
            truth = np.array([measured[(dtype, s)] for s in shapes])
            cells.append(_summary(preds[dtype] / truth))
        truth_xla = np.array([xla[("tf32", s)] for s in shapes])
        cells.append(_summary(preds["tf32"] / truth_xla))
        bf16 = np.array([measured[("bf16", s)] for s in shapes])
        ratio = preds["bf16"] / bf16
        parts = []
        for lo, hi in zip(BUCKETS, BUCKETS[1:], strict=False):
            keep = (bf16 >= lo) & (bf16 < hi)
            parts.append(
                f"x{np.median(ratio[keep]):.2f} ({int(keep.sum())})" if keep.any() else "-"
            )
        by_size = " | ".join(parts)
        print(f"| {v.label} | " + " | ".join(cells) + f" | {by_size} |", flush=True)

    print("\nKernel time (CUPTI, run7) against the same predictions (T_INIT as in each row):\n")
    print("| figures | bf16 kernels | tf32 kernels |")
    print("|---|---|---|")
    for v in (base, Variant("T_INIT 0", t_init_us=0.0)):
        cells = []
        for dtype in ("bf16", "tf32"):
            p = predict(dtype, shapes, device_for(dtype, v))
            cells.append(_summary(p / np.array([kernel[(dtype, s)] for s in shapes])))
        print(f"| {v.label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
