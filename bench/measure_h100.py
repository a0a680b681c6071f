"""Time, on a lent Hopper GPU, what the models predict: library GEMMs, Triton tilings, dedispersion.

One prepared run for the 15 minutes of device time a task may be lent (developers' guide). Three
parts, each under its own deadline so that a slow part cannot starve the others, each writing
its rows to a CSV under ``--out`` as it goes (what a killed run leaves still comes back):

1. ``torch_matmul.csv``: ``torch.matmul`` (cuBLAS) over the 375 shapes of the XLA sm_90 table
   (``../shared/data/real-gemm/xla_sm90_tf32``; b x m x n x k), in tf32 (fp32 operands on the
   tensor cores), bf16 and plain fp32 (FFMA, tf32 off). Warm back-to-back launches, as an
   autotuner times them: a batch of launches long enough for the event resolution, five
   batches, the median per launch.
2. ``dedispersion_h100.csv``: the measured dedispersion kernel
   (``../shared/data/real-kernels/dedispersion``), the configurations that
   ``bench.bench_real_kernels`` samples for the A100, A6000 and A4000 (same seed), built for
   sm_90 here beforehand (``prepare``, nvcc, Kernel Tuner's source) and carried as cubins.
   Kernel Tuner's problem (25,000 samples x 2,048 DMs x 1,536 channels, 8-bit input); shifts from
   the dispersion delay; every output checked against the first configuration's (sums of 8-bit
   values in fp32 are exact, so any order gives the same bits) and three DMs against numpy.
   One warm-up and ``--dedisp-repeats`` timed launches; median and mean.
3. ``triton_sweep.csv``: a blocked Triton matmul with grouped raster (``GROUP_M``) over seeded
   tilings (BLOCK_M/N/K, stages, GROUP_M) and five shapes, bf16 and tf32: the tuning space of
   ``/optimize-tiling`` (tile_m/n/k, buffer_depth, group_m), timed like part 1. Tilings are
   compiled first in a pool of processes sharing Triton's on-disk cache.

Usage::

    python -m bench.measure_h100 prepare                   # here: sm_90 cubins into .gpu/dedisp
    python -m bench.measure_h100 run --out "$OUT"          # there: needs torch, triton, cupy

The command, GPU and raw timings of a real run are committed under ``bench/h100/``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
XLA_CSV = SHARED / "data/real-gemm/xla_sm90_tf32/matmul_f32_sm90.csv"
DEDISP = SHARED / "data/real-kernels/dedispersion"
CARRY = ROOT / ".gpu"
KERNEL = "dedispersion_kernel"
#: Kernel Tuner's problem: samples x DMs x channels (defines.md)
NR_SAMPLES, NR_DMS, NR_CHANNELS, MAX_SHIFT = 25000, 2048, 1536, 650
DM_STEP = 0.02
TUNABLES = (
    "block_size_x", "block_size_y", "block_size_z", "tile_size_x", "tile_size_y",
    "tile_stride_x", "tile_stride_y", "loop_unroll_factor_channel",
)  # fmt: skip
SWEEP_SHAPES = ((4096, 4096, 4096), (1024, 1024, 4096), (2048, 2048, 2048), (4096, 1024, 1024),
                (512, 4096, 2048))  # fmt: skip


#: the second run's sweep: twelve shapes of the XLA grid, square to skinny, short to long k
WIDE_SHAPES = (
    (4096, 4096, 4096),
    (4096, 4096, 1024),
    (4096, 4096, 256),
    (2048, 2048, 4096),
    (1024, 1024, 4096),
    (1024, 4096, 1024),
    (512, 512, 4096),
    (256, 4096, 4096),
    (2048, 2048, 512),
    (1024, 1024, 1024),
    (4096, 512, 2048),
    (2048, 4096, 2048),
)


def log(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


# ---------------------------------------------------------------------------------- prepare


def dedispersion_sample(seed: int = 20251127, per_gpu: int = 150) -> list[dict[str, int]]:
    """The union of the configurations bench_real_kernels samples per GPU (same seed rule)."""
    seen: dict[tuple[int, ...], dict[str, int]] = {}
    for gpu in ("A100", "A6000", "A4000"):
        with open(DEDISP / f"dedispersion_{gpu}.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        for r in random.Random(f"{seed}:{gpu}").sample(rows, per_gpu):
            params = {k: int(r[k]) for k in TUNABLES}
            seen.setdefault(tuple(params.values()), params)
    return list(seen.values())


def grid_of(params: dict[str, int]) -> tuple[int, int, int]:
    """Kernel Tuner's default grid: problem size over the block size (PROVENANCE, Grid)."""
    return (
        math.ceil(NR_SAMPLES / params["block_size_x"]),
        math.ceil(NR_DMS / params["block_size_y"]),
        1,
    )


def config_name(params: dict[str, int]) -> str:
    return "_".join(str(params[k]) for k in TUNABLES)


def prepare(jobs: int) -> None:
    """Build every sampled configuration for sm_90 as Kernel Tuner would, into .gpu/dedisp."""
    from kperf_client.kt_geometry import kernel_tuner_source

    out = CARRY / "dedisp"
    out.mkdir(parents=True, exist_ok=True)
    text = (DEDISP / "dedispersion.cu").read_text(encoding="utf-8")
    sample = dedispersion_sample()

    def build(params: dict[str, int]) -> str:
        name = config_name(params)
        cubin = out / f"{name}.cubin"
        if cubin.is_file():
            return name
        grid = grid_of(params)
        block = (params["block_size_x"], params["block_size_y"], 1)
        cu = out / f"{name}.cu"
        cu.write_text(kernel_tuner_source(text, params, grid, block), encoding="utf-8")
        subprocess.run(
            ["nvcc", "--cubin", "-arch=sm_90", f"-I{DEDISP}", "-e", KERNEL, str(cu),
             "-o", str(cubin)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        cu.unlink()
        return name

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        names = list(pool.map(build, sample))
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*TUNABLES, "grid_x", "grid_y", "grid_z", "cubin"])
        for params, name in zip(sample, names, strict=True):
            writer.writerow([*params.values(), *grid_of(params), f"{name}.cubin"])
    xla = CARRY / "xla_shapes.csv"
    xla.write_bytes(XLA_CSV.read_bytes())  # the carried tree has no ../shared
    print(f"{len(names)} cubins in {out}; shapes in {xla}")


# -------------------------------------------------------------------------------------- run


class Table:
    """A CSV written row by row, flushed, so a killed run keeps what it measured."""

    def __init__(self, path: Path, header: Sequence[str]) -> None:
        self.file = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115
        self.writer = csv.writer(self.file)
        self.writer.writerow(header)
        self.rows = 0

    def write(self, row: Sequence[object]) -> None:
        self.writer.writerow(row)
        self.file.flush()
        self.rows += 1


def time_back_to_back(
    launch: Callable[[], Any], *, target_ms: float = 2.0, batches: int = 5
) -> tuple[float, float, int]:
    """Median and min microseconds per launch over ``batches`` replays of a CUDA graph of
    back-to-back launches, the graph long enough (``target_ms``) for the events' resolution.
    A graph, so that the host's launch cost (5-30 us in Python) does not stand in for short
    kernels; eager launches where capture fails (count then negative in the output)."""
    import torch

    launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    launch()
    end.record()
    end.synchronize()
    once_ms = max(float(start.elapsed_time(end)), 1e-3)
    count = max(1, min(400, math.ceil(target_ms / once_ms)))
    run: Callable[[], Any]
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            launch()  # warm the side stream (cuBLAS workspace) before capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(count):
                launch()
        run = graph.replay
        graph.replay()
    except Exception:
        torch.cuda.synchronize()

        def run() -> None:
            for _ in range(count):
                launch()

        count = -count
    torch.cuda.synchronize()
    per_launch = []
    for _ in range(batches):
        start.record()
        run()
        end.record()
        end.synchronize()
        per_launch.append(1000.0 * float(start.elapsed_time(end)) / abs(count))
    return statistics.median(per_launch), min(per_launch), count


def part_torch(out: Path, deadline: float) -> None:
    import torch

    with open(CARRY / "xla_shapes.csv", newline="", encoding="utf-8") as f:
        shapes = [(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"])) for r in csv.DictReader(f)]
    table = Table(
        out / "torch_matmul.csv",
        ["dtype", "b", "m", "n", "k", "median_us", "min_us", "launches_per_batch"],
    )
    modes = (("tf32", torch.float32, True), ("bf16", torch.bfloat16, False),
             ("fp32", torch.float32, False))  # fmt: skip
    for name, dtype, tf32 in modes:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for b, m, n, k in shapes:
            if time.monotonic() > deadline:
                log("torch: deadline reached at", table.rows, "rows")
                return
            a = (
                torch.randn((b, m, k), device="cuda", dtype=dtype)
                if b > 1
                else torch.randn((m, k), device="cuda", dtype=dtype)
            )
            w = (
                torch.randn((b, k, n), device="cuda", dtype=dtype)
                if b > 1
                else torch.randn((k, n), device="cuda", dtype=dtype)
            )
            c = torch.matmul(a, w)
            ref = torch.matmul(a.double(), w.double())
            err = float((c.double() - ref).norm() / ref.norm())
            if not math.isfinite(err) or err > 2e-2:
                log("torch: wrong result", name, b, m, n, k, err)
                continue
            median_us, min_us, count = time_back_to_back(lambda a=a, w=w: torch.matmul(a, w))
            table.write([name, b, m, n, k, f"{median_us:.3f}", f"{min_us:.3f}", count])
        log("torch:", name, "done,", table.rows, "rows")
    torch.backends.cuda.matmul.allow_tf32 = False


def dispersion_shifts() -> Any:
    """Samples of delay per unit DM for each channel: k_DM (f^-2 - f_top^-2) / t_sample with
    k_DM = 4148.808 MHz^2 pc^-1 cm^3 s, channels from 1425 MHz in 0.1953125 MHz steps and a
    40.96 us sample (the tuning problem's observation setup, PROVENANCE)."""
    import numpy as np

    freqs = 1425.0 + np.arange(NR_CHANNELS, dtype=np.float64) * 0.1953125
    delay = 4148.808 * (freqs**-2 - freqs[-1] ** -2) / 0.00004096
    delay[-1] = 0.0
    return delay.astype(np.float32)


def numpy_dedispersion(data: Any, shifts: Any, dm: int) -> Any:
    """One DM row of the kernel's output, on the host, in the kernel's float32 arithmetic."""
    import numpy as np

    dm_value = np.float32(0.0) + np.float32(dm) * np.float32(DM_STEP)
    shift = (dm_value * shifts).astype(np.uint32)  # (dm_first + dm * dm_step) * shifts[c]
    per_channel = NR_SAMPLES + MAX_SHIFT
    rows = data.reshape(NR_CHANNELS, per_channel)
    idx = np.arange(NR_SAMPLES)[None, :] + shift[:, None].astype(np.int64)
    return np.take_along_axis(rows, idx, axis=1).astype(np.float32).sum(axis=0)


def part_dedispersion(out: Path, deadline: float, repeats: int) -> None:
    import cupy as cp
    import numpy as np

    folder = CARRY / "dedisp"
    with open(folder / "manifest.csv", newline="", encoding="utf-8") as f:
        configs = list(csv.DictReader(f))
    rng = np.random.default_rng(20261127)
    host_input = rng.integers(0, 256, size=(NR_SAMPLES + MAX_SHIFT) * NR_CHANNELS, dtype=np.uint8)
    shifts = dispersion_shifts()
    assert MAX_SHIFT > (NR_DMS * DM_STEP) * shifts[0]
    d_input = cp.asarray(host_input)
    d_shifts = cp.asarray(shifts)
    d_output = cp.empty(NR_DMS * NR_SAMPLES, dtype=cp.float32)
    reference: Any = None
    table = Table(out / "dedispersion_h100.csv",
                  [*TUNABLES, "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                   "time_ms", "mean_ms", "min_ms", "repeats", "registers"])  # fmt: skip
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for i, row in enumerate(configs):
        if time.monotonic() > deadline:
            log("dedispersion: deadline reached at", table.rows, "of", len(configs))
            return
        module = cp.RawModule(path=str(folder / row["cubin"]))
        kernel = module.get_function(KERNEL)
        grid = (int(row["grid_x"]), int(row["grid_y"]), 1)
        block = (int(row["block_size_x"]), int(row["block_size_y"]), 1)
        d_output.fill(cp.nan)
        kernel(grid, block, (d_input, d_output, d_shifts))
        cp.cuda.runtime.deviceSynchronize()
        if reference is None:
            reference = d_output.copy()
            host = cp.asnumpy(reference).reshape(NR_DMS, NR_SAMPLES)
            for dm in (0, 1000, NR_DMS - 1):
                expect = numpy_dedispersion(host_input, shifts, dm)
                if not np.array_equal(host[dm], expect):
                    log(
                        "dedispersion: numpy check failed at dm",
                        dm,
                        float(np.abs(host[dm] - expect).max()),
                    )
            log("dedispersion: reference from", row["cubin"])
        elif not bool(cp.array_equal(d_output, reference)):
            log("dedispersion: output differs for", row["cubin"])
            continue
        times = []
        for _ in range(repeats):
            start.record()
            kernel(grid, block, (d_input, d_output, d_shifts))
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        table.write([*(row[k] for k in TUNABLES), *grid, *block,
                     f"{statistics.median(times):.4f}", f"{statistics.fmean(times):.4f}",
                     f"{min(times):.4f}", repeats, getattr(kernel, "num_regs", "")])  # fmt: skip
        if i % 50 == 0:
            log(f"dedispersion: {i + 1}/{len(configs)} {row['cubin']} "
                f"{statistics.median(times):.2f} ms")  # fmt: skip
    log("dedispersion: done,", table.rows, "rows")


def sweep_tilings(dtype: str, count: int, seed: int, shared_bytes: int) -> list[tuple[int, ...]]:
    """``count`` seeded (BLOCK_M, BLOCK_N, BLOCK_K, stages, GROUP_M, warps) that fit."""
    element = 2 if dtype == "bf16" else 4
    space = []
    for bm in (64, 128, 256):
        for bn in (64, 128, 256):
            if bm * bn > 256 * 128:
                continue  # 256 x 256 fp32 accumulators spill at 8 warps
            for bk in (32, 64, 128):
                for stages in (2, 3, 4, 5):
                    if stages * (bm + bn) * bk * element > shared_bytes:
                        continue
                    for group in (1, 8):
                        warps = 8 if bm * bn >= 128 * 128 else 4
                        space.append((bm, bn, bk, stages, group, warps))
    return random.Random(f"{seed}:{dtype}").sample(space, min(count, len(space)))


def _triton_matmul() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
               stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
        # Grouped raster: GROUP_M rows of tiles are walked column by column, so the programs
        # running together share A row panels and B column panels in L2 (GROUP_M = 1 is plain
        # row-major order). Shapes are multiples of the tiles: no masks.
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        band = GROUP_M * tiles_n
        first_m = (pid // band) * GROUP_M
        rows = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % band) % rows
        pid_n = (pid % band) // rows
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K // BLOCK_K):
            acc += tl.dot(tl.load(a_ptrs), tl.load(b_ptrs))
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))

    return matmul


def _operands(dtype: str, m: int, n: int, k: int) -> tuple[Any, Any, Any]:
    import torch

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn((m, k), device="cuda", dtype=torch_dtype)
    b = torch.randn((k, n), device="cuda", dtype=torch_dtype)
    return a, b, torch.empty((m, n), device="cuda", dtype=torch_dtype)


def _launcher(kernel: Any, tiling: tuple[int, ...], a: Any, b: Any, c: Any) -> Callable[[], Any]:
    bm, bn, bk, stages, group, warps = tiling
    m, k = a.shape
    n = b.shape[1]
    grid = ((m // bm) * (n // bn),)

    def launch() -> Any:
        return kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                            b.stride(1), c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn,
                            BLOCK_K=bk, GROUP_M=group, num_stages=stages,
                            num_warps=warps)  # fmt: skip

    return launch


def _compile_worker(job: tuple[str, list[tuple[int, ...]]]) -> int:
    """Compile tilings into Triton's on-disk cache by launching each once on a small shape
    with the sweep's specialisation (every size and stride a multiple of 16)."""
    dtype, tilings = job
    kernel = _triton_matmul()
    done = 0
    for tiling in tilings:
        try:
            a, b, c = _operands(dtype, 512, 512, 512)
            _launcher(kernel, tiling, a, b, c)()
            done += 1
        except Exception:  # resources the compiler refuses: the main pass records them
            pass
    return done


def part_triton(
    out: Path, deadline: float, per_dtype: int, workers: int, shapes: Sequence[tuple[int, ...]]
) -> None:
    import multiprocessing

    import torch

    props = torch.cuda.get_device_properties(0)
    shared = int(getattr(props, "shared_memory_per_block_optin", 0) or 232448)
    plans = {d: sweep_tilings(d, per_dtype, 0, shared) for d in ("bf16", "tf32")}
    jobs = [(d, plans[d][i::workers]) for d in plans for i in range(workers)]
    started = time.monotonic()
    try:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            compiled = sum(pool.map(_compile_worker, jobs))
        log(f"triton: {compiled} tilings compiled in {time.monotonic() - started:.0f} s")
    except Exception:
        log("triton: compile pool failed; compiling in the timing pass\n" + traceback.format_exc())
    kernel = _triton_matmul()
    table = Table(
        out / "triton_sweep.csv",
        [
            "dtype",
            "m",
            "n",
            "k",
            "block_m",
            "block_n",
            "block_k",
            "stages",
            "group_m",
            "num_warps",
            "median_us",
            "min_us",
            "launches_per_batch",
            "error",
        ],
    )
    for dtype, tilings in plans.items():
        for m, n, k in shapes:
            a, b, c = _operands(dtype, m, n, k)
            ref = torch.matmul(a.double(), b.double())
            for tiling in tilings:
                if time.monotonic() > deadline:
                    log("triton: deadline reached at", table.rows, "rows")
                    return
                launch = _launcher(kernel, tiling, a, b, c)
                try:
                    c.fill_(float("nan"))
                    launch()
                    err = float((c.double() - ref).norm() / ref.norm())
                    if not math.isfinite(err) or err > 2e-2:
                        raise RuntimeError(f"relative error {err}")
                    median_us, min_us, count = time_back_to_back(launch)
                    table.write([dtype, m, n, k, *tiling, f"{median_us:.3f}", f"{min_us:.3f}",
                                 count, ""])  # fmt: skip
                except Exception as exc:
                    table.write([dtype, m, n, k, *tiling, "", "", 0,
                                 f"{type(exc).__name__}: {str(exc)[:120]}"])  # fmt: skip
            log("triton:", dtype, (m, n, k), "done")


def device_report(out: Path) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    info = {
        "name": props.name,
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "shared_memory_per_block_optin": getattr(props, "shared_memory_per_block_optin", None),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        pass
    (out / "device.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    log(info)


def nvidia_smi(out: Path, tag: str) -> None:
    query = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
    result = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"],
                            capture_output=True, text=True, check=False)  # fmt: skip
    with open(out / "nvidia_smi.txt", "a", encoding="utf-8") as f:
        f.write(f"# {tag} {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n{result.stdout}{result.stderr}")


def guarded(name: str, body: Callable[[], None]) -> None:
    started = time.monotonic()
    try:
        body()
    except Exception:
        log(f"{name}: failed\n" + traceback.format_exc())
    log(f"{name}: {time.monotonic() - started:.0f} s")


def parts(args: argparse.Namespace) -> Iterator[tuple[str, float, Callable[[float], None]]]:
    out = Path(args.out)
    yield "torch", args.torch_s, lambda d: part_torch(out, d)
    yield "dedispersion", args.dedisp_s, lambda d: part_dedispersion(out, d, args.dedisp_repeats)
    shapes = WIDE_SHAPES if args.wide else SWEEP_SHAPES
    yield (
        "triton",
        args.triton_s,
        lambda d: part_triton(out, d, args.per_dtype, args.workers, shapes),
    )


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    nvidia_smi(out, "before")
    guarded("device", lambda: device_report(out))
    for name, budget_s, body in parts(args):
        if name in args.skip:
            continue
        deadline = time.monotonic() + budget_s
        guarded(name, lambda body=body, deadline=deadline: body(deadline))  # type: ignore[misc]
        nvidia_smi(out, f"after {name}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build the sm_90 cubins and carry the shapes (no GPU)")
    prep.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    go = sub.add_parser("run", help="time everything (needs a CUDA GPU)")
    go.add_argument("--out", required=True)
    go.add_argument("--torch-s", type=float, default=75.0, help="deadline of part 1, seconds")
    go.add_argument("--dedisp-s", type=float, default=100.0, help="deadline of part 2, seconds")
    go.add_argument("--triton-s", type=float, default=130.0, help="deadline of part 3, seconds")
    go.add_argument("--dedisp-repeats", type=int, default=3)
    go.add_argument("--per-dtype", type=int, default=60, help="Triton tilings per dtype")
    go.add_argument("--workers", type=int, default=12, help="Triton compile processes")
    go.add_argument("--wide", action="store_true", help="the sweep over WIDE_SHAPES")
    go.add_argument("--skip", nargs="*", default=[], choices=["torch", "dedispersion", "triton"])
    args = p.parse_args(argv)
    if args.command == "prepare":
        prepare(args.jobs)
    else:
        run(args)


if __name__ == "__main__":
    main()
