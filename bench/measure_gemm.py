"""Time a real tiled GEMM on a GPU and write GeMM-WS measurements as JSON Lines.

The kernel is Triton's blocked matmul (one program per BLOCK_M x BLOCK_N output tile, a loop
over K in BLOCK_K steps, ``num_stages`` software-pipelined loads): BLOCK_M/N/K are the
model's tile_m/n/k and ``num_stages`` its buffer_depth (1 = no pipelining). Each
(shape, tiling, stages) pair is compiled, checked once against torch.matmul, warmed up, then
timed with CUDA events, one event pair per launch; the median is written. Pairs the compiler
refuses (out of shared memory or registers) are skipped and counted.

Usage (needs a CUDA GPU with torch and triton installed)::

    python -m bench.measure_gemm --out gemm.jsonl               # 240 pairs, fp16
    python -m bench.measure_gemm --dry-run                      # print the plan only (no GPU)

Then calibrate: ``perfmodel.calibration.load_gemm_ws_jsonl(Path("gemm.jsonl"))`` and
``fit_gemm_ws(base, measurements)``. See docs/model-notes.md, "Calibration", for what the
model does not capture of such a kernel (it is not warp-specialized).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: dtypes this script can time, as the model names them (ELEMENT_BYTES keys); fp8 needs a
#: different kernel (scaled dot) and is left out
DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4}
TILES_MN = (16, 32, 64, 128, 256)
TILES_K = (16, 32, 64, 128)
STAGES = (1, 2, 3, 4, 5)


@dataclass(frozen=True, slots=True)
class Config:
    """One timed run: problem (m, n, k), tiles and pipeline stages, warps per program."""

    m: int
    n: int
    k: int
    tile_m: int
    tile_n: int
    tile_k: int
    stages: int
    num_warps: int


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSONL file to write (required unless --dry-run)")
    p.add_argument("--pairs", type=int, default=240, help="(shape, tiling, stages) pairs to plan")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--repeats", type=int, default=50, help="timed launches per pair (median)")
    p.add_argument("--warmup", type=int, default=10, help="untimed launches before timing")
    p.add_argument("--seed", type=int, default=0, help="seed of the plan")
    p.add_argument("--min-dim", type=int, default=256, help="smallest M, N, K")
    p.add_argument("--max-dim", type=int, default=8192, help="largest M, N, K")
    p.add_argument(
        "--shared-memory-bytes",
        type=int,
        default=None,
        help="plan only pairs whose buffers fit this many bytes (default: the GPU's opt-in "
        "limit per block; 101376, the A6000's, with --dry-run)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU)")
    args = p.parse_args(argv)
    if not args.dry_run and not args.out:
        p.error("--out is required unless --dry-run")
    for name in ("pairs", "repeats", "min_dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be at least 0")
    if args.max_dim < args.min_dim:
        p.error("--max-dim must be at least --min-dim")
    return args


def num_warps_for(tile_m: int, tile_n: int) -> int:
    """Warps per program: 8 for tiles of 128 x 128 outputs or more, else 4 (Triton's usual)."""
    return 8 if tile_m * tile_n >= 128 * 128 else 4


def stage_bytes(config: Config, element_bytes: int) -> int:
    """Shared memory of the pipeline as the model counts it: stages x (A tile + B tile)."""
    per_stage = config.tile_m * config.tile_k + config.tile_k * config.tile_n
    return config.stages * per_stage * element_bytes


def plan(
    pairs: int,
    *,
    seed: int,
    dtype: str,
    shared_memory_bytes: int,
    min_dim: int = 256,
    max_dim: int = 8192,
) -> list[Config]:
    """``pairs`` distinct configurations: M, N, K log-uniform multiples of 128 (or of
    ``min_dim`` if smaller) in [min_dim, max_dim], tiles and stages uniform, buffers within
    ``shared_memory_bytes``. Deterministic in ``seed``."""
    rng = random.Random(seed)
    step = min(128, min_dim)

    def dim() -> int:
        value = math.exp(rng.uniform(math.log(min_dim), math.log(max_dim)))
        return min(max_dim, max(min_dim, round(value / step) * step))

    out: list[Config] = []
    seen: set[Config] = set()
    attempts = 0
    while len(out) < pairs:
        attempts += 1
        if attempts > 1000 * pairs:
            raise ValueError(
                f"only {len(out)} configurations fit {shared_memory_bytes} bytes of shared "
                "memory; lower --pairs or raise --shared-memory-bytes"
            )
        tm, tn = rng.choice(TILES_MN), rng.choice(TILES_MN)
        config = Config(
            dim(),
            dim(),
            dim(),
            tm,
            tn,
            rng.choice(TILES_K),
            rng.choice(STAGES),
            num_warps_for(tm, tn),
        )
        if config in seen or stage_bytes(config, DTYPES[dtype]) > shared_memory_bytes:
            continue
        seen.add(config)
        out.append(config)
    return out


def format_record(
    config: Config, dtype: str, times_ms: Sequence[float], meta: dict[str, Any]
) -> str:
    """One JSONL line: a GeMM-WS measurement (median time in microseconds) plus ``meta``."""
    if not times_ms:
        raise ValueError("no timings to summarise")
    times_us = [t * 1000 for t in times_ms]
    record = {
        "model": "gemm-ws",
        "m": config.m,
        "n": config.n,
        "k": config.k,
        "dtype": dtype,
        "tile_m": config.tile_m,
        "tile_n": config.tile_n,
        "tile_k": config.tile_k,
        "buffer_depth": config.stages,
        "measured_time_us": statistics.median(times_us),
        "meta": {
            "num_warps": config.num_warps,
            "repeats": len(times_us),
            "min_us": min(times_us),
            "max_us": max(times_us),
            **meta,
        },
    }
    return json.dumps(record)


@functools.cache
def _matmul_kernel() -> Any:
    """Triton's blocked matmul (imports triton only when a GPU run needs it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def matmul(
        a_ptr, b_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        pid_m = pid // tl.cdiv(N, BLOCK_N)
        pid_n = pid % tl.cdiv(N, BLOCK_N)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - step * BLOCK_K
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)

    return matmul


def _time_config(config: Config, dtype: str, repeats: int, warmup: int) -> list[float]:
    """Milliseconds of ``repeats`` launches (CUDA events), after a correctness check."""
    import torch
    import triton

    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    a = torch.randn((config.m, config.k), device="cuda", dtype=torch_dtype)
    b = torch.randn((config.k, config.n), device="cuda", dtype=torch_dtype)
    c = torch.empty((config.m, config.n), device="cuda", dtype=torch_dtype)
    kernel = _matmul_kernel()
    grid = (triton.cdiv(config.m, config.tile_m) * triton.cdiv(config.n, config.tile_n),)

    def launch() -> None:
        kernel[grid](
            a, b, c, config.m, config.n, config.k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            BLOCK_M=config.tile_m, BLOCK_N=config.tile_n, BLOCK_K=config.tile_k,
            num_stages=config.stages, num_warps=config.num_warps,
        )  # fmt: skip

    launch()
    reference = torch.matmul(a.float(), b.float())
    tolerance = 1e-2 * math.sqrt(config.k) * float(reference.abs().max())
    if float((c.float() - reference).abs().max()) > tolerance:
        raise RuntimeError(f"wrong result for {config}")
    for _ in range(warmup):
        launch()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return times


def _device_meta() -> tuple[dict[str, Any], int]:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    limit = int(getattr(props, "shared_memory_per_block_optin", 0) or 49152)
    meta = {"gpu": props.name, "torch": torch.__version__, "triton": triton.__version__}
    return meta, limit


def run(
    args: argparse.Namespace,
    time_config: Callable[[Config, str, int, int], list[float]] = _time_config,
    device_meta: Callable[[], tuple[dict[str, Any], int]] = _device_meta,
) -> int:
    """Measure the plan and write the JSONL file; returns the number of pairs written.
    ``time_config`` and ``device_meta`` are the GPU parts (replaceable in tests)."""
    meta, limit = device_meta()
    configs = plan(
        args.pairs,
        seed=args.seed,
        dtype=args.dtype,
        shared_memory_bytes=args.shared_memory_bytes or limit,
        min_dim=args.min_dim,
        max_dim=args.max_dim,
    )
    written, skipped = 0, []
    with open(args.out, "w", encoding="utf-8") as out:
        for i, config in enumerate(configs, start=1):
            try:
                times = time_config(config, args.dtype, args.repeats, args.warmup)
            except Exception as exc:  # the compiler refuses some tilings (resources)
                skipped.append(f"{config}: {type(exc).__name__}: {exc}")
                continue
            out.write(format_record(config, args.dtype, times, meta) + "\n")
            out.flush()
            written += 1
            print(f"[{i}/{len(configs)}] {config} {statistics.median(times) * 1000:.1f} us")
    print(f"wrote {written} measurements to {args.out}; skipped {len(skipped)}")
    for line in skipped:
        print("  skipped", line, file=sys.stderr)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        configs = plan(
            args.pairs,
            seed=args.seed,
            dtype=args.dtype,
            shared_memory_bytes=args.shared_memory_bytes or 101376,
            min_dim=args.min_dim,
            max_dim=args.max_dim,
        )
        for c in configs:
            print(json.dumps(asdict(c)))
        print(f"{len(configs)} pairs planned ({args.dtype}); nothing timed", file=sys.stderr)
        return 0
    written = run(args)
    return 0 if written >= min(200, args.pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
