"""``kperf calibrate --model many-bsp --from-kernel-tuner CACHE.json``: the options and the runs.

The tuning's configurations (all, or ``--configurations N`` drawn with ``--seed``) become
Many-BSP measured runs (:mod:`kperf_client.kt_calibrate`): PTX built from ``--source`` with
nvcc as Kernel Tuner compiles each configuration (:mod:`kperf_client.ptx_build`, cached in
``--ptx-cache``), or read from ``--ptx-dir``; the launch from ``--problem-size`` (default: the
cache's) and ``--grid-div-x/y/z`` (Kernel Tuner's ``grid_div_x/y/z``; default: the block
sizes); cycles at ``--clock-mhz`` (default: the base profile's clock).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kperf_client.client import KperfClient
from kperf_client.kt_cache import CacheFormatError, TunedConfig, TunerCache, read_cache
from kperf_client.kt_calibrate import Build, Geometry, choose, measured_run
from kperf_client.kt_geometry import BLOCK_SIZE_NAMES, Divisor, GeometryError
from kperf_client.ptx_build import (
    BuildFailed,
    PtxBuilder,
    ToolchainMissing,
    load_prebuilt,
    require_toolchain,
)


class TunerInputError(ValueError):
    """A tuning the command cannot turn into runs (exit 2, saying why)."""


def _items(text: str) -> list[int | str]:
    """Comma-separated ints or expressions over the tunables (Kernel Tuner's forms)."""
    items: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise argparse.ArgumentTypeError(f"empty item in {text!r}")
        items.append(int(part) if part.isdigit() else part)
    return items


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kperf" / "ptx"


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("from a Kernel Tuner cache (--model many-bsp)")
    group.add_argument(
        "--from-kernel-tuner",
        type=Path,
        default=None,
        metavar="CACHE.json",
        help="Kernel Tuner cache file (.json or .json.gz) of the tuning",
    )
    group.add_argument("--source", type=Path, default=None, help="the tuned kernel's .cu file")
    group.add_argument("--kernel-name", default=None, help="entry; default: the cache's")
    group.add_argument(
        "--problem-size",
        type=_items,
        default=None,
        metavar="X[,Y[,Z]]",
        help="tune_kernel's problem_size (ints or expressions over the "
        "tunables); default: the cache's",
    )
    for axis in "xyz":
        group.add_argument(
            f"--grid-div-{axis}",
            type=_items,
            default=None,
            metavar="D[,D...]",
            help=f"tune_kernel's grid_div_{axis}: its items multiply; default: block_size_{axis}",
        )
    group.add_argument(
        "--block-size-names",
        type=lambda t: [s.strip() for s in t.split(",")],
        default=list(BLOCK_SIZE_NAMES),
        metavar="X,Y,Z",
        help="tune_kernel's block_size_names",
    )
    group.add_argument(
        "--arch", default=None, help="nvcc -arch, e.g. sm_80; default: the base device's"
    )
    group.add_argument(
        "-I",
        "--include-dir",
        type=Path,
        action="append",
        default=[],
        help="include folder (the source's own is always searched)",
    )
    group.add_argument(
        "--compiler-options",
        default="",
        metavar="'OPTS'",
        help="more nvcc options, one quoted string",
    )
    group.add_argument(
        "--ptx-dir",
        type=Path,
        default=None,
        help="prebuilt PTX, <instance>.ptx per configuration (no nvcc needed)",
    )
    group.add_argument(
        "--ptx-cache",
        type=Path,
        default=None,
        help=f"where built PTX is kept; default: {_default_cache_dir()}",
    )
    group.add_argument(
        "--configurations",
        type=int,
        default=None,
        metavar="N",
        help="calibrate on N configurations drawn at random; default: all",
    )
    group.add_argument("--seed", type=int, default=0, help="of the draw (default 0)")
    group.add_argument(
        "--clock-mhz",
        type=float,
        default=None,
        help="the GPU's clock during the tuning; default: the base profile's",
    )
    group.add_argument(
        "--write-runs",
        type=Path,
        default=None,
        metavar="FILE.jsonl",
        help="also write the runs sent, one JSON line each",
    )


def _geometry(args: argparse.Namespace, cache_problem: list[int | str] | None) -> Geometry:
    problem = args.problem_size if args.problem_size is not None else cache_problem
    if problem is None:
        raise TunerInputError("the cache has no problem_size: pass --problem-size")
    if len(args.block_size_names) != 3:
        raise TunerInputError("--block-size-names takes three names, x,y,z")
    divisors: list[Divisor] = [getattr(args, f"grid_div_{axis}") for axis in "xyz"]
    return Geometry(problem, divisors, args.block_size_names)


async def _base_device(client: KperfClient, device: str) -> tuple[float, str | None]:
    """The base profile's clock (MHz) and its compute capability as an nvcc arch."""
    detail = await client.device(device)
    clock = detail.hardware.get("clock_mhz")
    if clock is None:
        raise TunerInputError(f"device {device!r} has no clock_mhz: pass --clock-mhz")
    capability = getattr(detail, "compute_capability", None)
    arch = f"sm_{str(capability).replace('.', '')}" if capability else None
    return clock.value, arch


def _builder(args: argparse.Namespace, kernel: str | None, device_arch: str | None) -> Build:
    if args.ptx_dir is not None:
        # ptxas (when the folder has no reports) assembles for --arch, else the PTX's .target
        folder, given = args.ptx_dir, args.arch
        return lambda params, grid, block: load_prebuilt(folder, params, arch=given, kernel=kernel)
    arch = args.arch or device_arch
    if arch is None:
        raise TunerInputError("the base device has no compute capability: pass --arch")
    builder = PtxBuilder(
        args.source,
        arch=arch,
        kernel=kernel,
        include_dirs=args.include_dir,
        options=shlex.split(args.compiler_options),
        cache_dir=args.ptx_cache or _default_cache_dir(),
        block_size_names=args.block_size_names,
    )
    return builder.build


@dataclass(frozen=True)
class Plan:
    """What the command will send, read before the service is asked anything."""

    cache: TunerCache
    chosen: list[TunedConfig]
    geometry: Geometry
    kernel: str | None


def plan(args: argparse.Namespace) -> Plan:
    """The cache read, the configurations drawn and the tools checked (TunerInputError)."""
    try:
        cache = read_cache(args.from_kernel_tuner)
        if not cache.configs:
            raise TunerInputError(f"{args.from_kernel_tuner}: no measured configuration")
        geometry = _geometry(args, cache.problem_size)
        chosen = choose(cache.configs, args.configurations, args.seed)
        if args.ptx_dir is None:
            if args.source is None:
                raise TunerInputError("pass --source (the .cu file) to build the PTX, or --ptx-dir")
            require_toolchain()
    except (CacheFormatError, ToolchainMissing, ValueError) as exc:
        raise TunerInputError(str(exc)) from None
    return Plan(cache, chosen, geometry, args.kernel_name or cache.kernel_name)


async def kernel_tuner_runs(
    args: argparse.Namespace, chosen: Plan, client: KperfClient, err: TextIO
) -> tuple[list[dict[str, Any]], list[str]]:
    """The runs to send, and a label per run (``CACHE:key``) for the service's errors."""
    try:
        clock, arch = await _base_device(client, args.device)
        clock = args.clock_mhz if args.clock_mhz is not None else clock
        build = _builder(args, chosen.kernel, arch)
        runs = [measured_run(c, build, chosen.geometry, clock) for c in chosen.chosen]
    except (GeometryError, ToolchainMissing, BuildFailed, ValueError) as exc:
        raise TunerInputError(str(exc)) from None
    err.write(
        f"{len(runs)} of {len(chosen.cache.configs)} configurations of {args.from_kernel_tuner} "
        f"({chosen.cache.failed} failed ones left out), cycles at {clock:g} MHz\n"
    )
    if args.write_runs is not None:
        lines = "".join(json.dumps({"model": "many-bsp", **run}) + "\n" for run in runs)
        args.write_runs.write_text(lines, encoding="utf-8")
    return runs, [f"{args.from_kernel_tuner}:{c.key}" for c in chosen.chosen]
