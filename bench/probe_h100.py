"""What cuBLAS runs on a lent Hopper GPU, and the launch and clock around it (bench/h100/run5-7).

Three probes, each small enough for one short call of the device tool:

- ``kernels``: for each of the XLA table's 375 shapes (b in {1, 2, 4} x m, n, k in
  {256, ..., 4096}) and tf32, bf16, fp32 as ``bench.measure_h100`` times them, two warm-up
  ``torch.matmul`` calls, then five under torch.profiler (CUDA activity, CUPTI): the kernels
  each call launches (name, launches per call) and their device time per call, summed
  (``kernel_us``). That is the time a kernel tracer reports (XLA's table is such a median
  kernel time); ``bench.measure_h100``'s per-launch time of a CUDA graph replay is it plus the
  gap between consecutive kernels.
- ``launch``: the kernels of six square-ish products per dtype as above, then the per-kernel
  time of a CUDA graph of 500 one-element additions (the graph's floor per kernel), then
  nvidia-smi's SM clock just after 300 queued 8192^3 bf16 products.
- ``clock``: nvidia-smi's SM clock, power and throttle reasons every ~0.2 s while 8192^3 bf16
  products run back to back (the clock a long tensor-core GEMM settles at).

Usage (on the GPU, repository root, ``$OUT`` the output folder)::

    python3 -m bench.probe_h100 kernels --out "$OUT"
    python3 -m bench.probe_h100 launch --out "$OUT"
    python3 -m bench.probe_h100 clock --out "$OUT"
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the XLA sm_90 table's sizes (../shared/data/real-gemm/xla_sm90_tf32/PROVENANCE.md)
SIZES = (256, 512, 1024, 2048, 4096)
BATCHES = (1, 2, 4)
DTYPES = ("tf32", "bf16", "fp32")
#: the ``launch`` probe's shapes
LAUNCH_SHAPES = (
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (1024, 1024, 4096),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
)
PROFILED_CALLS = 5


def _operands(dtype: str, b: int, m: int, n: int, k: int) -> tuple[Any, Any]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    element = torch.bfloat16 if dtype == "bf16" else torch.float32
    x = torch.randn(b, m, k, device="cuda", dtype=element)
    y = torch.randn(b, k, n, device="cuda", dtype=element)
    return (x[0], y[0]) if b == 1 else (x, y)


def kernels_of(x: Any, y: Any, calls: int = PROFILED_CALLS) -> tuple[float, list[str]]:
    """(device us per call summed over its kernels, ``name x launches per call`` each)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        x @ y
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            x @ y
        torch.cuda.synchronize()
    total, names = 0.0, []
    for event in prof.key_averages():
        device_us = float(getattr(event, "device_time_total", 0.0))
        if device_us > 0 and event.count:
            total += device_us / calls
            short = event.key.split("(")[0].replace("void ", "")[:70].replace(",", ";")
            names.append(f"{short}x{event.count / calls:g}")
    return total, names


def probe_kernels(out: Path) -> None:
    with open(out / "kernels.csv", "w", encoding="utf-8") as f:
        f.write("dtype,b,m,n,k,kernel_us,kernels\n")
        for dtype in DTYPES:
            for b, m, n, k in itertools.product(BATCHES, SIZES, SIZES, SIZES):
                x, y = _operands(dtype, b, m, n, k)
                us, names = kernels_of(x, y)
                f.write(f"{dtype},{b},{m},{n},{k},{us:.3f},{'+'.join(names)}\n")
                f.flush()


def _smi(fields: str) -> str:
    query = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()


def probe_launch(out: Path) -> None:
    import torch

    with open(out / "probe.txt", "w", encoding="utf-8") as f:

        def say(line: str) -> None:
            print(line, file=f, flush=True)
            print(line, flush=True)

        for dtype in DTYPES:
            for m, n, k in LAUNCH_SHAPES:
                x, y = _operands(dtype, 1, m, n, k)
                us, names = kernels_of(x, y, 10)
                say(f"{dtype} {m} {n} {k} kernel_us {us:.2f} {' + '.join(names)}")
        one = torch.zeros(1, device="cuda")
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            for _ in range(3):
                one.add_(1)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(500):
                one.add_(1)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            say(f"graph 1-elem add us/kernel {start.elapsed_time(end) * 1e3 / 500:.3f}")
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(300):
            a @ a
        for _ in range(3):
            say(_smi("clocks.sm,power.draw"))
        torch.cuda.synchronize()


def probe_clock(out: Path) -> None:
    import torch

    lines: list[str] = []

    def sample() -> None:
        for _ in range(12):
            lines.append(_smi("timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"))
            time.sleep(0.2)

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    sampler = threading.Thread(target=sample)
    sampler.start()
    while sampler.is_alive():
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    (out / "clock.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("probe", choices=("kernels", "launch", "clock"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    {"kernels": probe_kernels, "launch": probe_launch, "clock": probe_clock}[args.probe](args.out)


if __name__ == "__main__":
    main()
