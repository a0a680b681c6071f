"""How close to real GPUs: the L2-aware GeMM-WS model on every public dataset in
../shared/data/real-gemm/, beside NVIDIA's nvMatmulHeuristics where it predicts times.

Usage: python -m bench.bench_real [--seed 0] [--other-seeds 1,2] [--neusight-test 1000] [--svg PATH]

Per dataset and GPU (profile, SMs, dtype as each dataset's PROVENANCE.md reads):
- uncalibrated: the profile's cited figures (memory section, gemm_ws MATH for the dtype);
  a run without a configuration is predicted as the model's optimum over the default space
  (tiles 16-256, depths 2-8, group_m {1, 8}, split_k {1, 2, 4, 8, 16}), a run with one as
  that configuration's time;
- calibrated: perfmodel.calibration.configless.fit on 16 seeded random runs (8 where the
  dataset has fewer than 32), error on the others (NeuSight: 1,000 others); the same again
  for each of ``--other-seeds``' draws (is the figure luck of one draw?);
- nvMatmulHeuristics: ``get(problem, 1, precision)`` runtime of its top configuration, the
  CUTLASS target (TF32: "TST", SGEMM: "SSS"), on the GPUs it knows.

Errors are |predicted / measured - 1|. Datasets:
- xla_sm90_tf32: 375 shapes (b in {1,2,4}), XLA's fastest kernel, tf32, no configuration:
  profile h100, nvMMH H100_SXM.
- h100_torch_{tf32,bf16,fp32}: the same 375 shapes through torch.matmul (cuBLAS) on the H100
  SXM lent to this project (bench/h100/run1, our own measurement, not ../shared): profile
  h100, nvMMH H100_SXM (TST, BSB, SSS).
- neusight_linear_train: cuBLAS fp32 (FFMA) per GPU, configuration from the kernel name (tile
  from ``*_sgemm_AxB_*``: tile_n A, tile_m B, tile_k 8, depth 2, split_k = grid_z, group_m 1;
  threads per CTA = block_x, which bounds the CTAs resident per SM); PyTorch calls timed with
  CUDA events, so fitted with the framework floor, and split-K whose partial sums exceed
  PyTorch 2.1's 1 MiB cuBLASLt workspace reduced serially in the kernel
  (perfmodel.calibration.harness; ``--kernel-times``: neither, the model before them):
  a100 (A100-PCIE-40GB, nvMMH A100_PCIE_80GB), v100, p100 (PCIe parts: profiles' figures).
  Uncalibrated optimum vs measured on 200 seeded shapes per GPU (configuration left out).
- cutlass_tf32_rtx3090: 36 configurations at 8192^3, tf32, rtx-a6000 figures on 82 SMs,
  nvMMH RTX_3090 (its best vs the measured best).
- kt_xgemm_sgemm4096: fp32 4096^3, best time per (MWG, NWG, KWG) tile, depth 1: a100 on the
  A100, rtx-a6000 on the RTX 3090 / 2080 Ti / TITAN RTX (their SMs).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import itertools
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common import command_line
from device_profiles import get_profile
from device_profiles.memory import memory_model_device
from perfmodel.calibration.configless import Device, FitResult, LibraryRun, RunModel, fit
from perfmodel.gemm_ws import SmLimits

DATA = Path(__file__).resolve().parents[2] / "shared/data/real-gemm"
TRAIN = 16


@dataclass
class Case:
    dataset: str
    gpu: str
    device: Device
    runs: list[LibraryRun]
    #: indices of runs predicted uncalibrated (all by default)
    uncalibrated: list[int] | None = None
    nvmmh: Callable[[LibraryRun], float] | None = None
    #: (label, run predicate) of extra error rows (NeuSight: split-K shapes)
    subsets: tuple[tuple[str, Callable[[int], bool]], ...] = ()
    train: int = TRAIN
    test: int | None = None
    #: measured-best comparison instead of per-run errors (one shape, many configurations)
    best_only: bool = False
    #: the runs are framework calls timed with CUDA events: fitted with a floor
    framework_floor: bool = False


def _nvmmh(gpu: str, precision: str) -> Callable[[LibraryRun], float] | None:
    try:
        import nvMatmulHeuristics as nv
    except ImportError:
        return None
    heuristics = nv.NvMatmulHeuristicsInterfaceEx(
        backend=nv.NvMatmulHeuristicsTarget.CUTLASS,
        gpu=getattr(nv.NvMatmulHeuristicsNvidiaGpu, gpu),
    )
    layout = nv.NvMatmulHeuristicsMatmulLayout.NN_ROW_MAJOR

    def predict(run: LibraryRun) -> float:
        problem = heuristics.makeNvMatmulHeuristicsProblem(run.m, run.n, run.k, layout, run.batch)
        return float(heuristics.get(problem, 1, precision=precision)[0]["runtime"]) * 1e6

    return predict


def xla() -> Case:
    with open(DATA / "xla_sm90_tf32/matmul_f32_sm90.csv", encoding="utf-8") as f:
        runs = [
            LibraryRun(
                int(r["m"]), int(r["n"]), int(r["k"]), "tf32", float(r["time_us"]), int(r["b"])
            )
            for r in csv.DictReader(f)
        ]
    device = memory_model_device(get_profile("h100"), "tf32")
    return Case("xla_sm90_tf32", "H100 (sm_90)", device, runs, nvmmh=_nvmmh("H100_SXM", "TST"))


#: this project's own H100 SXM timings (bench/h100/README.md): torch.matmul over the XLA shapes
H100_TORCH = Path(__file__).resolve().parent / "h100/run1/torch_matmul.csv"
#: torch dtype -> nvMatmulHeuristics precision (inputs, compute, output)
H100_PRECISION = {"tf32": "TST", "bf16": "BSB", "fp32": "SSS"}


def h100_torch(dtype: str) -> Case:
    """torch.matmul (cuBLAS's pick) on the lent H100 SXM, one dtype, no configuration."""
    with open(H100_TORCH, encoding="utf-8") as f:
        runs = [
            LibraryRun(
                int(r["m"]), int(r["n"]), int(r["k"]), dtype, float(r["median_us"]), int(r["b"])
            )
            for r in csv.DictReader(f)
            if r["dtype"] == dtype
        ]
    device = memory_model_device(get_profile("h100"), dtype)
    nvmmh = _nvmmh("H100_SXM", H100_PRECISION[dtype])
    return Case(f"h100_torch_{dtype}", "H100 SXM (ours)", device, runs, nvmmh=nvmmh)


#: PyTorch 2.1's cuBLASLt workspace (pytorch/pytorch pull requests 73439, 2022: 1 MiB; 101145,
#: 2023: still the compile-time default, made settable; 120925, 2024: 4 MiB from PyTorch 2.3):
#: split-K whose fp32 partial sums fit it runs a reduction kernel, else cuBLAS reduces in the
#: GEMM kernel (NeuSight's kernel lists: splitKreduce_kernel launched on 1,348 of the 1,405
#: split-K runs within 1 MiB, on none of the 4,951 beyond it)
LT_WORKSPACE_BYTES = 1 << 20

#: NeuSight GPU -> (profile, nvMMH GPU)
NEUSIGHT = {
    "NVIDIA A100-PCIE-40GB": ("a100", "A100_PCIE_80GB"),
    "Tesla V100-PCIE-32GB": ("v100", None),
    "Tesla P100-PCIE-16GB": ("p100", None),
}


def neusight(gpu: str, seed: int, test: int, harness: bool = True, serial: bool = True) -> Case:
    """The NeuSight runs of ``gpu``; ``harness`` False: fitted as kernel times (no framework
    floor), ``serial`` False: every split-K run with a reduction kernel (the model before the
    harness terms, for the ablation rows)."""
    profile_id, nv_gpu = NEUSIGHT[gpu]
    runs, split = [], []
    with open(DATA / "neusight_linear_train/linear_fp32_cublas_train.csv", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["device"] != gpu:
                continue
            tile = re.search(r"_sgemm_(\d+)x(\d+)_", r["kernel"])
            if tile is None:
                continue
            z = int(r["grid_z"])
            m, n = int(r["m"]), int(r["n"])
            config = (int(tile.group(2)), int(tile.group(1)), 8, 2, 1, z)
            runs.append(
                LibraryRun(
                    m,
                    n,
                    int(r["k"]),
                    "fp32",
                    float(r["latency_ms"]) * 1e3,
                    config=config,
                    threads_per_cta=int(r["block_x"]),
                    serial_split_k=serial and z > 1 and z * m * n * 4 > LT_WORKSPACE_BYTES,
                )
            )
            split.append(z > 1)
    device = memory_model_device(get_profile(profile_id), "fp32")
    sample = random.Random(seed).sample(range(len(runs)), 200)
    return Case(
        "neusight_linear_train",
        gpu,
        device,
        runs,
        uncalibrated=sample,
        nvmmh=_nvmmh(nv_gpu, "SSS") if nv_gpu else None,
        subsets=(("grid_z > 1", lambda i: split[i]),),
        test=test,
        framework_floor=harness,
    )


def cutlass() -> Case:
    runs = []
    with open(DATA / "cutlass_tf32_rtx3090/multisize_results.csv", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["case"] != "case1":
                continue
            config = (int(r["tb_m"]), int(r["tb_n"]), int(r["tb_k"]), int(r["stages"]), 1, 1)
            runs.append(
                LibraryRun(8192, 8192, 8192, "tf32", float(r["mean_time_ms"]) * 1e3, config=config)
            )
    # RTX 3090: 82 SMs; CC 8.6 limits as the rtx-a6000's (bench_pipeline_real.py)
    device = memory_model_device(
        get_profile("rtx-a6000"), "tf32", sm_count=82, compute_throughput_macs_per_us=A6000_MATH
    )
    return Case(
        "cutlass_tf32_rtx3090",
        "RTX 3090",
        device,
        runs,
        nvmmh=_nvmmh("RTX_3090", "TST"),
        train=8,
        best_only=True,
    )


#: Xgemm GPU -> (profile, SMs, limits) as bench_pipeline_real.py
XGEMM = {
    "A100": ("a100", 108, SmLimits(32, 167936)),
    "RTX_3090": ("rtx-a6000", 82, SmLimits(16, 102400)),
    "RTX_2080_Ti": ("rtx-a6000", 68, SmLimits(16, 65536)),
    "RTX_Titan": ("rtx-a6000", 72, SmLimits(16, 65536)),
}


#: the rtx-a6000 profile's MATH figure is the paper's kernel (2.7 % of peak); the GA102's
#: hardware rate in the other profiles' convention: three quarters of the NVIDIA RTX A6000
#: datasheet's dense FP16 tensor rate, 154.8 TFLOPS / 2 / 84 SMs, in MACs per us per SM
A6000_MATH = 0.75 * 154.8e12 / 2 / 84 / 1e6


def xgemm(gpu: str) -> Case:
    best: dict[tuple[int, int, int], float] = {}
    with open(DATA / "kt_xgemm_sgemm4096/xgemm_sgemm4096_all.csv", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["gpu"] == gpu:
                key = (int(r["MWG"]), int(r["NWG"]), int(r["KWG"]))
                best[key] = min(best.get(key, float("inf")), float(r["time_ms"]) * 1e3)
    runs = [
        LibraryRun(4096, 4096, 4096, "fp32", y, config=(tm, tn, tk, 1, 1, 1))
        for (tm, tn, tk), y in sorted(best.items())
    ]
    profile_id, sms, limits = XGEMM[gpu]
    math = A6000_MATH if profile_id == "rtx-a6000" else None
    device = memory_model_device(
        get_profile(profile_id),
        "fp32",
        sm_count=sms,
        limits=limits,
        compute_throughput_macs_per_us=math,
    )
    device = dataclasses.replace(device, shared_memory_per_block_bytes=None)
    train = TRAIN if len(runs) >= 2 * TRAIN else len(runs) // 2
    return Case("kt_xgemm_sgemm4096", gpu, device, runs, train=train, best_only=True)


def _stats(errors: Sequence[float]) -> str:
    if not errors:
        return "-"
    a = np.abs(np.asarray(errors))
    return f"{np.median(a) * 100:.1f} % / {np.percentile(a, 90) * 100:.1f} %"


def _worst(ratios: Sequence[float]) -> str:
    worst = max(max(r, 1 / r) for r in ratios)
    over = sum(max(r, 1 / r) >= 2 for r in ratios)
    return f"{worst:.2f}x ({over} >= 2x)"


def _calibrated(case: Case, seed: int) -> tuple[list[int], list[float], FitResult, float]:
    """(held-out run indices, their errors after the fit, the fit, its seconds) of the fit
    on ``case.train`` runs drawn with ``seed``."""
    runs = case.runs
    order = list(range(len(runs)))
    random.Random(seed).shuffle(order)
    train = [runs[i] for i in order[: case.train]]
    test_ids = order[case.train :][: case.test] if case.test else order[case.train :]
    started = time.perf_counter()
    result = fit(train, case.device, framework_floor=case.framework_floor)
    fit_s = time.perf_counter() - started
    errors = [
        RunModel(runs[i], case.device, i).predict_us(result.figures, result.harness)
        / runs[i].measured_time_us
        - 1
        for i in test_ids
    ]
    return test_ids, errors, result, fit_s


#: reduction lengths of the --by-k rows: [lower, upper) bounds of k
K_BINS = (0, 1024, 4096, 8192, 16384, 32768, 1 << 20)


def _by_k(case: Case, test_ids: Sequence[int], errors: Sequence[float]) -> list[str]:
    """Held-out signed median error per k range: a residual the fit cannot remove shows as a
    trend in k."""
    out = []
    k = np.array([case.runs[i].k for i in test_ids])
    signed = np.asarray(errors)
    for lo, hi in itertools.pairwise(K_BINS):
        keep = (k >= lo) & (k < hi)
        if keep.any():
            out.append(
                f"| {case.dataset} | {case.gpu}, {lo} <= k < {hi} | {int(keep.sum())} held out "
                f"| - | - | signed median {np.median(signed[keep]) * 100:+.1f} %, "
                f"{_stats(signed[keep].tolist())} | - | - |"
            )
    return out


def _every(index: int) -> bool:
    return True


def _medians(others: Sequence[tuple[list[int], list[float]]], keep: Callable[[int], bool]) -> str:
    """The other seeds' held-out median / p90 over the runs ``keep`` admits."""
    parts = [
        _stats([e for i, e in zip(ids, errors, strict=True) if keep(i)]) for ids, errors in others
    ]
    return "; ".join(parts) or "-"


def evaluate(
    case: Case,
    seed: int,
    points: list[tuple[str, float, float]],
    other_seeds: Sequence[int] = (),
    by_k: bool = False,
) -> list[str]:
    started = time.perf_counter()
    runs = case.runs
    base = case.device.base
    rows = []
    # uncalibrated: configuration-less optimum where the dataset has none, else as run
    chosen = case.uncalibrated if case.uncalibrated is not None else list(range(len(runs)))
    # the optimum over the default space: no configuration, and no kernel named either
    bare = [
        dataclasses.replace(runs[i], config=None, threads_per_cta=None, registers_per_thread=None)
        for i in chosen
    ]
    optimum = [RunModel(r, case.device, i) for i, r in enumerate(bare)]
    ratios = [m.predict_us(base) / r.measured_time_us for m, r in zip(optimum, bare, strict=True)]
    points += [
        (case.dataset, r.measured_time_us, q * r.measured_time_us)
        for r, q in zip(bare, ratios, strict=True)
    ]
    test_ids, calibrated, result, fit_s = _calibrated(case, seed)
    others = [_calibrated(case, s)[:2] for s in other_seeds]
    theirs: list[float] = []
    if case.nvmmh is not None:
        pool = bare if not case.best_only else bare[:1]
        theirs = [case.nvmmh(r) / r.measured_time_us - 1 for r in pool]
    if case.best_only:
        measured_best = min(r.measured_time_us for r in runs)
        ours = ratios[0] * bare[0].measured_time_us / measured_best - 1
        configured = [
            RunModel(r, case.device, i).predict_us(base) / r.measured_time_us - 1
            for i, r in enumerate(runs)
        ]
        mine = f"optimum {ours * 100:+.1f} % vs measured best; per config {_stats(configured)}"
        nv = "-"
        if theirs:
            nv_best = (theirs[0] + 1) * bare[0].measured_time_us / measured_best - 1
            nv = f"{nv_best * 100:+.1f} % vs best"
        rows.append(
            f"| {case.dataset} | {case.gpu} | {len(runs)} configs | {mine} | - "
            f"| {_stats(calibrated)} (fit on {case.train}, {len(test_ids)} held out) "
            f"| {_medians(others, _every)} | {nv} |"
        )
    else:
        held = f"(fit on {case.train}, {len(test_ids)} held out)"
        rows.append(
            f"| {case.dataset} | {case.gpu} | {len(chosen)} shapes "
            f"| {_stats([q - 1 for q in ratios])} | {_worst(ratios)} "
            f"| {_stats(calibrated)} {held} | {_medians(others, _every)} "
            f"| {_stats(theirs)} |"
        )
    for label, keep in case.subsets:
        sub = [e for i, e in zip(test_ids, calibrated, strict=True) if keep(i)]
        rows.append(
            f"| {case.dataset} | {case.gpu}, {label} | {len(sub)} held out | - | - "
            f"| {_stats(sub)} | {_medians(others, keep)} | - |"
        )
    if by_k:
        rows += _by_k(case, test_ids, calibrated)
    elapsed = time.perf_counter() - started
    scales = ", ".join(f"{v:.2f}" for v in result.log_scale)
    harness = ""
    if result.harness_log_scale:
        h = result.harness
        harness = (
            f"; harness: floor {h.floor_us:.1f} us, serial split-K hand-off "
            f"{h.serial_handoff_us:.2f} us"
        )
    rows.append(
        f"<!-- {case.dataset} {case.gpu}: {elapsed:.0f} s, fit {fit_s:.1f} s; "
        f"fitted ln(figure / base): {scales}{harness} -->"
    )
    return rows


def picture(points: list[tuple[str, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kperf"  # the same ids on every run
    fig, ax = plt.subplots(figsize=(6, 6))
    for dataset in sorted({p[0] for p in points}):
        xs = [p[1] for p in points if p[0] == dataset]
        ys = [p[2] for p in points if p[0] == dataset]
        ax.scatter(xs, ys, s=6, alpha=0.6, label=dataset)
    lo = min(min(p[1], p[2]) for p in points)
    hi = max(max(p[1], p[2]) for p in points)
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [2 * lo, 2 * hi], "k:", lw=0.6)
    ax.plot([lo, hi], [lo / 2, hi / 2], "k:", lw=0.6)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="measured time (us)",
        ylabel="predicted time (us), uncalibrated optimum",
    )
    ax.set_title("kperf L2-aware model vs real GPUs (dotted: 2x)")
    ax.legend(fontsize=7)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--other-seeds",
        default="1,2",
        help="comma-separated seeds whose calibration draws are also fitted and reported",
    )
    parser.add_argument("--neusight-test", type=int, default=1000)
    parser.add_argument(
        "--by-k", action="store_true", help="also the held-out error per range of k"
    )
    parser.add_argument(
        "--train",
        type=int,
        default=None,
        help="calibration runs per fit where a dataset has more than twice as many (default: "
        "16): the model's own limit shows as the held-out error of a fit on many runs",
    )
    parser.add_argument("--svg", type=Path, default=None)
    parser.add_argument("--only", default=None, help="a dataset name: run that one alone")
    parser.add_argument(
        "--kernel-times",
        action="store_true",
        help="NeuSight fitted as bare kernel times (no framework floor, every split-K with a "
        "reduction kernel): the model before the harness terms",
    )
    args = parser.parse_args(argv)
    if not DATA.exists():
        print(f"skipped: {DATA} absent")
        return
    other_seeds = [int(v) for v in args.other_seeds.split(",") if v.strip()]
    print(f"command: {command_line()}\n")
    print(
        "| dataset | GPU | n | ours uncalibrated, median / p90 abs error | worst ratio "
        f"| ours calibrated on {args.train or TRAIN} (held out), median / p90 "
        f"| same, calibration drawn with seeds {', '.join(map(str, other_seeds)) or '-'} "
        "| nvMatmulHeuristics, median / p90 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    builders: list[tuple[str, Callable[[], Case]]] = [("xla_sm90_tf32", xla)]
    builders += [(f"h100_torch_{d}", functools.partial(h100_torch, d)) for d in H100_PRECISION]
    builders += [
        (
            "neusight_linear_train",
            functools.partial(
                neusight,
                g,
                args.seed,
                args.neusight_test,
                harness=not args.kernel_times,
                serial=not args.kernel_times,
            ),
        )
        for g in NEUSIGHT
    ]
    builders += [("cutlass_tf32_rtx3090", cutlass)]
    builders += [("kt_xgemm_sgemm4096", functools.partial(xgemm, g)) for g in XGEMM]
    points: list[tuple[str, float, float]] = []
    for name, build in builders:
        if args.only and name != args.only:
            continue
        case = build()
        if args.train is not None and len(case.runs) > 2 * args.train:
            case.train = args.train
        for row in evaluate(case, args.seed, points, other_seeds, args.by_k):
            print(row, flush=True)
    if args.svg is not None and points:
        picture(points, args.svg)
        print(f"\npicture: {args.svg}")


if __name__ == "__main__":
    main()
