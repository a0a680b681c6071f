"""Kernel Tuner in simulation mode on real Xgemm caches: evaluations until a configuration
within 3 % of the cache's best, for kperf's strategy and Kernel Tuner's own (the plug-in must
pay its way).

Usage: python -m bench.bench_kernel_tuner [--gpus RTX_3090,...] [--seeds 20] [--budget 1000]
           [--strategies kperf,random_sample,genetic_algorithm,...]

Data: ``../shared/data/real-gemm/kt_xgemm_sgemm4096/xgemm_sgemm4096_all.csv`` (read in place,
never copied into the repo; PROVENANCE.md there): CLBlast's Xgemm, SGEMM 4096^3, brute-force
Kernel Tuner caches of the RTX 3090, RTX 2080 Ti and TITAN RTX (17,955 configurations each)
and 4,163 configurations measured on an A100-PCIE-40GB (time-limited random runs: the search
space here is the configurations measured); on request (``--gpus RTX_3060_laptop``) the
9,999 configurations of an RTX 3060 Laptop's partial cache. Each GPU's rows become a Kernel
Tuner cache file in a temporary directory and ``tune_kernel(..., simulation_mode=True)``
replays it: every strategy evaluates through Kernel Tuner's own runner, budget and cache.

kperf's strategy (``kperf_client.kernel_tuner.KperfStrategy``) runs against a fresh in-process
service per seed (memory store: a fresh device, no runs of another seed), starting from the
closest shipped profile's priors (PROFILES) and feeding the simulated times back to it.
Reported per strategy: over the seeds, the median and p90 of the unique evaluations until the
first configuration within 3 % of the cache's best ("> budget" when not found), and how many
seeds found one.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "real-gemm" / "kt_xgemm_sgemm4096"
CSV = DATA / "xgemm_sgemm4096_all.csv"
#: the tune parameters of the caches (PRECISION, GEMMK, KREG are constants there)
PARAMS = (
    *("MWG", "NWG", "KWG", "MDIMC", "NDIMC", "MDIMA", "NDIMB", "KWI"),
    *("VWM", "VWN", "STRM", "STRN", "SA", "SB"),
)
#: CLBlast's Xgemm constraints (as in Kernel Tuner's gemm example): they prune the product
#: before the membership test, which alone is slow on the A100's 663,552-point product
XGEMM_RESTRICTIONS = [
    "KWG % KWI == 0",
    "MWG % (MDIMC*VWM) == 0",
    "NWG % (NDIMC*VWN) == 0",
    "MWG % (MDIMA*VWM) == 0",
    "NWG % (NDIMB*VWN) == 0",
    "KWG % ((MDIMC*NDIMC)/MDIMA) == 0",
    "KWG % ((MDIMC*NDIMC)/NDIMB) == 0",
]
#: the closest shipped profile: GA102 (3090) is the A6000's die; Turing (sm_75) is nearest
#: to Volta (sm_70) among the shipped ones; the A100 has its own; the 3060 Laptop (GA106)
#: is Ampere sm_86 like the A6000
PROFILES = {
    "RTX_3090": "rtx-a6000",
    "RTX_2080_Ti": "v100",
    "RTX_Titan": "v100",
    "A100": "a100",
    "RTX_3060_laptop": "rtx-a6000",
}
#: the four caches of the recorded rows (the 3060 Laptop's partial cache on request)
GPUS = ("RTX_3090", "RTX_2080_Ti", "RTX_Titan", "A100")
BUILTIN = ("random_sample", "genetic_algorithm", "simulated_annealing", "pso", "firefly_algorithm")
TOLERANCE = 0.03
#: evaluations between refits of the strategy's device (each refit and re-rank costs seconds
#: of the in-process service's CPU, which this shared machine does not have to spare)
RECALIBRATE_EVERY = 100
SIZE = 4096


@dataclass
class Space:
    """One GPU's cache: the tune parameters, every configuration's time (ms), the cache file."""

    gpu: str
    tune_params: dict[str, list[int]]
    time_ms: dict[tuple[int, ...], float]
    cache_path: Path

    @property
    def best_ms(self) -> float:
        return min(self.time_ms.values())


def load_space(gpu: str, directory: Path) -> Space:
    """The GPU's rows of the derived CSV as a Kernel Tuner cache file in ``directory``."""
    time_ms: dict[tuple[int, ...], float] = {}
    device_name = ""
    with open(CSV, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["gpu"] != gpu:
                continue
            device_name = row["device_name"]
            time_ms[tuple(int(row[p]) for p in PARAMS)] = float(row["time_ms"])
    if not time_ms:
        raise ValueError(f"gpu: no rows for {gpu!r} in {CSV}")
    tune_params = {p: sorted({c[i] for c in time_ms}) for i, p in enumerate(PARAMS)}
    cache = {
        ",".join(map(str, config)): {**dict(zip(PARAMS, config, strict=True)), "time": t}
        for config, t in time_ms.items()
    }
    path = directory / f"{gpu}.json"
    path.write_text(
        json.dumps(
            {
                "device_name": device_name,
                "kernel_name": "Xgemm",
                "problem_size": [SIZE, SIZE],
                "tune_params_keys": list(PARAMS),
                "tune_params": tune_params,
                "objective": "time",
                "cache": cache,
            }
        )
    )
    return Space(gpu, tune_params, time_ms, path)


def restrictions_of(space: Space) -> list[Any]:
    """The configurations of the cache, exactly: Xgemm's rules, then membership."""
    measured = frozenset(space.time_ms)

    def in_cache(*values: int) -> bool:
        return values in measured

    return [*XGEMM_RESTRICTIONS, in_cache]


def tune(space: Space, strategy: Any, budget: int, seed: int) -> list[dict[str, Any]]:
    """One simulated tuning; Kernel Tuner's results in evaluation order."""
    import numpy as np
    from kernel_tuner import tune_kernel

    random.seed(seed)
    np.random.seed(seed)
    results, _ = tune_kernel(
        "Xgemm",
        "__global__ void Xgemm(int n) {}",  # never compiled: simulation replays the cache
        (SIZE, SIZE),
        [np.int32(SIZE)],
        dict(space.tune_params),
        restrictions=restrictions_of(space),
        block_size_names=["MDIMC", "NDIMC"],
        lang="CUDA",
        strategy=strategy,
        strategy_options={"max_fevals": budget},
        cache=str(space.cache_path),
        simulation_mode=True,
        quiet=True,
    )
    return list(results)


def evaluations_to_within(
    results: Sequence[dict[str, Any]], space: Space, tolerance: float = TOLERANCE
) -> int | None:
    """Unique evaluations up to and including the first configuration within ``tolerance``
    of the cache's best (None: none was). Times are looked up in the cache itself."""
    seen: set[tuple[int, ...]] = set()
    limit = (1 + tolerance) * space.best_ms
    for record in results:
        config = tuple(int(record[p]) for p in PARAMS)
        if config in seen:
            continue
        seen.add(config)
        if space.time_ms[config] <= limit:
            return len(seen)
    return None


def kperf_strategy(gpu: str, seed: int, **options: Any) -> Any:
    from kperf_client.kernel_tuner import KperfStrategy

    return KperfStrategy(
        None,  # a fresh in-process service: a fresh device, this seed's runs only
        PROFILES[gpu],
        m=SIZE,
        n=SIZE,
        k=SIZE,
        dtype="fp32",
        seed=seed,
        timeout_s=60.0,
        recalibrate_every=RECALIBRATE_EVERY,
        **options,
    )


def run_one(space: Space, name: str, seed: int, budget: int) -> int | None:
    if name == "kperf":
        strategy = kperf_strategy(space.gpu, seed)
        try:
            results = tune(space, strategy, budget, seed)
        finally:
            strategy.close()
    else:
        results = tune(space, name, budget, seed)
    return evaluations_to_within(results, space)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (inf stands for "not found")."""
    ordered = sorted(values)
    rank = max(1, round(q * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def show(value: float, budget: int) -> str:
    return f"> {budget}" if value == float("inf") else f"{value:.0f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument("--strategies", default=",".join(("kperf", *BUILTIN)))
    args = parser.parse_args(argv)
    os.environ.setdefault("KPERF_LOG_LEVEL", "WARNING")  # the in-process services' logs
    logging.basicConfig(level=logging.WARNING)
    from bench.common import command_line

    names = args.strategies.split(",")
    lines = [
        f"`{command_line()}` (evaluations until a configuration within 3 % of the cache's best; "
        f"{args.seeds} seeds, budget {args.budget} evaluations; not found = > budget)",
        "",
        "| GPU (configs, best ms) | strategy | median | p90 | found | wall s |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as directory:
        for gpu in args.gpus.split(","):
            space = load_space(gpu, Path(directory))
            for name in names:
                started = time.perf_counter()
                found = [run_one(space, name, seed, args.budget) for seed in range(args.seeds)]
                wall_s = time.perf_counter() - started
                values = [float("inf") if f is None else float(f) for f in found]
                hits = sum(f is not None for f in found)
                label = f"{gpu} ({len(space.time_ms)}, {space.best_ms:.3f})"
                line = (
                    f"| {label} | {name} | {show(statistics.median(values), args.budget)} | "
                    f"{show(percentile(values, 0.9), args.budget)} | {hits}/{args.seeds} | "
                    f"{wall_s:.0f} |"
                )
                lines.append(line)
                print(line, flush=True)
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
