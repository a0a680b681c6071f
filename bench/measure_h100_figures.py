"""Measure, on a lent H100, the device figures the h100 profile takes from sibling GPUs.

The profile's L2 bandwidth, L2 and DRAM latency and launch time come from RRZE-HPC gpu-benches
runs on an H200 and a GH200 (docs/model-notes.md, "Priors"). This times them on the H100 SXM
itself with the kernels of ``bench/h100_figures.cu`` (built here beforehand: ``nvcc --cubin
-arch=sm_90 -O3 bench/h100_figures.cu -o .gpu/figures.cubin``):

- ``clock``: one thread spins for 2e8 SM cycles (clock64); cycles over the events' time is the
  SM clock while the GPU runs it.
- ``latency``: a pointer chase over a random cycle of 128-byte lines through L2 (``ld.global.cg``),
  buffers 1 MiB-512 MiB; the whole cycle is walked once, then 50,000 further steps are timed;
  cycles per step.
- ``bandwidth``: a full grid (8 blocks of 256 threads per SM) reads 16-byte words of a buffer,
  grid-strided, through L2, 4 MiB-48 MiB repeatedly (L2) and 4 GiB once (DRAM); bytes over the
  events' time, median of 5.
- ``bandwidth_unrolled``: the same with four independent loads in flight per thread.
- ``convert``: u16 -> f32 conversions (the dedispersion kernel's cvt.rn.f32.u16) per SM per
  clock, eight independent chains per thread on a full grid, beside a control loop.
- ``launch``: 2,000 empty kernels back to back, launched one by one and as one CUDA graph; the
  time per kernel.

Usage (on the GPU; cupy): ``python -m bench.measure_h100_figures --out "$OUT"``. Writes
``figures.json`` and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

CUBIN = Path(__file__).resolve().parent.parent / ".gpu" / "figures.cubin"
LINE_BYTES = 128


def _events_ms(cp: Any, launch: Any, repeats: int = 5) -> list[float]:
    start, end = cp.cuda.Event(), cp.cuda.Event()
    launch()
    cp.cuda.runtime.deviceSynchronize()
    out = []
    for _ in range(repeats):
        start.record()
        launch()
        end.record()
        end.synchronize()
        out.append(float(cp.cuda.get_elapsed_time(start, end)))
    return out


def clock(cp: Any, module: Any) -> dict[str, float]:
    spin = module.get_function("spin")
    sink = cp.zeros(1, dtype=cp.int64)
    cycles = 200_000_000
    times = _events_ms(cp, lambda: spin((1,), (1,), (cp.int64(cycles), sink)), repeats=3)
    mhz = cycles / (statistics.median(times) * 1e3)
    return {"sm_clock_mhz": mhz, "spin_cycles": cycles, "spin_ms": statistics.median(times)}


def latency(cp: Any, module: Any, mib: int, rng: Any) -> dict[str, float]:
    import numpy as np

    chase = module.get_function("pointer_chase")
    lines = mib * (1 << 20) // LINE_BYTES
    words = LINE_BYTES // 4
    order = rng.permutation(lines).astype(np.int64)
    host = np.zeros(lines * words, dtype=np.uint32)
    host[order * words] = (np.roll(order, -1) * words).astype(np.uint32)
    data = cp.asarray(host)
    sink = cp.zeros(1, dtype=cp.uint32)
    cycles = cp.zeros(1, dtype=cp.int64)
    timed = 50_000
    chase((1,), (1,), (data, np.int32(lines), np.int32(timed), sink, cycles))
    cp.cuda.runtime.deviceSynchronize()
    per_step = int(cycles.get()[0]) / timed
    del data
    return {"buffer_mib": mib, "cycles_per_load": per_step}


def bandwidth(
    cp: Any, module: Any, mib: int, passes: int, sms: int, kernel: str = "stream_read"
) -> dict[str, float]:
    read = module.get_function(kernel)
    count = mib * (1 << 20) // 16
    data = cp.random.random(count * 4, dtype=cp.float32)
    sink = cp.zeros(1, dtype=cp.float32)
    grid, block = (sms * 8,), (256,)
    times = _events_ms(
        cp, lambda: read(grid, block, (data, cp.int64(count), cp.int32(passes), sink))
    )
    ms = statistics.median(times)
    return {
        "kernel": kernel,
        "buffer_mib": mib,
        "passes": passes,
        "ms": ms,
        "gb_per_s": count * 16 * passes / (ms * 1e-3) / 1e9,
    }


def convert(cp: Any, module: Any, sms: int, mhz: float) -> dict[str, float]:
    """Conversions per SM per clock of ``convert_u16`` (8 per thread per iteration), and the
    control loop's time."""
    threads, blocks, iterations = 256, sms * 8, 4096
    out = cp.zeros(threads * blocks, dtype=cp.float32)
    result: dict[str, float] = {}
    for name in ("convert_u16", "convert_u32", "convert_control"):
        kernel = module.get_function(name)
        args = (cp.uint32(7), cp.int32(iterations), out)
        ms = statistics.median(_events_ms(cp, lambda k=kernel, a=args: k((blocks,), (threads,), a)))
        result[f"{name}_ms"] = ms
        cycles = ms * 1e-3 * mhz * 1e6
        result[f"{name}_per_sm_per_clock"] = threads * blocks * iterations * 8 / sms / cycles
    return result


def launch(cp: Any, module: Any) -> dict[str, float]:
    empty = module.get_function("empty_kernel")
    count = 2000

    def eager() -> None:
        for _ in range(count):
            empty((1,), (32,), ())

    result = {"eager_us": statistics.median(_events_ms(cp, eager)) * 1e3 / count}
    try:
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            for _ in range(count):
                empty((1,), (32,), ())
            graph = stream.end_capture()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(5):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(float(cp.cuda.get_elapsed_time(start, end)))
        result["graph_us"] = statistics.median(times) * 1e3 / count
    except Exception as exc:  # graph capture unsupported: the eager figure stands alone
        result["graph_error"] = repr(exc)[:200]  # type: ignore[assignment]
    return result


def main() -> None:
    import cupy as cp
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", nargs="*", default=None, help="names of the steps to run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    module = cp.RawModule(path=str(CUBIN))
    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = int(props["multiProcessorCount"])
    figures: dict[str, Any] = {
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "multiprocessors": sms,
        "l2_bytes": int(props["l2CacheSize"]),
    }
    steps = [
        ("clock", lambda: clock(cp, module)),
        ("launch", lambda: launch(cp, module)),
        (
            "latency",
            lambda: [
                latency(cp, module, mib, np.random.default_rng(mib))
                for mib in (1, 4, 16, 32, 64, 128, 256, 512)
            ],
        ),
        (
            "bandwidth",
            lambda: (
                [
                    bandwidth(cp, module, mib, max(1, 4096 // mib), sms)
                    for mib in (4, 8, 16, 24, 32, 48)
                ]
                + [bandwidth(cp, module, 4096, 1, sms)]
            ),
        ),  # fmt: skip
        (
            "bandwidth_unrolled",
            lambda: (
                [
                    bandwidth(cp, module, mib, max(1, 4096 // mib), sms, "stream_read_unrolled")
                    for mib in (8, 16, 24, 32)
                ]
                + [bandwidth(cp, module, 4096, 1, sms, "stream_read_unrolled")]
            ),
        ),
        ("convert", lambda: convert(cp, module, sms, figures["clock"]["sm_clock_mhz"])),
        ("clock_after", lambda: clock(cp, module)),
    ]
    for name, step in steps:
        if args.only is not None and name not in args.only:
            continue
        started = time.monotonic()
        try:
            figures[name] = step()
        except Exception as exc:
            figures[name] = {"error": repr(exc)[:300]}
        print(f"{name} ({time.monotonic() - started:.1f} s): {figures[name]}", flush=True)
        (out / "figures.json").write_text(json.dumps(figures, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
