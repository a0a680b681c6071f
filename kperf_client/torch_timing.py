"""Plain library timings for calibration: ``torch.matmul`` over a standard shape set.

Each timing is a configuration-less run, "the fastest kernel's time for this shape" as the
library picked it (cuBLAS behind torch), which the service fits as its model's optimum over
the default space. Needs torch and a CUDA GPU on the user's machine; the timer is injectable
so the run-building is tested without either (on recorded timings).
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

#: square and rectangular shapes from 256 to 8192: small shapes pin launch and latency,
#: large ones MATH and bandwidth, skinny ones split-K (24 shapes)
STANDARD_SHAPES: tuple[tuple[int, int, int], ...] = tuple(
    sorted(
        {(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)}
        | {(m, n, k) for m, n, k in itertools.product((512, 4096), (512, 4096), (1024, 8192))}
        | {(s, s, 16384) for s in (256, 1024)}
        | {(16384, 1024, 1024), (1024, 16384, 1024), (8192, 8192, 1024), (64, 4096, 4096)}
        | {(4096, 64, 4096), (128, 128, 65536)}
    )
)
#: torch dtype attribute and TF32 switch per kperf dtype
TORCH_DTYPES: dict[str, tuple[str, bool]] = {
    "fp32": ("float32", False),
    "tf32": ("float32", True),
    "fp16": ("float16", False),
    "bf16": ("bfloat16", False),
}
#: a timer: (m, n, k, kperf dtype) -> repeated kernel times in microseconds
Timer = Callable[[int, int, int, str], Sequence[float]]


def runs_from_timings(
    shapes: Iterable[tuple[int, int, int]], dtype: str, timer: Timer
) -> list[dict[str, Any]]:
    """One configuration-less GeMM-WS run per shape: the median of the timer's repeats."""
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype: one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    runs = []
    for m, n, k in shapes:
        times = [t for t in timer(m, n, k, dtype) if t > 0]
        if not times:
            raise ValueError(f"no positive timing for {m}x{n}x{k}")
        runs.append(
            {
                "m": m,
                "n": n,
                "k": k,
                "dtype": dtype,
                "measured_time_us": statistics.median(times),
            }
        )
    return runs


def write_runs(runs: Sequence[dict[str, Any]], path: Path) -> None:
    """The runs as JSON lines (``kperf calibrate FILE`` reads them back)."""
    lines = (json.dumps({"model": "gemm-ws", **r}) + "\n" for r in runs)
    path.write_text("".join(lines), encoding="utf-8")


def torch_timer(repeats: int = 20, warmup: int = 5) -> Timer:  # pragma: no cover - needs a GPU
    """Times torch.matmul with CUDA events; ImportError / RuntimeError without torch or GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA GPU")

    def timer(m: int, n: int, k: int, dtype: str) -> list[float]:
        name, tf32 = TORCH_DTYPES[dtype]
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(m, k, device="cuda", dtype=getattr(torch, name))
        b = torch.randn(k, n, device="cuda", dtype=getattr(torch, name))
        for _ in range(warmup):
            torch.matmul(a, b)
        out = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) * 1000.0)  # ms -> us
        return out

    return timer
