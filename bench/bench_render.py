"""Time the pictures (target: a 1,000-stage timeline in <= 300 ms median, < 200 KB).

Renders in this process, as a pool worker does after its first picture (matplotlib already
imported: the one-off import is timed separately). Cases:

* the GeMM-WS timeline of 1024x512x128000 on rtx-a6000, tiling 128x64x128 depth 2
  (1,000 stages, load-bound), alone and with the simulation of the tiling in front of it;
* the same shape MATH-bound (a 5,000 elements/us DMA): the DMA warp stalls on a full buffer;
* the Many-BSP breakdown of the Hotspot worked example (GTX 760, §2);
* a calibration fit of 200 synthetic points.

Run: .venv/bin/python bench/bench_render.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.convert.optimize import gemm_ws_machine  # noqa: E402
from app.convert.predict import resolve_device, terms_of, to_response  # noqa: E402
from app.schemas.predict import PredictKernelRequest  # noqa: E402
from bench.common import command_line  # noqa: E402
from device_profiles import get_profile  # noqa: E402
from perfmodel.gemm_ws import GemmShape, Tiling, simulate  # noqa: E402
from perfmodel.manybsp import predict_kernel  # noqa: E402
from tests.gemm_ws_cases import FAST_DMA  # noqa: E402
from tests.paper_cases import paper_case, paper_http_body  # noqa: E402

SHAPE = GemmShape(1024, 512, 128_000)
TILING = Tiling(128, 64, 128, 2)


def _times(fn: Callable[[], bytes], repeats: int) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of each call (CPU time is what the picture costs when other
    processes share the cores), and the SVG's size."""
    size = len(fn())  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return wall, cpu, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()

    started = time.perf_counter()
    import render  # noqa: F401 - the package alone: no matplotlib yet
    from render import breakdown_svg, calibration_svg, timeline_svg

    package_s = time.perf_counter() - started
    started = time.perf_counter()
    import matplotlib.backends.backend_svg  # noqa: F401 - what the first picture pays

    import_s = time.perf_counter() - started

    a6000 = gemm_ws_machine(get_profile("rtx-a6000"))
    load_bound = simulate(SHAPE, TILING, a6000)
    math_bound = simulate(SHAPE, TILING, FAST_DMA)
    assert load_bound.stages == math_bound.stages == 1000

    case = paper_case("hotspot-gtx-760")
    http = PredictKernelRequest.model_validate(paper_http_body(case))
    from app.convert.predict import to_core

    core = to_core(http)
    result = predict_kernel(core)
    answer = to_response(result, core.device.clock_mhz).model_dump(mode="json")
    terms = terms_of(answer, resolve_device(http))
    measured = [10.0 * 1.02**i for i in range(200)]
    predicted = [m * (1 + 0.08 * ((i * 7919) % 200 - 100) / 100) for i, m in enumerate(measured)]

    cases: list[tuple[str, Callable[[], bytes]]] = [
        ("timeline, 1,000 stages, load-bound", lambda: timeline_svg(load_bound, a6000)),
        (
            "simulate + timeline, 1,000 stages",
            lambda: timeline_svg(simulate(SHAPE, TILING, a6000), a6000),
        ),
        ("timeline, 1,000 stages, MATH-bound", lambda: timeline_svg(math_bound, FAST_DMA)),
        ("breakdown, Hotspot GTX 760", lambda: breakdown_svg(answer, terms)),
        ("calibration fit, 200 points", lambda: calibration_svg(measured, predicted)),
    ]
    print(f"Command: `.venv/bin/{command_line()}`\n")
    print(
        f"- `import render`: {package_s * 1000:.1f} ms (matplotlib not loaded); first "
        f"matplotlib import (SVG backend): {import_s * 1000:.0f} ms, once per worker"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"- {args.repeats} repeats after one warm-up, in-process; load average before the run "
        f"{load} on {os.cpu_count()} cores\n"
    )
    print("| picture | median ms | min ms | max ms | median CPU ms | SVG KB |")
    print("|---|---|---|---|---|---|")
    for name, fn in cases:
        wall, cpu, size = _times(fn, args.repeats)
        print(
            f"| {name} | {statistics.median(wall) * 1000:.1f} | {min(wall) * 1000:.1f} | "
            f"{max(wall) * 1000:.1f} | {statistics.median(cpu) * 1000:.1f} | {size / 1000:.1f} |"
        )


if __name__ == "__main__":
    main()
