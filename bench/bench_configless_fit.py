"""Wall time of a configuration-less calibration of 16 runs (issue 24's speed target, <= 10 s).

Usage: python -m bench.bench_configless_fit [--repeats 3]

The 16 runs are the XLA sm_90 TF32 shapes bench_real trains on (seed 0), fitted on the h100
profile (perfmodel.calibration.configless.fit: geometry of each run, shortlist, MAP fit).
Median wall time over the repeats; the machine's load average is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from bench.bench_real import xla
from bench.common import command_line
from perfmodel.calibration.configless import fit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    case = xla()
    order = list(range(len(case.runs)))
    random.Random(0).shuffle(order)
    train = [case.runs[i] for i in order[:16]]
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        fit(train, case.device)
        times.append(time.perf_counter() - started)
    print(f"command: {command_line()}")
    print(
        f"16 configuration-less runs fitted in {statistics.median(times):.1f} s (median of "
        f"{args.repeats}: {', '.join(f'{t:.1f}' for t in times)}); "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
