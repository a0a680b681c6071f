"""Speed of a default /optimize-tiling request under each pipeline model (target: async-copy
<= 1.5x paper), measured in one run on what the service does for a request but HTTP, the
cache and the pool (the conversion, app.convert.candidates.prepare; then what a worker does:
the certified solve, the explore shortlist, the response model and its JSON,
app.jobs.optimize_job).

Usage: python -m bench.bench_pipeline [--repeats N]
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

PROBLEMS = ((1024, 1024, 1024), (4096, 4096, 4096), (16384, 16384, 16384), (8192, 256, 8192))
DEVICE = "rtx-a6000"


def _answer(body: dict[str, Any], profile_json: dict[str, Any]) -> dict[str, Any]:
    request = OptimizeTilingRequest.model_validate(body)
    prepared = prepare(request, default_profiles()[DEVICE])
    encoded = optimize_job(body, profile_json, prepared, time_limit_s=10.0)
    answer: dict[str, Any] = json.loads(encoded.body)
    return answer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    profile_json = default_profiles()[DEVICE].model_dump(mode="json")
    print(f"command: {command_line()}\n")
    print(
        f"| problem ({DEVICE}, fp16, default space, top_k=5, explore) | paper median ms "
        "| paper best | async-copy median ms | async-copy best | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for m, n, k in PROBLEMS:
        row = []
        for model in ("paper", "async-copy"):
            body = {"m": m, "n": n, "k": k, "device": DEVICE, "pipeline_model": model}
            answer = _answer(body, profile_json)  # warm-up, and the answer shown
            assert answer["status"] == "optimal", answer["status"]
            seconds = median_seconds(partial(_answer, body, profile_json), args.repeats)
            best = answer["best"]
            label = f"{best['tile_m']}x{best['tile_n']}x{best['tile_k']}/d{best['buffer_depth']}"
            if model == "async-copy":
                label += f" c={best['ctas_per_sm']} {best['bound']}"
            row.append((seconds * 1000, label))
        (paper_ms, paper_best), (async_ms, async_best) = row
        print(
            f"| {m}x{n}x{k} | {paper_ms:.1f} | {paper_best} | {async_ms:.1f} | {async_best} "
            f"| {async_ms / paper_ms:.2f}x |"
        )


if __name__ == "__main__":
    main()
