"""The GeMM-WS closed loop (calibration): optimize -> measure the top 5 -> fit -> optimize again.

Usage: python -m bench.bench_closed_loop [--problems N] [--seed S] [--independent]
       [--truth far|latency-bound] [--mode explore|exploit]

The "true GPU" is the event simulator with hidden figures far from the base A6000 profile
(tests/calibration_cases.py CLOSED_LOOP_TRUTH: 3x faster loads, 5x slower MATH, other
latencies moved; or LATENCY_BOUND_TRUTH: latency-bound stages), and each "measurement" is its
time with 2 % log-normal noise. The loop starts from the base figures with wide priors (a
factor e at one sd) and shortlists that explore (to learn the figures) or, with
``--mode exploit``, the point estimate's top 5 (the loop before shortlists explored). Problems:
M, N, K log-uniform multiples of 128 in 256..8192; default search space (tiles 16..256,
depth 2..8, A6000 shared memory, fp16). By default the problems share the device, so every
round fits the figures to the runs of all of them (solver.calibration_loop);
``--independent`` runs one loop per problem on its own runs only. Regret of a pick =
true time / true optimum - 1, the optimum solved with the hidden figures. Target: after
three rounds, >= 95 % of problems within 1 % (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np

from bench.common import command_line
from perfmodel.gemm_ws import GemmShape, Tiling, simulate
from solver import SearchSpace, TilingProblem, optimize_tiling
from solver.calibration_loop import LoopResult, calibration_loop
from solver.shortlist import ShortlistMode
from tests.calibration_cases import BASE, CLOSED_LOOP_TRUTH, LATENCY_BOUND_TRUTH, draw_dimension

TRUTHS = {"far": CLOSED_LOOP_TRUTH, "latency-bound": LATENCY_BOUND_TRUTH}

ROUNDS = 3
TARGET_SHARE = 0.95


TRUTH = CLOSED_LOOP_TRUTH


def true_time_ns(shape: GemmShape, tiling: Tiling) -> int:
    return simulate(shape, tiling, TRUTH).overall_time_ns


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--independent", action="store_true")
    parser.add_argument("--truth", choices=sorted(TRUTHS), default="far")
    parser.add_argument("--mode", choices=[m.value for m in ShortlistMode], default="explore")
    args = parser.parse_args()
    global TRUTH
    TRUTH = TRUTHS[args.truth]
    mode = ShortlistMode(args.mode)
    print(f"command: {command_line()}\n")
    rng = np.random.default_rng(args.seed)
    shapes = [GemmShape(*(draw_dimension(rng) for _ in range(3))) for _ in range(args.problems)]
    noise = np.random.default_rng(args.seed + 1)

    def measure(shape: GemmShape, tiling: Tiling) -> float:
        return true_time_ns(shape, tiling) / 1000 * math.exp(noise.normal(0.0, 0.02))

    problems = [TilingProblem(s, BASE, SearchSpace()) for s in shapes]
    started = time.perf_counter()
    if args.independent:
        loops = [calibration_loop([p], measure, rounds=ROUNDS, mode=mode) for p in problems]
        picks = [loop.picks_of(0) for loop in loops]
    else:
        pooled: LoopResult = calibration_loop(problems, measure, rounds=ROUNDS, mode=mode)
        loops = [pooled]
        picks = [pooled.picks_of(i) for i in range(len(problems))]
    elapsed = time.perf_counter() - started
    optimum = [
        optimize_tiling(TilingProblem(s, TRUTH, SearchSpace()), top_k=1).best for s in shapes
    ]
    kind = "independent (one loop per problem)" if args.independent else "pooled (one device)"
    print(
        f"{args.problems} problems, {kind}, truth {args.truth}, shortlists {mode.value}, "
        f"loop wall time {elapsed:.1f} s\n"
    )
    print("| pick | median regret | p95 | max | within 1 % | true optimum |")
    print("|---|---|---|---|---|---|")
    shares = []
    for r in range(ROUNDS + 1):
        regrets = [
            true_time_ns(shape, p[r]) / best.overall_time_ns - 1
            for shape, p, best in zip(shapes, picks, optimum, strict=True)
        ]
        exact = sum(p[r] == best.tiling for p, best in zip(picks, optimum, strict=True))
        within = sum(x <= 0.01 for x in regrets)
        shares.append(within / len(regrets))
        label = "base figures" if r == 0 else f"after round {r}"
        print(
            f"| {label} | {100 * statistics.median(regrets):.2f} % | "
            f"{100 * percentile(regrets, 95):.2f} % | {100 * max(regrets):.2f} % | "
            f"{within}/{len(regrets)} | {exact}/{len(regrets)} |"
        )
    if not args.independent:
        print("\n| figure | base | true | after round 1 | after round 2 | after round 3 |")
        print("|---|---|---|---|---|---|")
        for i, f in enumerate(loops[0].rounds[0].calibration.fitted):
            cells = []
            for rnd in loops[0].rounds:
                fig = rnd.calibration.fitted[i]
                cells.append(f"{fig.value:.4g}" + ("" if fig.identifiable else " (n.i.)"))
            truth = getattr(TRUTH, f.name)
            print(f"| {f.name} | {f.base_value:.4g} | {truth:.4g} | " + " | ".join(cells) + " |")
    return 0 if shares[-1] >= TARGET_SHARE else 1


if __name__ == "__main__":
    sys.exit(main())
