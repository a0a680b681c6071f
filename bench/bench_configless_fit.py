"""Wall time of a configuration-less calibration of 16 runs (speed target: <= 10 s).

Usage: python -m bench.bench_configless_fit [--repeats 3] [--record]

The 16 runs are unbatched XLA sm_90 TF32 shapes (seed 0; POST /calibrate has no batch), fitted
on the h100 profile two ways in the same run: POST /calibrate over HTTP (an in-process service
with one calibration worker: validation, the worker's fit, the stored profile) and the core's fit
alone (perfmodel.calibration.configless.fit), and its CPU time again with scipy's differences of
the whole objective for its Jacobian (``envelope_jacobian=False``). Medians over the repeats;
CPU time of the direct fit (this process) and of the HTTP fits (the worker processes, read when
they exit); the machine's load average beside them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from bench.bench_real import xla
from bench.common import command_line, record_results
from perfmodel.calibration.configless import LibraryRun, fit


def _body(runs: list[LibraryRun], repeat: int) -> dict[str, Any]:
    measurements = [
        {"m": r.m, "n": r.n, "k": r.k, "dtype": r.dtype, "measured_time_us": r.measured_time_us}
        for r in runs
    ]
    # a name per repeat: each request fits and stores (the same runs make the same id)
    return {
        "model": "gemm-ws",
        "base_device": "h100",
        "measurements": measurements,
        "name": f"bench-{repeat}",
    }


def _descendants_cpu_s() -> float:
    """CPU seconds (user + system) of the live processes descended from this one (Linux
    /proc): the service's workers run under a forkserver, so no wait() of ours reaps them."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    me, total = os.getpid(), 0.0
    for pid in parents:
        ancestor = parents[pid]
        while ancestor not in (0, 1, me) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == me:
            total += cpu[pid]
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--record", action="store_true", help="replace its section of bench/RESULTS.md"
    )
    args = parser.parse_args()
    case = xla()
    unbatched = [r for r in case.runs if r.batch == 1]
    order = list(range(len(unbatched)))
    random.Random(0).shuffle(order)
    train = [unbatched[i] for i in order[:16]]

    direct, direct_cpu, whole_cpu = [], [], []
    for _ in range(args.repeats):
        started, cpu = time.perf_counter(), time.process_time()
        fit(train, case.device)
        direct.append(time.perf_counter() - started)
        direct_cpu.append(time.process_time() - cpu)
        cpu = time.process_time()
        fit(train, case.device, envelope_jacobian=False)
        whole_cpu.append(time.process_time() - cpu)

    http, http_cpu = [], []
    settings = Settings(workers=1, log_level="WARNING", cache_path=None)
    with TestClient(create_app(settings)) as client:
        for repeat in range(args.repeats):
            started, cpu = time.perf_counter(), _descendants_cpu_s() + time.process_time()
            response = client.post("/calibrate", json=_body(train, repeat))
            http.append(time.perf_counter() - started)
            http_cpu.append(_descendants_cpu_s() + time.process_time() - cpu)
            response.raise_for_status()
            assert len(response.json()["configless_runs"]) == 16

    def listed(times: list[float]) -> str:
        return ", ".join(f"{t:.1f}" for t in times)

    report = (
        f"command: {command_line()}\n"
        f"POST /calibrate, 16 configuration-less runs: {statistics.median(http):.1f} s wall "
        f"(median of {args.repeats}: {listed(http)}), {statistics.median(http_cpu):.1f} s CPU "
        f"(service and its workers)\n"
        f"core fit alone, same runs: {statistics.median(direct):.1f} s wall "
        f"(median of {args.repeats}: {listed(direct)}), "
        f"{statistics.median(direct_cpu):.1f} s CPU; with scipy's differences of the whole "
        f"objective instead of the optimum's: {statistics.median(whole_cpu):.1f} s CPU "
        f"(median of {args.repeats}: {listed(whole_cpu)})\n"
        f"HTTP / core wall ratio: {statistics.median(http) / statistics.median(direct):.2f}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(report)
    if args.record:
        record_results(
            "Calibration",
            command_line(),
            "Speed target <= 10 s: POST /calibrate end to end beside the core's fit, same "
            f"run:\n\n```\n{report}\n```",
            "Configuration-less calibration of 16 runs",
        )


if __name__ == "__main__":
    main()
