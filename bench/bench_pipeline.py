"""Speed of a default /optimize-tiling request under each pipeline model (issue 17 target:
async-copy <= 1.5x paper), measured in one run on the request-to-answer core (conversion,
solve, response model), without HTTP.

Usage: python -m bench.bench_pipeline [--repeats N]
"""

from __future__ import annotations

import argparse
from functools import partial

from app.convert.optimize import solve, to_problem, to_response
from app.schemas.optimize import OptimizeTilingRequest, OptimizeTilingResponse
from bench.common import command_line, median_seconds

PROBLEMS = ((1024, 1024, 1024), (4096, 4096, 4096), (16384, 16384, 16384), (8192, 256, 8192))


def _answer(body: dict[str, object]) -> OptimizeTilingResponse:
    request = OptimizeTilingRequest.model_validate(body)
    device, problem = to_problem(request)
    result = solve(problem, top_k=request.top_k, time_limit_s=request.time_limit_s)
    return to_response(request, device, problem, result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"command: {command_line()}\n")
    print(
        "| problem (rtx-a6000, fp16, default space, top_k=5) | paper median ms | paper best "
        "| async-copy median ms | async-copy best | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for m, n, k in PROBLEMS:
        row = []
        for model in ("paper", "async-copy"):
            body = {"m": m, "n": n, "k": k, "device": "rtx-a6000", "pipeline_model": model}
            seconds = median_seconds(partial(_answer, body), args.repeats)
            best = _answer(body).best
            label = f"{best.tile_m}x{best.tile_n}x{best.tile_k}/d{best.buffer_depth}"
            if model == "async-copy":
                label += f" c={best.ctas_per_sm} {best.bound}"
            row.append((seconds * 1000, label))
        (paper_ms, paper_best), (async_ms, async_best) = row
        print(
            f"| {m}x{n}x{k} | {paper_ms:.1f} | {paper_best} | {async_ms:.1f} | {async_best} "
            f"| {async_ms / paper_ms:.2f}x |"
        )


if __name__ == "__main__":
    main()
