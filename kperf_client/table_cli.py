"""``kperf table``: a tuning table for vLLM or SGLang, one (N, K) or a sweep, optionally
verified on the GPU (or against recorded timings)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kperf_client.cli_args import given
from kperf_client.client import KperfClient
from kperf_client.models import TuningTableResponse
from kperf_client.table_sweep import read_table_shapes, run_table_sweep, write_table
from kperf_client.table_verify import Bench, RecordedBench, verify_table
from kperf_client.text_table import table as _table

ClientFactory = Callable[[argparse.Namespace], KperfClient]


def _m_values(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas: {text!r}"
        ) from None


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "format": args.format}
    return body | given(
        args,
        "n",
        "k",
        "device_name",
        "m_values",
        "max_distinct_configs",
        "shortlist_per_m",
        "pipeline_model",
    )


def _print_table(answer: TuningTableResponse, path: Path, out: TextIO) -> None:
    out.write(
        f"wrote {path}\nN={answer.n} K={answer.k} on {answer.device} ({answer.dtype}, "
        f"{answer.pipeline_model}): {answer.status}, "
        f"{answer.selection.distinct_configs} distinct configurations, "
        f"{answer.solver.elapsed_ms:.0f} ms\n"
    )
    rows = [
        (
            e.m,
            e.config.BLOCK_SIZE_M,
            e.config.BLOCK_SIZE_N,
            e.config.BLOCK_SIZE_K,
            e.config.GROUP_SIZE_M,
            e.config.num_warps,
            e.config.num_stages,
            f"{e.predicted_time_us:.2f}",
            "-" if e.probability_best is None else f"{e.probability_best:.2f}",
            f"{e.loss * 100:.1f} %",
        )
        for e in answer.entries
    ]
    header = ("M", "BM", "BN", "BK", "GROUP_M", "warps", "stages", "time_us", "P(best)", "loss")
    out.write(_table(header, rows) + "\n")
    worst = answer.loss_over_range
    out.write(
        f"worst loss for any M in {worst.m_min}..{worst.m_max} (nearest key): "
        f"{worst.worst_loss * 100:.1f} % at M {worst.worst_m_first}..{worst.worst_m_last} "
        f"(key {worst.worst_key})\n"
    )


async def _one(args: argparse.Namespace, client: KperfClient, out: TextIO, err: TextIO) -> int:
    body = _body(args)
    answer = await client.tuning_table(body)
    path = write_table(args.output, answer.file_name, answer.file)
    if args.svg is not None:
        svg = await client.tuning_table_svg(body)
        args.svg.write_bytes(svg)
        err.write(f"wrote {args.svg} ({len(svg)} bytes)\n")
    if args.json:
        out.write(json.dumps(answer.model_dump(mode="json"), indent=2) + "\n")
    else:
        _print_table(answer, path, out)
    return 0


def _bench(args: argparse.Namespace) -> Bench:
    if args.recorded is not None:
        return RecordedBench.from_file(args.recorded)
    from kperf_client.triton_bench import TritonBench

    return TritonBench(block_shape=(128, 128))


async def _verify(args: argparse.Namespace, client: KperfClient, out: TextIO) -> int:
    body = _body(args)
    result = await verify_table(client, body, _bench(args), rounds=args.rounds)
    answer = result.answer
    path = write_table(args.output, answer.file_name, result.file)
    keys = len(answer.entries)
    exhaustive = answer.search.configurations * keys
    # the configurations the model tells apart: the lower count, and the share reported
    tilings_only = answer.search.feasible_tilings * keys
    report = {
        "file": str(path),
        "device": result.device,
        "rounds": result.rounds,
        "runs_timed": result.runs,
        "gpu_time_us": round(result.gpu_time_us, 3),
        "exhaustive_runs": exhaustive,
        "exhaustive_runs_tilings_only": tilings_only,
        "share_of_exhaustive_tilings_only": round(result.runs / tilings_only, 4),
        "best_time_us": {str(m): t for m, t in result.best_time_us.items()},
    }
    if args.json:
        out.write(json.dumps(report, indent=2) + "\n")
    else:
        out.write(
            f"wrote {path}\ntimed {result.runs} configurations in {result.rounds} rounds "
            f"({result.gpu_time_us:.0f} us of GPU time): {result.runs / tilings_only:.1%} of "
            f"the {tilings_only} runs of exhaustive tuning over the tilings the model tells "
            f"apart ({answer.search.feasible_tilings} x {keys} keys), "
            f"{result.runs / exhaustive:.2%} of the {exhaustive} over every configuration asked; "
            f"refit device {result.device}\n"
        )
    return 0


async def _sweep(args: argparse.Namespace, client: KperfClient, out: TextIO, err: TextIO) -> int:
    from kperf_client.sweep.console import progress_bar, summary_table

    defaults = {k: v for k, v in _body(args).items() if k not in ("n", "k")}
    lines, bad = read_table_shapes(args.sweep, defaults)
    for line, reason in bad:
        err.write(f"{args.sweep}:{line}: {reason}; skipped\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    show = args.progress if args.progress is not None else (err.isatty() and not args.json)
    try:
        with progress_bar(err, len(lines), show) as on_progress:
            stats = await run_table_sweep(
                client,
                lines,
                args.output,
                concurrency=args.concurrency,
                on_progress=on_progress,
                stop=stop,
            )
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    stats.invalid_lines = len(bad)
    if args.json:
        out.write(json.dumps(stats.as_dict(), indent=2) + "\n")
    else:
        summary_table(stats, out)
    if stats.interrupted:
        err.write(f"interrupted: rerun the same command to resume ({args.output})\n")
        return 3
    return 1 if bad or stats.errors or stats.failed else 0


def _sweep_client(args: argparse.Namespace) -> KperfClient:
    settings = {"workers": max(1, args.concurrency), "log_level": "WARNING"}
    return KperfClient(None, settings=settings, token=os.environ.get("KPERF_TOKEN") or None)


def table_handler(make_client: ClientFactory) -> Callable[..., Any]:
    async def handler(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
        if args.sweep is None and (args.n is None or args.k is None):
            err.write("error: give --n and --k, or --sweep FILE\n")
            return 2
        if args.verify and args.sweep is not None:
            err.write("error: --verify takes one (N, K), not --sweep\n")
            return 2
        client_of = make_client
        if args.sweep is not None and args.url is None:
            # in-process: one worker per table in flight
            client_of = _sweep_client
        async with client_of(args) as client:
            if args.sweep is not None:
                return await _sweep(args, client, out, err)
            if args.verify:
                return await _verify(args, client, out)
            return await _one(args, client, out, err)

    return handler


def add_table_parser(
    sub: Any, client_options: Callable[[argparse.ArgumentParser], None], make_client: ClientFactory
) -> None:
    table = sub.add_parser(
        "table",
        help="a per-M tuning table for vLLM or SGLang (one N, K or a sweep)",
        description="Asks POST /tuning-table and writes the file under the name the engine's "
        "loader looks for. --sweep FILE: one table per CSV line (columns n, k, optionally any "
        "other field), resumable. --verify: time each key's shortlist on the GPU (or "
        "--recorded timings), refit the device, repeat; write the fastest timed per key.",
    )
    table.add_argument("--n", type=int, default=None, help="columns of B and C")
    table.add_argument("--k", type=int, default=None, help="reduction dimension")
    table.add_argument("--device", required=True, help="device profile id (kperf devices)")
    table.add_argument("--dtype", default="fp8", choices=["fp32", "fp16", "bf16", "fp8"])
    table.add_argument("--format", default="vllm", choices=["vllm", "sglang", "json"])
    table.add_argument("--device-name", default=None, help="CUDA device name for the file name")
    table.add_argument("--m-values", type=_m_values, default=None, help="keys, e.g. 1,16,256")
    table.add_argument("--max-distinct-configs", type=int, default=None)
    table.add_argument("--shortlist-per-m", type=int, default=None)
    table.add_argument("--pipeline-model", default=None, choices=["paper", "async-copy"])
    table.add_argument("--output", "-o", type=Path, required=True, help="folder to write into")
    table.add_argument("--svg", type=Path, default=None, help="also draw time over M as SVG")
    table.add_argument("--sweep", type=Path, default=None, metavar="CSV", help="many (N, K)")
    table.add_argument("--concurrency", type=int, default=2, help="--sweep: tables in flight")
    table.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    table.add_argument("--verify", action="store_true", help="time the shortlists, refit")
    table.add_argument("--recorded", type=Path, default=None, help="--verify without a GPU")
    table.add_argument("--rounds", type=int, default=5, help="--verify: rounds at most")
    client_options(table)
    table.set_defaults(handler=table_handler(make_client), kind="out_err")
