"""kperf's /optimize-tiling beside NVIDIA's nvMatmulHeuristics on 100 fp16 GEMM shapes (A100).

Usage: python -m bench.bench_nvmmh [--shapes 100] [--seed 0]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: nvidia-matmul-heuristics, a binary
wheel that runs on the CPU with predefined GPUs; never a dependency of the service).

- Shapes: seeded random, half square (m = n = k = 2^8 .. 2^14), half skinny (one of m, n in
  16 .. 256, the others 1,024 .. 16,384), fp16.
- Ours: ``POST /optimize-tiling`` over HTTP to an in-process service (``KperfClient()``, the
  ASGI transport: the routes, cache and worker pool of ``kperf serve``), device ``a100``,
  default search space, ``shortlist: exploit`` (the point estimate's ranking), ``top_k`` 40.
  Timed per query: each shape once (cache miss), then again (cache hit).
- Theirs: ``NvMatmulHeuristicsInterfaceEx(CUTLASS, gpu=A100_SXM_80GB).get(problem, 20,
  precision="HSH")`` (fp16 in, fp32 compute, fp16 out), layout NN row-major.
- Mapping: their CTA tile (cta m, n, k) is our (tile_m, tile_n, tile_k); their
  ``loadStages`` (CUTLASS multistage: shared-memory buffers of A and B) is our
  ``buffer_depth``; warp/instruction tiles, split-K, swizzle and cluster have no counterpart.
  Overlap: the first 5 distinct (tile_m, tile_n, tile_k) of each ranking, |ours & theirs|.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.common import command_line

DEVICE = "a100"
TOP = 5


def shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    found = []
    for i in range(count):
        if i % 2 == 0:
            size = 2 ** rng.randint(8, 14)
            found.append((size, size, size))
        else:
            small = rng.choice([16, 32, 64, 128, 256])
            big = [rng.choice([1024, 2048, 4096, 8192, 16384]) for _ in range(2)]
            found.append((small, big[0], big[1]) if rng.random() < 0.5 else (big[0], small, big[1]))
    return found


def distinct_tiles(triples: Sequence[tuple[int, int, int]], count: int = TOP) -> list[Any]:
    kept: list[tuple[int, int, int]] = []
    for triple in triples:
        if triple not in kept:
            kept.append(triple)
        if len(kept) == count:
            break
    return kept


async def ours(
    problems: list[tuple[int, int, int]], pipeline_model: str | None
) -> tuple[list[Any], list[float], list[float], list[int], set[str]]:
    from kperf_client.client import KperfClient

    tops: list[Any] = []
    miss_s: list[float] = []
    hit_s: list[float] = []
    depths: list[int] = []
    models: set[str] = set()
    async with KperfClient() as client:
        for timings in (miss_s, hit_s):
            for m, n, k in problems:
                body = {"m": m, "n": n, "k": k, "dtype": "fp16", "device": DEVICE}
                body |= {"shortlist": "exploit", "top_k": 40}
                if pipeline_model is not None:
                    body["pipeline_model"] = pipeline_model
                started = time.perf_counter()
                answer = await client.optimize(body)
                timings.append(time.perf_counter() - started)
                if timings is miss_s:
                    ranked = answer.response.candidates
                    tops.append(distinct_tiles([(c.tile_m, c.tile_n, c.tile_k) for c in ranked]))
                    depths.append(answer.response.best.buffer_depth)
                    models.add(answer.response.pipeline_model)
    return tops, miss_s, hit_s, depths, models


def theirs(problems: list[tuple[int, int, int]]) -> tuple[list[Any], list[float], list[Any]]:
    import nvMatmulHeuristics as nvmmh

    heuristics = nvmmh.NvMatmulHeuristicsInterfaceEx(
        backend=nvmmh.NvMatmulHeuristicsTarget.CUTLASS,
        gpu=nvmmh.NvMatmulHeuristicsNvidiaGpu.A100_SXM_80GB,
    )
    layout = nvmmh.NvMatmulHeuristicsMatmulLayout.NN_ROW_MAJOR
    tops, times_s, stages = [], [], []
    heuristics.get(heuristics.makeNvMatmulHeuristicsProblem(64, 64, 64, layout), 1, "HSH")
    for m, n, k in problems:
        problem = heuristics.makeNvMatmulHeuristicsProblem(m, n, k, layout)
        started = time.perf_counter()
        configs = heuristics.get(problem, 20, precision="HSH")
        times_s.append(time.perf_counter() - started)
        kernels = [c["kernel"] for c in configs]
        tops.append(distinct_tiles([(g.cta_tile_m, g.cta_tile_n, g.cta_tile_k) for g in kernels]))
        stages.append([g.stages for g in kernels[:TOP]])
    return tops, times_s, stages


def p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.9 * len(ordered)) - 1)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pipeline-model",
        choices=["paper", "async-copy"],
        default=None,
        help="ours: the GeMM-WS pipeline model (default: the a100 profile's)",
    )
    args = parser.parse_args(argv)
    problems = shapes(args.shapes, args.seed)
    our_tops, miss_s, hit_s, our_depths, models = asyncio.run(ours(problems, args.pipeline_model))
    their_tops, their_s, their_stages = theirs(problems)
    overlaps = [len(set(a) & set(b)) for a, b in zip(our_tops, their_tops, strict=True)]
    square = overlaps[0::2]
    skinny = overlaps[1::2]

    def ms(values: Sequence[float]) -> str:
        return f"{1000 * statistics.median(values):.2f} / {1000 * p90(values):.2f}"

    print(
        f"`{command_line()}` ({len(problems)} shapes, fp16, A100, ours under "
        f"{', '.join(sorted(models))}; per query median / p90 ms)"
    )
    print()
    print("| what | per query ms (median / p90) |")
    print("|---|---|")
    print(f"| kperf /optimize-tiling, in-process HTTP, cache miss | {ms(miss_s)} |")
    print(f"| kperf /optimize-tiling, in-process HTTP, cache hit | {ms(hit_s)} |")
    print(f"| nvMatmulHeuristics get(20), CUTLASS, A100_SXM_80GB | {ms(their_s)} |")
    print()
    print(
        f"Top-{TOP} distinct (tile_m, tile_n, tile_k) in common (0..{TOP}): mean "
        f"{statistics.mean(overlaps):.2f} (square {statistics.mean(square):.2f}, skinny "
        f"{statistics.mean(skinny):.2f}); shapes with none in common: "
        f"{sum(o == 0 for o in overlaps)}/{len(overlaps)}"
    )
    their_best = [stages[0] for stages in their_stages if stages]
    same = sum(o == t[0] for o, t in zip(our_depths, their_stages, strict=True) if t)
    print(
        f"Rank 1's buffer depth: ours median {statistics.median(our_depths):g} (range "
        f"{min(our_depths)}-{max(our_depths)}), their stages median "
        f"{statistics.median(their_best):g} (range {min(their_best)}-{max(their_best)}); "
        f"equal on {same}/{len(our_depths)} shapes"
    )
    for index in (0, 1, 2, 3):
        m, n, k = problems[index]
        print(
            f"- {m}x{n}x{k}: ours {our_tops[index]}; theirs {their_tops[index]} "
            f"(their stages {their_stages[index]})"
        )


if __name__ == "__main__":
    main()
