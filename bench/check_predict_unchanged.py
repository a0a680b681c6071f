"""Are this checkout's /predict-kernel answers byte for byte those of a baseline checkout?

A speed change to the PTX analysis must leave every answer as it was. This script answers the
same requests with both checkouts, each in a fresh interpreter whose cwd is the checkout (as
bench/bench_ptx_memory.py runs them), through the worker job (``app.jobs.predict_job``: parse,
model, response encoding, the ``full`` lists where the answer is small), and compares the
encoded bodies: predicted cycles, interval, breakdown, per-instruction and superstep lists and
warnings. Requests:

- bench/bench_ptx_memory.py's worst-case shapes at ``--shape-bytes`` (default 200 KB) and
  the ``loops`` shape at the 2 MB limit;
- every entry of the nvcc fixtures in tests/fixtures/ptx/nvcc on a100 and rtx-a6000, and the
  kernel_args fixture's entries with their scalar arguments given;
- ``--dedispersion`` seeded configurations per GPU of the dedispersion caches
  (``../shared/data/real-kernels/dedispersion``, built as bench/bench_real_kernels.py builds
  them: PTX cached in ~/.cache/kperf/ptx-dedispersion, nvcc only for missing ones).

Exit status 1 and the first differing field of each differing answer when any differ.

Run: python -m bench.check_predict_unchanged --baseline-root /tmp/base [--dedispersion 40]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import bench_ptx_memory, bench_real_kernels
from bench.common import command_line
from kperf_client.ptx_build import PtxBuilder
from perfmodel.ptx import parse_module

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "ptx" / "nvcc"

#: run in a fresh interpreter whose cwd is the checkout answering; writes body i to dir/i
CHILD = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from app.jobs import predict_job
from device_profiles import get_profile

cases, out = json.load(sys.stdin), Path(sys.argv[1])
profiles = {}
for i, (request, profile_id) in enumerate(cases):
    if profile_id not in profiles:
        profiles[profile_id] = get_profile(profile_id).model_dump(mode="json")
    try:
        body = predict_job(request, profiles[profile_id], 2_000_000, 1 << 20).body
    except ValueError as exc:  # a ModelInputError: the service's 422
        body = ("422: " + str(exc)).encode()
    (out / str(i)).write_bytes(body)
"""

Case = tuple[str, dict[str, Any], str]  # (name, request JSON, profile id)


def _request(
    ptx: str,
    device: str,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    registers: int,
    detail: str = "full",
    kernel: str | None = None,
    kernel_args: dict[str, int] | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "ptx": ptx,
        "device": device,
        "launch": {"grid": list(grid), "block": list(block)},
        "resources": {"registers_per_thread": registers},
        "detail": detail,
    }
    if kernel is not None:
        request["kernel"] = kernel
    if kernel_args:
        request["kernel_args"] = kernel_args
    return request


def shape_cases(shape_bytes: int) -> list[Case]:
    cases: list[Case] = []
    for shape in bench_ptx_memory.SHAPES:
        ptx = bench_ptx_memory.module(shape, shape_bytes)
        req = _request(ptx, "rtx-a6000", (1, 1, 1), (128, 1, 1), 32)
        cases.append((f"{shape} {shape_bytes} B", req, "rtx-a6000"))
    ptx = bench_ptx_memory.module("loops")
    req = _request(ptx, "rtx-a6000", (1, 1, 1), (128, 1, 1), 32, detail="auto")
    cases.append(("loops 2 MB", req, "rtx-a6000"))
    return cases


def fixture_cases() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(FIXTURES.glob("*.ptx")):
        ptx = path.read_text()
        for fn in parse_module(ptx).functions:
            if not fn.is_entry:
                continue
            for device in ("a100", "rtx-a6000"):
                req = _request(ptx, device, (64, 2, 1), (128, 2, 1), 64, kernel=fn.name)
                cases.append((f"{path.name}:{fn.name} {device}", req, device))
    ptx = (FIXTURES / "kernel_args.sm_80.ptx").read_text()
    scalars = set(re.findall(r"\.param \.[us]32 (\w+)", ptx))  # not the pointers
    for fn in parse_module(ptx).functions:
        params = [p for p in fn.params if p in scalars]
        for n in (1, 6, 13, 1000):
            args = {p: n + k for k, p in enumerate(params)}
            req = _request(ptx, "a100", (4, 1, 1), (32, 1, 1), 24, kernel=fn.name, kernel_args=args)
            cases.append((f"kernel_args {fn.name} {args}", req, "a100"))
    return cases


def dedispersion_cases(per_gpu: int, seed: int) -> list[Case]:
    cases: list[Case] = []
    cache = Path.home() / ".cache" / "kperf" / "ptx-dedispersion"
    for gpu, (csv_name, profile_id, arch) in bench_real_kernels.GPUS.items():
        rows = bench_real_kernels.read_rows(bench_real_kernels.DATA / csv_name)
        sample = random.Random(f"{seed}:{gpu}").sample(rows, min(per_gpu, len(rows)))
        builder = PtxBuilder(
            bench_real_kernels.DATA / "dedispersion.cu",
            arch=arch,
            kernel=bench_real_kernels.KERNEL,
            cache_dir=cache,
        )
        for row in sample:
            built = builder.build(row.params, row.grid, row.block)
            regs = built.resources.registers_per_thread if built.resources else 32
            req = _request(
                built.ptx, profile_id, row.grid, row.block, regs, kernel=bench_real_kernels.KERNEL
            )
            cases.append((f"dedispersion {gpu} {row.params}", req, profile_id))
    return cases


def answers(root: Path, cases: list[Case]) -> list[bytes]:
    """Each case's encoded body (or ``422: reason``) as ``root``'s code answers it."""
    with tempfile.TemporaryDirectory() as out:
        payload = json.dumps([[req, profile] for _, req, profile in cases])
        subprocess.run(
            [sys.executable, "-c", CHILD, out], input=payload, text=True, cwd=root, check=True
        )
        return [(Path(out) / str(i)).read_bytes() for i in range(len(cases))]


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """The path of the first field where two decoded answers differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {str(a)[:200]} != {str(b)[:200]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-root", type=Path, required=True)
    ap.add_argument("--shape-bytes", type=int, default=200_000)
    ap.add_argument("--dedispersion", type=int, default=40, help="configurations per GPU")
    ap.add_argument("--seed", default="20251127")
    args = ap.parse_args()
    cases = shape_cases(args.shape_bytes) + fixture_cases()
    cases += dedispersion_cases(args.dedispersion, args.seed)
    ours = answers(REPO, cases)
    theirs = answers(args.baseline_root.resolve(), cases)
    differ = 0
    for (name, _, _), a, b in zip(cases, ours, theirs, strict=True):
        if a == b:
            continue
        differ += 1
        try:
            where = first_difference(json.loads(a), json.loads(b))
        except ValueError:
            where = f"{a[:200]!r} != {b[:200]!r}"
        print(f"DIFFERS {name[:120]}: {where}")
    print(f"command: {command_line()}")
    print(f"{len(cases) - differ} of {len(cases)} answers identical to {args.baseline_root}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
