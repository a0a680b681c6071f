"""Time parse + Many-BSP prediction of the largest checked-in CUTLASS sm_90a module (issue 8
target: median <= 1 s). Run: ``.venv/bin/python bench/bench_hopper.py [--repeats R]``.

Two timings of ``perfmodel.manybsp.predict_kernel`` (parse, warp roles, one Table N-1/N-2 and
eq. (4)-(25) per role): with ``registers_per_thread`` given, and, when ptxas is on PATH, with the
registers left to ``ptxas -v`` as a request without them gets (the ptxas run dominates).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from device_profiles import get_profile
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel

NVCC_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "ptx" / "nvcc"


def _times(request: PredictRequest, repeats: int) -> list[float]:
    predict_kernel(request)  # warm-up (imports, first ptxas start)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        predict_kernel(request)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--target-s", type=float, default=1.0, help="median must not exceed")
    args = parser.parse_args()
    path = max(NVCC_DIR.glob("cutlass_*.sm_90a.ptx"), key=lambda p: p.stat().st_size)
    ptx = path.read_text()
    base = PredictRequest(
        ptx=ptx,
        device=device_from_profile(get_profile("940mx")),
        grid=(132, 1, 1),
        block=(384, 1, 1),
        registers_per_thread=168,
    )
    result = predict_kernel(base)
    print(
        f"module={path.name} bytes={len(ptx.encode())} lines={ptx.count(chr(10))} "
        f"roles={len(result.roles)} instructions_bounding_role={len(result.costs)}"
    )
    runs = [("registers given", base)]
    if shutil.which("ptxas") is not None:
        runs.append(("registers from ptxas -v", replace(base, registers_per_thread=None)))
    failed = False
    for name, request in runs:
        t = _times(request, args.repeats)
        median = statistics.median(t)
        verdict = "PASS" if median <= args.target_s else "FAIL"
        failed |= median > args.target_s
        print(
            f"{name}: repeats={args.repeats} median_s={median:.3f} min_s={min(t):.3f} "
            f"max_s={max(t):.3f} {verdict} (target {args.target_s:.3f} s)"
        )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
