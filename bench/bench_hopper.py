"""Time parse + Many-BSP prediction of the largest checked-in CUTLASS sm_90a module
(target: median <= 1 s). Run: ``.venv/bin/python bench/bench_hopper.py [--repeats R]``.

Timings of ``perfmodel.manybsp.predict_kernel`` (parse, warp roles, one Table N-1/N-2 and
eq. (4)-(25) per role): with ``registers_per_thread`` given; and, when ptxas is on PATH, with
the registers left to ``ptxas -v`` as a request without them gets, the first time a module is
seen (ptxas runs) and again (its answer is kept per module), plus ptxas alone.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from device_profiles import get_profile
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel
from perfmodel.manybsp.ptxas import _registers, _run

NVCC_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "ptx" / "nvcc"


def _times(call: Callable[[], object], repeats: int) -> list[float]:
    call()  # warm-up (imports, first process start)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def _cold(request: PredictRequest) -> object:
    _registers.cache_clear()  # as for a module the service has not compiled yet
    return predict_kernel(request)


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
    from_ptxas = replace(base, registers_per_thread=None)
    runs: list[tuple[str, Callable[[], object], bool]] = [
        ("registers given", lambda: predict_kernel(base), True)
    ]
    exe = shutil.which("ptxas")
    if exe is not None:
        runs += [
            ("registers from ptxas -v, module not seen before", lambda: _cold(from_ptxas), False),
            (
                "registers from ptxas -v, module seen before",
                lambda: predict_kernel(from_ptxas),
                True,
            ),
            ("ptxas -v alone", lambda: _run(exe, ptx, result.kernel, "sm_90a"), False),
        ]
    failed = False
    for name, call, checked in runs:
        t = _times(call, args.repeats)
        median = statistics.median(t)
        verdict = "reported, not a target"
        if checked:
            verdict = "PASS" if median <= args.target_s else "FAIL"
            verdict += f" (target {args.target_s:.3f} s)"
        failed |= checked and median > args.target_s
        print(
            f"{name}: repeats={args.repeats} median_s={median:.3f} min_s={min(t):.3f} "
            f"max_s={max(t):.3f} {verdict}"
        )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
