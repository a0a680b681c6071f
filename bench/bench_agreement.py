"""Solver vs brute force on the paper's grid (§3.3), under three machine regimes.

Usage: python -m bench.bench_agreement [--problems-per-regime N] [--seed S]

Draws M, N, K uniformly from the multiples of 32 up to 1024, solves each with the Z3 optimizer
(tiles {32, 64, 128}, depth 2..8, no shared-memory limit) and with an exhaustive stage-by-stage
simulation under the same objectives and tie-break, and counts exact agreement of the tiling,
the overall time and the MATH wait.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench.common import command_line
from perfmodel.gemm_ws import GemmShape
from solver import TilingProblem, optimize_tiling
from tests.gemm_ws_cases import LOAD_FAST, LOAD_SLOW, ON_PAR, TABLE_1_SPACE, brute_force_ranking

REGIMES = {
    "load much faster than MATH": LOAD_FAST,
    "on par (A6000)": ON_PAR,
    "load much slower than MATH": LOAD_SLOW,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems-per-regime", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    grid = range(32, 1025, 32)
    print(f"command: {command_line()}\n")
    print(
        "| regime | problems | agree | disagree | not proven | solver median ms "
        "| brute force median ms |"
    )
    print("|---|---|---|---|---|---|---|")
    total = agree_total = 0
    for name, machine in REGIMES.items():
        agree = disagree = unproven = 0
        solve_ms: list[float] = []
        brute_ms: list[float] = []
        for _ in range(args.problems_per_regime):
            shape = GemmShape(rng.choice(grid), rng.choice(grid), rng.choice(grid))
            started = time.perf_counter()
            result = optimize_tiling(TilingProblem(shape, machine, TABLE_1_SPACE), top_k=1)
            solve_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            expected = brute_force_ranking(shape, machine, TABLE_1_SPACE)[0]
            brute_ms.append((time.perf_counter() - started) * 1e3)
            got = result.best
            same = (got.tiling, got.overall_time_ns, got.total_math_wait_ns) == (
                expected.tiling,
                expected.overall_time_ns,
                expected.total_math_wait_ns,
            )
            unproven += result.status != "optimal"
            agree += same
            disagree += not same
            if not same:
                print(f"  DISAGREE {shape}: solver {got.tiling} vs brute force {expected.tiling}")
        total += args.problems_per_regime
        agree_total += agree
        print(
            f"| {name} | {args.problems_per_regime} | {agree} | {disagree} | {unproven} "
            f"| {statistics.median(solve_ms):.1f} | {statistics.median(brute_ms):.1f} |"
        )
    print(f"\nagreement: {agree_total}/{total}")


if __name__ == "__main__":
    main()
