"""Cost of the L2-reuse memory term on a default /optimize-tiling request, switch off vs on,
measured in one run on what the service does for a request but HTTP, the cache and the pool
(app.convert.candidates.prepare, then the worker's app.jobs.optimize_job).

Columns: memory_model 'dram-stream' (today's default), 'l2-reuse' over the default space, and
'l2-reuse' also searching split_k in {1, 2, 4, 8} and group_m in {1, 8}; shortlist 'exploit'
in all three (the memory term has no explore shortlist).

Usage: python -m bench.bench_memory_model [--repeats N] [--device ID] [--pipeline NAME]
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

from app.convert.candidates import prepare
from app.jobs import optimize_job
from app.schemas.optimize import OptimizeTilingRequest
from bench.common import command_line, median_seconds
from device_profiles import default_profiles

PROBLEMS = ((1024, 1024, 1024), (4096, 4096, 4096), (1024, 1024, 8192), (8192, 256, 8192))
VARIANTS: dict[str, dict[str, Any]] = {
    "off": {},
    "l2-reuse": {"memory_model": "l2-reuse"},
    "l2-reuse + split_k, group_m": {
        "memory_model": "l2-reuse",
        "search_space": {"split_k": [1, 2, 4, 8], "group_m": [1, 8]},
    },
}


def _answer(body: dict[str, Any], device: str) -> dict[str, Any]:
    profile = default_profiles()[device]
    request = OptimizeTilingRequest.model_validate(body)
    prepared = prepare(request, profile)
    encoded = optimize_job(body, profile.model_dump(mode="json"), prepared, time_limit_s=30.0)
    answer: dict[str, Any] = json.loads(encoded.body)
    return answer


def _label(best: dict[str, Any]) -> str:
    label = f"{best['tile_m']}x{best['tile_n']}x{best['tile_k']}/d{best['buffer_depth']}"
    if "split_k" in best:
        label += f" s{best['split_k']} g{best['group_m']} hit {best['l2_hit_rate']:.2f}"
    return label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="h100")
    parser.add_argument("--pipeline", default="paper")
    args = parser.parse_args()
    print(f"command: {command_line()}\n")
    print(
        f"| problem ({args.device}, fp16, {args.pipeline}, default space, top_k=5, exploit) | "
        + " | ".join(f"{name} median ms | best" for name in VARIANTS)
        + " | on / off | on + split-K / off |"
    )
    print("|---|" + "---|" * (2 * len(VARIANTS) + 2))
    for m, n, k in PROBLEMS:
        cells, times = [], []
        for extra in VARIANTS.values():
            body = {
                "m": m,
                "n": n,
                "k": k,
                "device": args.device,
                "pipeline_model": args.pipeline,
                "shortlist": "exploit",
                **extra,
            }
            answer = _answer(body, args.device)  # warm-up, and the answer shown
            assert answer["status"] == "optimal", answer["status"]
            seconds = median_seconds(partial(_answer, body, args.device), args.repeats)
            times.append(seconds * 1000)
            best = answer["best"]
            cells.append(f"{seconds * 1000:.1f} | {_label(best)} {best['predicted_time_us']} us")
        print(
            f"| {m}x{n}x{k} | "
            + " | ".join(cells)
            + f" | {times[1] / times[0]:.2f}x | {times[2] / times[0]:.2f}x |"
        )


if __name__ == "__main__":
    main()
