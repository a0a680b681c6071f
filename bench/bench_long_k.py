"""Where the uncalibrated model misses long-K GEMMs on real cuBLAS fp32 runs (NeuSight).

Usage: python -m bench.bench_long_k [--gpu P100] [--min-waves 4]

Every run of ../shared/data/real-gemm/neusight_linear_train/ is predicted as it ran (the tile
from its kernel's name, split_k = grid_z, its threads per CTA) with each profile's uncalibrated
figures. Printed per GPU:

1. the signed median error by range of k, for grid_z == 1 and grid_z > 1 apart (is the long-K
   miss split-K's?);
2. on runs of at least ``--min-waves`` waves of CTAs (large m x n), the signed median error and
   the measured GFLOP/s by A/B row pitch (4 k bytes, both operands K-major) and kernel tile,
   with the model's resident CTAs per SM and their rows' span per stage, c (TM + TN) x pitch:
   a translation-reach (TLB) limit shows as a knee at a fixed span, a page-size one at a fixed
   pitch;
3. on the same runs, the signed median error by row pitch and by the operands' footprint,
   (m + n) x 4 k bytes: a DRAM row-buffer limit would depend on the pitch alone, an L2-capacity
   one on footprints of the L2's size, a translation-reach one on both (a row per page once the
   pitch is large, pages beyond the TLBs' reach once the footprint is).
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import defaultdict

import numpy as np

from bench.bench_real import NEUSIGHT, neusight
from perfmodel.calibration.configless import RunModel

K_BINS = (0, 1024, 4096, 8192, 16384, 32768, 1 << 20)
PITCH_KB_BINS = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128, 192, 256)
COARSE_PITCH_KB_BINS = (0, 16, 32, 48, 64, 96, 128, 256)
FOOTPRINT_MB_BINS = (0, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", action="append", help="substring of the GPU name (repeatable)")
    parser.add_argument("--min-waves", type=int, default=4)
    args = parser.parse_args()
    print(f"command: python -m bench.bench_long_k --min-waves {args.min_waves}")
    for gpu in NEUSIGHT:
        if args.gpu and not any(g in gpu for g in args.gpu):
            continue
        started = time.perf_counter()
        case = neusight(gpu, 0, 1000)
        base, sms = case.device.base, case.device.sm_count
        rows = []
        for i, run in enumerate(case.runs):
            model = RunModel(run, case.device, i)
            assert run.config is not None
            tm, tn, _, _, _, z = run.config
            ctas = -(-run.m // tm) * -(-run.n // tn) * z
            rows.append(
                (
                    run.k,
                    z,
                    tm,
                    tn,
                    ctas,
                    int(model.model.resident[0]),
                    (run.m + run.n) * run.k * 4 / 2**20,
                    run.measured_time_us,
                    model.predict_us(base),
                    2.0 * run.m * run.n * run.k / run.measured_time_us / 1e3,
                )
            )
        data = np.array(rows, dtype=np.float64)
        k, z, tm, tn, ctas, resident, footprint_mb, measured, predicted, gflops = data.T
        err = predicted / measured - 1
        print(f"\n{gpu}: {len(rows)} runs, {sms} SMs ({time.perf_counter() - started:.0f} s)\n")
        print("| k range | grid_z == 1: n, signed median | grid_z > 1: n, signed median |")
        print("|---|---|---|")
        for lo, hi in itertools.pairwise(K_BINS):
            cells = []
            for split in (z == 1, z > 1):
                keep = split & (k >= lo) & (k < hi)
                cells.append(
                    f"{int(keep.sum())}, {np.median(err[keep]) * 100:+.1f} %" if keep.any() else "-"
                )
            print(f"| {lo} <= k < {hi} | {cells[0]} | {cells[1]} |")
        big = ctas >= args.min_waves * sms
        tiles = sorted({(int(a), int(b)) for a, b in zip(tm[big], tn[big], strict=True)})
        print(f"\nruns of >= {args.min_waves} waves (CTAs >= {args.min_waves} x SMs):")
        header = " | ".join(
            f"{a}x{b} (c = {int(np.median(resident[big & (tm == a) & (tn == b)]))}): "
            "n, signed median, GFLOP/s, span MB"
            for a, b in tiles
        )
        print(f"\n| row pitch KB | {header} |")
        print("|---|" + "---|" * len(tiles))
        pitch_kb = k * 4 / 1024
        for lo, hi in itertools.pairwise(PITCH_KB_BINS):
            cells = []
            for a, b in tiles:
                keep = big & (tm == a) & (tn == b) & (pitch_kb >= lo) & (pitch_kb < hi)
                if keep.sum() < 5:
                    cells.append("-")
                    continue
                c = np.median(resident[keep])
                span = c * (a + b) * np.median(pitch_kb[keep]) / 1024
                cells.append(
                    f"{int(keep.sum())}, {np.median(err[keep]) * 100:+.0f} %, "
                    f"{np.median(gflops[keep]):.0f}, {span:.0f}"
                )
            print(f"| [{lo}, {hi}) | " + " | ".join(cells) + " |")
        print("\nsame runs, signed median error (n) by row pitch and footprint (m + n) x 4 k:")
        heads = " | ".join(f"({lo}, {hi}] MB" for lo, hi in itertools.pairwise(FOOTPRINT_MB_BINS))
        print(f"\n| row pitch KB | {heads} |")
        print("|---|" + "---|" * (len(FOOTPRINT_MB_BINS) - 1))
        for lo, hi in itertools.pairwise(COARSE_PITCH_KB_BINS):
            cells = []
            for flo, fhi in itertools.pairwise(FOOTPRINT_MB_BINS):
                keep = big & (pitch_kb >= lo) & (pitch_kb < hi)
                keep &= (footprint_mb > flo) & (footprint_mb <= fhi)
                cells.append(
                    f"{np.median(err[keep]) * 100:+.0f} % ({int(keep.sum())})"
                    if keep.sum() >= 3
                    else "-"
                )
            print(f"| [{lo}, {hi}) | " + " | ".join(cells) + " |")
        per_tile: defaultdict[str, int] = defaultdict(int)
        for a, b in zip(tm, tn, strict=True):
            per_tile[f"{int(a)}x{int(b)}"] += 1
        print(f"\nruns per tile (TM x TN): {dict(per_tile)}")


if __name__ == "__main__":
    main()
