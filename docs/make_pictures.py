"""Regenerate the README's pictures in docs/pictures/ (one of each kind).

* ``timeline.svg``: the GeMM-WS timeline of the paper's Table 1 row 1024x512x1024 on the
  RTX A6000, its optimal tiling 128x64x128 (load-bound: the MATH warp waits);
* ``timeline-math-bound.svg``: a 1,000-stage pipeline with a fast DMA (inline figures): the
  DMA warp stalls on a full buffer, the middle of the pipeline is elided;
* ``breakdown.svg``: the Many-BSP breakdown of the Hotspot worked example on the GTX 760 (§2);
* ``calibration.svg``: a calibration fit on synthetic measurements (the model's times for a
  set of GEMMs, perturbed by a fixed pattern): no measured data ships with the repository;
* ``pipeline-paper.svg`` and ``pipeline-async-copy.svg``: the same stage (64x64x32, depth 3,
  6 stages; load 4,000 elements/us with a 2 us latency, MATH 10^5 MACs/us, inline figures)
  under each pipeline model: one load at a time, its latency paid per tile, against loads
  issued back to back with up to 3 in flight (README, "Pipeline models");
* ``tuning-table.svg``: the h100 fp8 table for N=1536, K=7168 over vLLM's 18 keys (README,
  "Tuning tables for vLLM and SGLang").

Run from the repository root: ``.venv/bin/python docs/make_pictures.py [--out DIR]``. The
pictures are deterministic for a given matplotlib version.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.convert.optimize import gemm_ws_machine  # noqa: E402
from app.convert.predict import resolve_device, terms_of, to_core, to_response  # noqa: E402
from app.convert.tuning_table import build_table  # noqa: E402
from app.schemas.predict import PredictKernelRequest  # noqa: E402
from app.schemas.tuning_table import TuningTableRequest  # noqa: E402
from device_profiles import get_profile  # noqa: E402
from perfmodel.gemm_ws import GemmShape, SmLimits, Tiling, simulate  # noqa: E402
from perfmodel.manybsp import predict_kernel  # noqa: E402
from perfmodel.pipelines.async_copy.recurrences import simulate_async  # noqa: E402
from render import (  # noqa: E402
    async_timeline_svg,
    breakdown_svg,
    calibration_svg,
    timeline_svg,
    tuning_table_svg,
)
from tests.gemm_ws_cases import FAST_DMA, PIPELINE_STAGE  # noqa: E402
from tests.paper_cases import paper_case, paper_http_body  # noqa: E402

NAMES = (
    "timeline.svg",
    "timeline-math-bound.svg",
    "breakdown.svg",
    "calibration.svg",
    "pipeline-paper.svg",
    "pipeline-async-copy.svg",
    "tuning-table.svg",
)
#: the README's pipeline-models stage (inline figures, illustrative): issue d = 1.024 us,
#: latency 2 us, MATH T = 1.311 us per 64x64x32 stage; one CTA per SM, so both models draw
#: the same CTA
PIPELINE_MACHINE = PIPELINE_STAGE
PIPELINE_SHAPE, PIPELINE_TILING = GemmShape(64, 64, 192), Tiling(64, 64, 32, 3)


def pictures() -> dict[str, bytes]:
    a6000 = gemm_ws_machine(get_profile("rtx-a6000"))
    table_1 = simulate(GemmShape(1024, 512, 1024), Tiling(128, 64, 128, 2), a6000)
    math_bound = simulate(GemmShape(4096, 4096, 128_000), Tiling(128, 64, 128, 3), FAST_DMA)

    request = PredictKernelRequest.model_validate(paper_http_body(paper_case("hotspot-gtx-760")))
    core = to_core(request)
    answer = to_response(predict_kernel(core), core.device.clock_mhz).model_dump(mode="json")

    shapes = [
        (512, 256, 512),
        (1024, 512, 1024),
        (2048, 1024, 1024),
        (2048, 2048, 2048),
        (4096, 2048, 2048),
        (4096, 4096, 4096),
        (8192, 4096, 4096),
        (8192, 8192, 8192),
    ]
    measured, predicted, labels = [], [], []
    for i, (m, n, k) in enumerate(shapes):
        time_us = simulate(GemmShape(m, n, k), Tiling(128, 64, 64, 2), a6000).overall_time_ns / 1000
        predicted.append(time_us)
        measured.append(time_us * (1 + 0.06 * (((i * 37) % 11) - 5) / 5))  # within +-6 %
        labels.append(f"{m}×{n}×{k}")
    paper = simulate(PIPELINE_SHAPE, PIPELINE_TILING, PIPELINE_MACHINE)
    async_copy = simulate_async(
        PIPELINE_SHAPE, PIPELINE_TILING, PIPELINE_MACHINE, SmLimits(1, 102400), 2
    )
    table = build_table(
        TuningTableRequest.model_validate({"n": 1536, "k": 7168, "device": "h100"}),
        get_profile("h100"),
        60.0,
    )
    curve = table.curve
    return {
        "tuning-table.svg": tuning_table_svg(
            curve.ms,
            curve.entry_us,
            curve.optimum_us,
            [e.m for e in table.response.entries],
            curve.worst_loss,
            title="N=1536, K=7168, fp8 on h100: vLLM's 18 keys",
        ),
        "timeline.svg": timeline_svg(table_1, a6000, device="rtx-a6000", dtype="fp16", rank=1),
        "pipeline-paper.svg": timeline_svg(paper, PIPELINE_MACHINE, device="inline", dtype="fp16"),
        "pipeline-async-copy.svg": async_timeline_svg(
            async_copy, PIPELINE_MACHINE, device="inline", dtype="fp16"
        ),
        "timeline-math-bound.svg": timeline_svg(
            math_bound, FAST_DMA, device="inline", dtype="fp16"
        ),
        "breakdown.svg": breakdown_svg(answer, terms_of(answer, resolve_device(request))),
        "calibration.svg": calibration_svg(
            measured, predicted, labels, title="Calibration fit (synthetic data, 128×64×64 tiles)"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "pictures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in pictures().items():
        (args.out / name).write_bytes(data)
        print(f"wrote {args.out / name} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
