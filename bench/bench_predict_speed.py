"""Time of one Many-BSP prediction (parse + analysis + eq. 4-25, the /predict-kernel core) on
a ~1,000-line PTX, this checkout against a baseline checkout, in the same run.

Usage: python -m bench.bench_predict_speed [--baseline /work/main] [--lines 1000]
           [--repeats 15] [--rounds 3] [--device a100]

Both sides run in subprocesses of the same interpreter with their own checkout first on
sys.path, alternating round by round; each round reports the median of ``--repeats`` timed
predictions after one warm-up. The PTX is bench/bench_predict.py's synthetic module (MM loop
body repeated, strided global accesses) cut to ``--lines`` instructions. Reported: each side's
median over the rounds and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SNIPPET = """
import json, statistics, sys, time
sys.path.insert(0, {root!r})
from bench.bench_predict import build_module
from device_profiles import get_profile
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel
ptx = build_module({lines})
req = PredictRequest(ptx=ptx, device=device_from_profile(get_profile({device!r})),
                     grid=(1024, 1, 1), block=(256, 1, 1), registers_per_thread=32)
predict_kernel(req)
times = []
for _ in range({repeats}):
    t = time.perf_counter(); predict_kernel(req); times.append(time.perf_counter() - t)
print(json.dumps({{"median_s": statistics.median(times), "lines": ptx.count(chr(10))}}))
"""


def _time(root: Path, lines: int, repeats: int, device: str) -> tuple[float, int]:
    code = _SNIPPET.format(root=str(root), lines=lines, repeats=repeats, device=device)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return float(data["median_s"]), int(data["lines"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=Path("/work/main"))
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="a100")
    args = parser.parse_args()
    ours, base = [], []
    n_lines = 0
    for _ in range(args.rounds):
        t, n_lines = _time(REPO, args.lines, args.repeats, args.device)
        ours.append(t)
        base.append(_time(args.baseline, args.lines, args.repeats, args.device)[0])
    o, b = statistics.median(ours), statistics.median(base)
    print(
        f"{n_lines}-line PTX on {args.device}: this checkout {1e3 * o:.1f} ms, "
        f"baseline {args.baseline} {1e3 * b:.1f} ms, ratio {o / b:.2f}"
    )


if __name__ == "__main__":
    main()
