"""Solver speed: production encoding vs the paper's fully unrolled encoding, in one run.

Usage: python -m bench.bench_solver [--repeats N] [--baseline-repeats N]

Prints medians and ratios as a Markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import time
from functools import partial

from bench.baseline_unrolled import solve_unrolled
from bench.common import command_line, median_seconds
from perfmodel.gemm_ws import GemmShape, Tiling, simulate
from solver import SearchSpace, TilingProblem, optimize_tiling
from solver.search_space import shared_memory_fits
from tests.gemm_ws_cases import A6000, TABLE_1, TABLE_1_SPACE


def _solve(shape: GemmShape, space: SearchSpace, top_k: int = 1) -> str:
    result = optimize_tiling(TilingProblem(shape, A6000, space), top_k=top_k, time_limit_s=120)
    t = result.best.tiling
    return f"{t.tile_m}x{t.tile_n}x{t.tile_k}/d{t.buffer_depth} ({result.status})"


def _brute_force(shape: GemmShape, space: SearchSpace) -> Tiling:
    limit = A6000.shared_memory_per_block_bytes if space.enforce_shared_memory else None
    best: tuple[tuple[int, ...], Tiling] | None = None
    for tm, tn, tk, d in itertools.product(
        space.tile_m, space.tile_n, space.tile_k, space.buffer_depth
    ):
        tiling = Tiling(tm, tn, tk, d)
        if not shared_memory_fits(tiling, 2, limit):
            continue
        s = simulate(shape, tiling, A6000)
        key = (s.overall_time_ns, s.total_math_wait_ns, -tm, -tn, -tk, d)
        if best is None or key < best[0]:
            best = (key, tiling)
    assert best is not None
    return best[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--baseline-repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"command: {command_line()}\n")

    print("### Table 1 problems (tiles {32,64,128}^3, depth 2..8, no shared-memory limit)\n")
    print(
        "| problem | answer | ours top_k=1 median ms | ours top_k=5 median ms "
        "| unrolled baseline median ms | speed-up (top_k=1) |"
    )
    print("|---|---|---|---|---|---|")
    for problem, _ in TABLE_1:
        shape = GemmShape(*problem)
        answer = _solve(shape, TABLE_1_SPACE)
        ours = median_seconds(partial(_solve, shape, TABLE_1_SPACE), args.repeats)
        ours5 = median_seconds(partial(_solve, shape, TABLE_1_SPACE, 5), args.repeats)
        base = median_seconds(
            partial(solve_unrolled, shape, A6000, TABLE_1_SPACE, 120), args.baseline_repeats
        )
        print(
            f"| {problem} | {answer} | {ours * 1e3:.1f} | {ours5 * 1e3:.1f} "
            f"| {base * 1e3:.0f} | {base / ours:.1f}x |"
        )

    print(
        "\n### Default search space (tiles {16..256} powers of 2, depth 2..8, "
        "shared memory enforced, fp16)\n"
    )
    print(
        "| problem | answer | ours top_k=1 median ms | ours top_k=5 median ms "
        "| unrolled baseline (one run, 60 s cap) |"
    )
    print("|---|---|---|---|---|")
    for side in (4096, 16384):
        shape = GemmShape(side, side, side)
        space = SearchSpace()
        answer = _solve(shape, space)
        ours = median_seconds(partial(_solve, shape, space), args.repeats)
        ours5 = median_seconds(partial(_solve, shape, space, 5), max(3, args.repeats // 2))
        if side == 4096:
            tiling, proven, secs = solve_unrolled(shape, A6000, space, 60)
            base = f"{secs * 1e3:.0f} ms ({'optimal' if proven else 'timeout'})"
        else:
            base = "not run (1,024 unrolled stages)"
        print(f"| {side}^3 | {answer} | {ours * 1e3:.1f} | {ours5 * 1e3:.1f} | {base} |")

    print(
        "\n### Range search space: every multiple of 16 from 16 to 256 per tile dimension, "
        "depth 2..8 (28,672 candidates)\n"
    )
    print(
        "| problem | shared memory | ours median ms | brute-force enumeration ms (one run) "
        "| same answer | speed-up |"
    )
    print("|---|---|---|---|---|---|")
    values = tuple(range(16, 257, 16))
    for side, enforce in ((1024, False), (1024, True), (4096, True)):
        shape = GemmShape(side, side, side)
        space = SearchSpace(values, values, values, tuple(range(2, 9)), enforce)
        result = optimize_tiling(TilingProblem(shape, A6000, space), top_k=1, time_limit_s=120)
        ours = median_seconds(partial(_solve, shape, space), 3)
        started = time.perf_counter()
        brute = _brute_force(shape, space)
        brute_s = time.perf_counter() - started
        same = brute == result.best.tiling
        print(
            f"| {side}^3 | {'enforced' if enforce else 'off'} | {ours * 1e3:.0f} "
            f"| {brute_s * 1e3:.0f} | {same} | {brute_s / ours:.1f}x |"
        )


if __name__ == "__main__":
    main()
