"""What separates the GA10x boards (RTX A6000, RTX A4000) from the A100 on the dedispersion kernel.

Usage: python -m bench.bench_ga10x [--cross] [--what-if-i2fp] [--per-gpu 150]
           [--gpus A100,A6000,A4000,H100]
           [--seed 20251127] [--cache-dir DIR]

Data: ``../shared/data/real-kernels/dedispersion/`` (read in place; PROVENANCE.md there), the
same kernel measured for all 11,130 configurations on each GPU.

Part 1 (no model, every configuration): the measured time per warp and channel per scheduler
at each profile's clock (nr_samples x nr_dms / 32 warps of 1,536 channels: a configuration
whose blocks leave lanes idle counts above its own work, so the minimum is the cleanest; the
H100 row is this project's 449 configurations, bench/h100/README.md), and
r = ln(t_GA10x / t_A100) for the same configuration (the mean of the A6000 and the A4000),
its median per value of a tunable or of a derived quantity, centred on the median of all.
The A100 is the reference because the model ranks it best; what the ratio varies with is
what a GA10x-specific mechanism must explain. Derived quantities:

* ``rows_of_blocks``: ceil(nr_dms / (block_size_y x tile_size_y)), the rows of blocks along y
  that do work. Each row streams the whole input once, so it is the number of times the input
  passes the L2: a mechanism of L2 misses on the 6 / 4 MB L2s scales with it.
* ``warps_per_block`` and ``resident_warps_ga10x``: warps per SM on CC 8.6 from the block slots
  (16) and threads (1,536) alone (registers, 30-38 per thread from ptxas -v, never bind).

Also the A6000 / A4000 ratio (same SM, different L2: 6 vs 4 MB).

Part 2 (``--cross``, the model): Spearman of /predict-kernel on each GPU's profile against
that GPU's measured times, on each GPU's bench sample (bench_real_kernels: seed, sample and
PTX build as there): whether a GPU's shortfall follows the GPU or the sample.

Part 3 (``--what-if-i2fp``, the model with one change, not the shipped model): integer -> f32
conversions costed at the profile's ``alu`` row instead of their own (``cvt_int_to_f32``,
or ``cvt`` where the profile has none), on each GPU's own sample (the H100 rows included):
ptxas lowers the loop's cvt.rn.f32.u16 to I2FP.F32.U32 on sm_86 and sm_90 but to I2F.U16 on
sm_80 (docs/model-notes.md, "GA10x against the A100").
On sm_86 also with that and the LD/ST rows at 4 per scheduler (an uncited what-if). On sm_90
also with a ``cvt_int_to_f32`` row at this project's H100 measurement (bench/h100/figures3),
and for each H100 variant a diagnostic: the prediction less what eq. (24) puts above each
block class's throughput floor. Every variant counts the distinct "costed as" fallback
warnings its answers carry (the A100 only "as the model": ptxas keeps I2F.U16 on sm_80).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import re
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from scipy.stats import spearmanr

import perfmodel.manybsp.predict as predict_module
from bench.bench_real_kernels import (
    DATA,
    GPUS,
    KERNEL,
    TUNABLES,
    Row,
    metrics,
    read_rows,
    request_for,
)
from device_profiles.loader import PROFILE_DIR, load_profile_file
from kperf_client.ptx_build import PtxBuilder
from perfmodel.manybsp import DeviceFigures, device_from_profile, predict_kernel
from perfmodel.manybsp.classify import Classified, classify
from perfmodel.manybsp.frontend import ClassFigures
from perfmodel.manybsp.predict import PredictResult
from perfmodel.manybsp.types import FunctionalUnit
from perfmodel.ptx import Instruction

Key = tuple[int, ...]
#: the shared datasets: every configuration measured on each
SHARED = ("A100", "A6000", "A4000")
#: this project's H100 conversion measurement (bench/h100/README.md, figures3)
FIGURES3 = Path(__file__).resolve().parent / "h100" / "figures3" / "figures.json"


def header_constants() -> dict[str, int]:
    """The problem size the kernel was measured at (``#define`` lines of dedispersion.h)."""
    text = (DATA / "dedispersion.h").read_text(encoding="utf-8")
    return {m[1]: int(m[2]) for m in re.finditer(r"#define\s+(\w+)\s+(\d+)\s*$", text, re.M)}


def by_config(gpu: str) -> dict[Key, Row]:
    return {tuple(r.params[k] for k in TUNABLES): r for r in read_rows(GPUS[gpu][0])}


def cycles_per_warp_channel(ms: float, gpu: str, warps: int, channels: int) -> float:
    """Measured cycles per warp and channel per scheduler at the profile's clock."""
    figures = device_from_profile(load_profile_file(PROFILE_DIR / f"{GPUS[gpu][1]}.json"))
    assert figures.clock_mhz is not None
    dev = figures.device
    return ms * 1e3 * figures.clock_mhz * dev.n_sm * dev.n_ws / (warps * channels)


def grouped(
    name: str,
    keys: Sequence[Key],
    r: Sequence[float],
    feature: Callable[[Key], int],
    only: Callable[[Key], bool] = lambda k: True,
) -> str:
    centre = statistics.median(r)
    groups: dict[int, list[float]] = {}
    for k, v in zip(keys, r, strict=True):
        if only(k):
            groups.setdefault(feature(k), []).append(v - centre)
    cells = ", ".join(
        f"{g}: {statistics.median(v):+.3f} ({len(v)})" for g, v in sorted(groups.items())
    )
    return f"| {name} | {cells} |"


def part1() -> list[str]:
    c = header_constants()
    warps = c["nr_samples"] * c["nr_dms"] // 32
    data = {g: by_config(g) for g in SHARED}
    keys = sorted(data["A100"])
    lines = ["measured cycles per warp and channel per scheduler at the profile's clock", ""]
    lines += ["| GPU | configurations | median | min | p90 |", "|---|---|---|---|---|"]
    for g in GPUS:
        # the H100 rows are this project's own timings of 449 of the configurations
        rows = [r.measured_ms for r in by_config(g).values()]
        cyc = sorted(cycles_per_warp_channel(ms, g, warps, c["nr_channels"]) for ms in rows)
        p90 = cyc[int(0.9 * len(cyc))]
        cells = f"{statistics.median(cyc):.2f} | {cyc[0]:.2f} | {p90:.2f}"
        lines.append(f"| {g} | {len(cyc)} | {cells} |")
    ga10x = [
        (
            math.log(data["A6000"][k].measured_ms / data["A100"][k].measured_ms)
            + math.log(data["A4000"][k].measured_ms / data["A100"][k].measured_ms)
        )
        / 2
        for k in keys
    ]
    pair = [math.log(data["A6000"][k].measured_ms / data["A4000"][k].measured_ms) for k in keys]
    idx = {name: i for i, name in enumerate(TUNABLES)}

    def t(name: str) -> Callable[[Key], int]:
        return lambda k: k[idx[name]]

    def rows_of_blocks(k: Key) -> int:
        return math.ceil(c["nr_dms"] / (k[idx["block_size_y"]] * k[idx["tile_size_y"]]))

    def warps_per_block(k: Key) -> int:
        return math.ceil(k[idx["block_size_x"]] * k[idx["block_size_y"]] / 32)

    def resident_ga10x(k: Key) -> int:
        w = warps_per_block(k)
        return min(16, 48 // w) * w

    features: list[tuple[str, Callable[[Key], int]]] = [
        ("block_size_x", t("block_size_x")),
        ("block_size_y (bins of 32)", lambda k: k[idx["block_size_y"]] // 32 * 32),
        ("tile_size_x", t("tile_size_x")),
        ("tile_size_y", t("tile_size_y")),
        ("rows_of_blocks (bins of 4)", lambda k: min(40, rows_of_blocks(k)) // 4 * 4),
        ("warps_per_block (8: 8 or more)", lambda k: min(8, warps_per_block(k))),
        ("resident_warps_ga10x (bins of 8)", lambda k: resident_ga10x(k) // 8 * 8),
    ]
    lines += ["", f"r = ln(t_GA10x / t_A100), sd {statistics.pstdev(ga10x):.3f}, median of"]
    lines += ["each group minus the median of all (configurations)", ""]
    lines += ["| grouped by | median r (n) |", "|---|---|"]
    lines += [grouped(name, keys, ga10x, f) for name, f in features]
    # at one block shape, tile_size_y alone sets the rows of blocks (up to 8x): an L2-miss
    # mechanism would move r with it
    for low, high in ((32, 64), (128, 160)):

        def in_band(k: Key, lo: int = low, hi: int = high) -> bool:
            return lo <= k[idx["block_size_y"]] < hi and warps_per_block(k) >= 2

        name = f"rows_of_blocks, block_size_y {low}-{high - 1}, warps_per_block >= 2"
        lines.append(grouped(name, keys, ga10x, rows_of_blocks, in_band))
    lines += ["", f"ln(t_A6000 / t_A4000): median {statistics.median(pair):+.3f}, sd "]
    lines[-1] += f"{statistics.pstdev(pair):.3f}"
    lines += ["", "| grouped by | median (n) |", "|---|---|"]
    lines += [grouped(name, keys, pair, f) for name, f in features[4:]]
    return lines


def part2(per_gpu: int, seed: int, cache_dir: Path) -> list[str]:
    data = {g: by_config(g) for g in SHARED}
    lines = ["Spearman of the model on a GPU's profile against that GPU's measured times", ""]
    lines += ["| sample of | " + " | ".join(f"{g} profile" for g in SHARED) + " |"]
    lines += ["|---|" + "---|" * len(SHARED)]
    for sample_gpu in SHARED:
        rows = read_rows(GPUS[sample_gpu][0])
        sample = random.Random(f"{seed}:{sample_gpu}").sample(rows, min(per_gpu, len(rows)))
        cells = []
        for gpu in SHARED:
            _csv, profile_id, arch = GPUS[gpu]
            figures = device_from_profile(load_profile_file(PROFILE_DIR / f"{profile_id}.json"))
            builder = PtxBuilder(
                DATA / "dedispersion.cu", arch=arch, kernel=KERNEL, cache_dir=cache_dir
            )
            own = [data[gpu][tuple(r.params[k] for k in TUNABLES)] for r in sample]
            predicted = [
                predict_kernel(request_for(r, builder, figures)).estimate.kernel_exec_cycle
                for r in own
            ]
            rho = spearmanr(predicted, [r.measured_ms for r in own]).statistic
            cells.append(f"{float(rho):.3f}")
        lines.append(f"| {sample_gpu} (seed {seed}, {len(sample)}) | " + " | ".join(cells) + " |")
    return lines


def int_to_f32_at_alu_rate(ins: Instruction) -> Classified | None:
    """What-if classification: an integer -> f32 conversion costed as the profile's ``alu``
    row (ptxas lowers cvt.rn.f32.u16 to I2FP.F32.U32 on sm_86 and sm_90, to I2F.U16 on sm_80;
    docs/model-notes.md, "GA10x against the A100"); every other instruction as the model."""
    c = classify(ins)
    if c is not None and c.class_key == "cvt_int_to_f32":
        return Classified("alu", c.kind)
    return c


#: the LD/ST rows of the profiles (units and results per scheduler per cycle)
LDST_ROWS = ("ld_global", "ld_global_nc", "st_global", "ld_shared", "st_shared")


def with_ldst_per_scheduler(figures: DeviceFigures, lanes: int) -> DeviceFigures:
    """What-if figures: every LD/ST row at ``lanes`` per scheduler (the GA10x profiles carry
    the A100's 8 as an estimate; no public source for GA102/GA104 was found)."""
    rows = tuple(
        (k, dataclasses.replace(v, units_per_ws=lanes, throughput_per_ws=lanes))
        if k in LDST_ROWS
        else (k, v)
        for k, v in figures.classes
    )
    return dataclasses.replace(figures, classes=rows)


def with_measured_int_to_f32(figures: DeviceFigures) -> DeviceFigures:
    """What-if figures: a ``cvt_int_to_f32`` row at this project's H100 measurement
    (bench/h100/figures3: I2FP.F32.U32 at >= 35.2 per SM per clock, a lower bound, i.e. that
    over n_ws per scheduler), on the SP column (16 lanes per scheduler sustain it, the 4-lane
    SFU does not) at the profile's cvt latency (docs/model-notes.md, "Integer-to-f32
    conversions on sm_90")."""
    measured = json.loads(FIGURES3.read_text(encoding="utf-8"))["convert"]
    per_scheduler = measured["convert_u32_per_sm_per_clock"] / figures.device.n_ws
    cvt = figures.class_map()["cvt"]
    row = ClassFigures(FunctionalUnit.SP, 16, round(per_scheduler, 1), cvt.latency_cycles)
    return dataclasses.replace(figures, classes=(*figures.classes, ("cvt_int_to_f32", row)))


def without_class_latency_excess(result: PredictResult, launch_cycles: float) -> float:
    """Diagnostic, not a model: the prediction with every block class at its throughput floor
    (one launch, the longest drain, the classes' floors: no latency-bound term at all; how
    much of an answer the classes' latency terms decide; docs/model-notes.md, "Integer-to-f32
    conversions on sm_90")."""
    if not result.block_classes:
        return result.estimate.kernel_exec_cycle
    tail = max(c.estimate.novlp / 2 for c in result.block_classes)
    return (
        launch_cycles + tail + sum(c.estimate.throughput_floor_cycles for c in result.block_classes)
    )


def part3(per_gpu: int, seed: int, cache_dir: Path, gpus: Sequence[str]) -> list[str]:
    lines = ["What-if: integer -> f32 conversions at another rate (each GPU's own sample)", ""]
    lines += ["| GPU | classification | n | Spearman | median err | mean err | p90 err |"]
    lines[-1] += " pred/meas | fallback warnings |"
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for gpu in gpus:
        path, profile_id, arch = GPUS[gpu]
        rows = read_rows(path)
        sample = random.Random(f"{seed}:{gpu}").sample(rows, min(per_gpu, len(rows)))
        figures = device_from_profile(load_profile_file(PROFILE_DIR / f"{profile_id}.json"))
        assert figures.clock_mhz is not None
        source = DATA / "dedispersion.cu"
        builder = PtxBuilder(source, arch=arch, kernel=KERNEL, cache_dir=cache_dir)
        requests = [request_for(r, builder, figures) for r in sample]
        measured = [r.measured_ms for r in sample]
        variants: list[tuple[str, Callable[[Instruction], Classified | None], DeviceFigures]]
        variants = [("as the model", classify, figures)]
        # ptxas keeps I2F.U16 on sm_80: the what-ifs apply to sm_86 and sm_90
        if arch != "sm_80":
            variants.append(("I2FP at alu", int_to_f32_at_alu_rate, figures))
        if arch == "sm_90":
            measured_row = with_measured_int_to_f32(figures)
            variants.append(("I2FP at the measured sm_90 rate", classify, measured_row))
        if arch == "sm_86":
            halved = with_ldst_per_scheduler(figures, 4)
            variants.append(("I2FP at alu, LD/ST 4 per scheduler", int_to_f32_at_alu_rate, halved))
        for name, rule, figs in variants:
            # the predictor's own name for its classifier, swapped for this what-if only
            vars(predict_module)["classify"] = rule
            try:
                results = [predict_kernel(dataclasses.replace(q, device=figs)) for q in requests]
            finally:
                vars(predict_module)["classify"] = classify
            predicted = [r.estimate.kernel_exec_cycle / figures.clock_mhz / 1e3 for r in results]
            # the documented fallbacks an answer names ("... costed as ..."), distinct texts
            fallbacks = {w.split(": ", 1)[-1] for r in results for w in r.warnings}
            fallbacks = {w for w in fallbacks if "costed as" in w}
            cells = metrics(predicted, measured).cells()
            lines.append(f"| {gpu} | {name} | {cells} | {len(fallbacks)} |")
            # on sm_90 the conversion floor no longer hides them; elsewhere the model's own
            if arch == "sm_90" or name == "as the model":
                launch = figs.device.block_launch_overhead_cycles
                floors = [without_class_latency_excess(r, launch) for r in results]
                cells = metrics([c / figures.clock_mhz / 1e3 for c in floors], measured).cells()
                lines.append(f"| {gpu} | {name}, classes' eq. (24) excess removed | {cells} | |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cross", action="store_true", help="also the model on every sample")
    parser.add_argument(
        "--what-if-i2fp",
        action="store_true",
        help="also the model with integer -> f32 conversions at the alu and the measured rate",
    )
    parser.add_argument("--per-gpu", type=int, default=150)
    parser.add_argument("--gpus", default=",".join(GPUS), help="the GPUs of part 3")
    parser.add_argument("--seed", type=int, default=20251127)
    parser.add_argument(
        "--cache-dir", type=Path, default=Path.home() / ".cache" / "kperf" / "ptx-dedispersion"
    )
    args = parser.parse_args()
    print("\n".join(part1()), flush=True)
    if args.cross:
        print()
        print("\n".join(part2(args.per_gpu, args.seed, args.cache_dir)))
    if args.what_if_i2fp:
        print()
        print("\n".join(part3(args.per_gpu, args.seed, args.cache_dir, args.gpus.split(","))))


if __name__ == "__main__":
    main()
