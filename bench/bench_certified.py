"""Certified solve (exact scorer + one Z3 certificate) vs the pure Z3 search, in one run.

Usage: python -m bench.bench_certified [--repeats N] [--http-repeats N]

Part 1, in process, per Table 1 problem (paper space, A6000): the certified solve at top_k 1
and 5, the pure Z3 search at top_k 1 and 5, and the baseline "plain enumeration + one Z3
certificate check" (the scorer over the space, then the certificate of its best, nothing
else). Part 2, over HTTP against `kperf serve` (one worker, memory store): a cache hit and a
cache miss of the same kind of request (a miss varies T_INIT by a microsecond fraction, which
changes the cache key but not the work); hits and misses alternate, so that both see the same
machine load. Prints Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import httpx

from bench.bench_large_answers import start_server, stop_server
from bench.common import command_line, median_seconds
from perfmodel.gemm_ws import GemmShape
from perfmodel.pipeline import Prediction
from solver import SolverMode, TilingProblem, optimize_tiling
from solver.per_configuration import (
    Instance,
    ScoredRanking,
    certify,
    rank_scored,
    space_configurations,
)
from tests.gemm_ws_cases import A6000, ISSUE_19_SPACE, TABLE_1, TABLE_1_SPACE


def _solve(problem: TilingProblem, top_k: int, mode: SolverMode) -> None:
    result = optimize_tiling(problem, top_k=top_k, time_limit_s=60, mode=mode)
    assert result.status == "optimal"


def space_ranking(
    problem: TilingProblem, deadline: float
) -> tuple[Instance, ScoredRanking, Prediction]:
    """The exact scorer over the space, as the certified path enumerates it; its best
    simulated stage by stage."""
    instance = Instance(problem.model, problem)
    ranking = rank_scored(instance, space_configurations(problem), 1, deadline)
    return instance, ranking, instance.simulate(ranking.configs.tilings()[0])


def _enumerate_and_certify(problem: TilingProblem) -> None:
    """The floor the certified path is held to: score the space, certify the best."""
    deadline = time.perf_counter() + 60
    instance, ranking, best = space_ranking(problem, deadline)
    floors = ranking.hopeful_floors
    assert certify(instance, best, ranking.hopeful, deadline, floors).better is None


def in_process(repeats: int) -> None:
    print("### In process: Table 1 problems (tiles {32,64,128}^3, depth 2..8, A6000)\n")
    print(
        "| problem | enum + 1 check ms | certified k=1 ms | certified k=5 ms | k5/k1 "
        "| k1 / (enum + check) | k5 / (enum + check) | z3-search k=1 ms | z3-search k=5 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for problem_dims, _ in TABLE_1:
        problem = TilingProblem(GemmShape(*problem_dims), A6000, TABLE_1_SPACE)
        base = median_seconds(partial(_enumerate_and_certify, problem), repeats)
        k1 = median_seconds(partial(_solve, problem, 1, SolverMode.CERTIFIED), repeats)
        k5 = median_seconds(partial(_solve, problem, 5, SolverMode.CERTIFIED), repeats)
        z1 = median_seconds(partial(_solve, problem, 1, SolverMode.Z3_SEARCH), repeats)
        z5 = median_seconds(partial(_solve, problem, 5, SolverMode.Z3_SEARCH), repeats)
        print(
            f"| {problem_dims} | {base * 1e3:.1f} | {k1 * 1e3:.1f} | {k5 * 1e3:.1f} "
            f"| {k5 / k1:.2f} | {k1 / base:.2f} | {k5 / base:.2f} | {z1 * 1e3:.1f} "
            f"| {z5 * 1e3:.1f} |"
        )
    space = ISSUE_19_SPACE
    big = TilingProblem(GemmShape(8192, 8192, 8192), A6000, space)
    started = time.perf_counter()
    result = optimize_tiling(big, top_k=5, time_limit_s=20)
    elapsed = time.perf_counter() - started
    print(
        f"\nThe oversized space (tile_m, tile_n 1..332, tile_k 64, depth 1..8: {space.size} "
        f"configurations, {result.statistics.configurations_scored} feasible), 8192^3, top_k 5: "
        f"{result.status} in {elapsed * 1e3:.0f} ms (one run), "
        f"{result.statistics.encoded_configurations} configurations encoded for the certificate\n"
    )


def _body(
    problem: tuple[int, int, int], top_k: int, solver: str, t_init_us: float
) -> dict[str, object]:
    machine = dataclasses.asdict(A6000)
    machine["t_init_us"] = t_init_us
    return {
        "m": problem[0],
        "n": problem[1],
        "k": problem[2],
        "device_params": machine,
        "search_space": {
            "tile_m": list(TABLE_1_SPACE.tile_m),
            "tile_n": list(TABLE_1_SPACE.tile_n),
            "tile_k": list(TABLE_1_SPACE.tile_k),
            "buffer_depth": list(TABLE_1_SPACE.buffer_depth),
            "enforce_shared_memory": False,
        },
        "top_k": top_k,
        "solver": solver,
    }


def over_http(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server, url = start_server(
            {"KPERF_STORE_URL": "memory://", "KPERF_DEFAULT_TIME_LIMIT_S": "30"},
            Path(tmp) / "server.log",
        )
        try:
            _measure_http(url, repeats)
        finally:
            stop_server(server)


def _measure_http(url: str, repeats: int) -> None:
    print(f"### Over HTTP (`kperf serve`, 1 worker, memory store), {repeats} requests each\n")
    print(
        "| problem | solver | hit ms | miss k=1 ms | miss k=5 ms | miss/hit (k=1) | k5/k1 (miss) |"
    )
    print("|---|---|---|---|---|---|---|")
    counter = iter(range(1, 1_000_000))
    with httpx.Client(base_url=url, timeout=60) as client:

        def timed(body: dict[str, object], cache: str) -> float:
            started = time.perf_counter()
            r = client.post("/optimize-tiling", json=body)
            elapsed = time.perf_counter() - started
            assert r.status_code == 200 and r.headers["x-cache"] == cache, r.text
            assert r.json()["status"] == "optimal"
            return elapsed

        for problem, _ in TABLE_1[:3]:
            for solver in ("certified", "z3-search"):
                hit_body = _body(problem, 1, solver, A6000.t_init_us)
                client.post("/optimize-tiling", json=hit_body)

                def miss(
                    top_k: int, problem: tuple[int, int, int] = problem, solver: str = solver
                ) -> float:
                    t_init = A6000.t_init_us + next(counter) * 1e-6
                    return timed(_body(problem, top_k, solver, t_init), "miss")

                miss(1)  # warm the worker's imports for this mode
                # interleaved (hit, miss k=1, miss k=5) rounds: on a shared machine whose load
                # swings within seconds, each kind sees the same load
                hits, miss1, miss5 = [], [], []
                for _ in range(repeats):
                    hits.append(timed(hit_body, "hit"))
                    miss1.append(miss(1))
                    miss5.append(miss(5))
                h, m1, m5 = (statistics.median(v) for v in (hits, miss1, miss5))
                print(
                    f"| {problem} | {solver} | {h * 1e3:.1f} | {m1 * 1e3:.1f} | {m5 * 1e3:.1f} "
                    f"| {m1 / h:.1f} | {m5 / m1:.2f} |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--http-repeats", type=int, default=9)
    args = parser.parse_args()
    print(f"command: `{command_line()}`\n")
    in_process(args.repeats)
    over_http(args.http_repeats)


if __name__ == "__main__":
    main()
