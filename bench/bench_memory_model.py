"""Cost of the default /optimize-tiling request on the L2-aware memory model against the
former default (memory_model 'dram-stream'), measured in one run on what the service does for
a request but HTTP, the cache and the pool (app.convert.candidates.prepare, then the worker's
app.jobs.optimize_job).

Columns: the former default ('dram-stream' asked for; explore shortlist); the default request
(no memory_model or search-space fields: 'l2-reuse', group_m {1, 8} and split_k {1, 2, 4, 8,
16} searched); and the L2 term over tiles and depths alone (split_k and group_m [1]).

Usage: python -m bench.bench_memory_model [--repeats N] [--device ID] [--dtype D]
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

PROBLEMS = (
    (1024, 1024, 1024),
    (4096, 4096, 4096),
    (1024, 1024, 8192),
    (8192, 256, 8192),
    (16384, 16384, 1024),
)
VARIANTS: dict[str, dict[str, Any]] = {
    "former default (dram-stream)": {"memory_model": "dram-stream"},
    "default (l2-reuse, split_k, group_m)": {},
    "l2-reuse, split_k = group_m = 1": {"search_space": {"split_k": [1], "group_m": [1]}},
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
    parser.add_argument("--dtype", default="bf16")
    args = parser.parse_args()
    print(f"command: {command_line()}\n")
    print(
        f"| problem ({args.device}, {args.dtype}, top_k=5) | "
        + " | ".join(f"{name} median ms | best" for name in VARIANTS)
        + " | default / former |"
    )
    print("|---|" + "---|" * (2 * len(VARIANTS) + 1))
    ratios = []
    for m, n, k in PROBLEMS:
        cells, times = [], []
        for extra in VARIANTS.values():
            body = {"m": m, "n": n, "k": k, "device": args.device, "dtype": args.dtype, **extra}
            answer = _answer(body, args.device)  # warm-up, and the answer shown
            assert answer["status"] == "optimal", answer["status"]
            seconds = median_seconds(partial(_answer, body, args.device), args.repeats)
            times.append(seconds * 1000)
            best = answer["best"]
            cells.append(f"{seconds * 1000:.1f} | {_label(best)} {best['predicted_time_us']} us")
        ratios.append(times[1] / times[0])
        print(f"| {m}x{n}x{k} | " + " | ".join(cells) + f" | {ratios[-1]:.2f}x |")
    ratios.sort()
    print(f"\nmedian default / former default: {ratios[len(ratios) // 2]:.2f}x")


if __name__ == "__main__":
    main()
