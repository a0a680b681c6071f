"""kperf command line: ``serve``, ``optimize``, ``batch``, ``sweep``, ``predict``, ``devices``,
``calibrate`` (from a runs file, or from a Kernel Tuner cache:
:mod:`kperf_client.cli_kernel_tuner`), ``recalibrate``, ``measurements add|list``, ``table``
(:mod:`kperf_client.table_cli`).

Every command except ``serve`` goes through :class:`kperf_client.client.KperfClient`: against
``--url`` when given, else against an in-process instance of the service (same validation,
limits and errors; that, and ``serve``, need the server installed: ``kperf[server]``). Output is
a human-readable table; ``--json`` prints the raw JSON for scripts. Exit codes: 0 success, 1 the
service refused the request (its problem+json is shown), 2 usage (or no server installed for a
command without ``--url``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import httpx

from kperf_client import cli_kernel_tuner, torch_timing
from kperf_client.cli_args import given
from kperf_client.cli_kernel_tuner import TunerInputError
from kperf_client.client import KperfClient, KperfError, ServerNotInstalled, server_imports
from kperf_client.models import CalibrateResponse
from kperf_client.table_cli import add_table_parser
from kperf_client.text_table import table as _table


def _pct(value: float | None) -> str:
    """A percentage error; null in the answer (not finite: JSON has no infinity) as "inf"."""
    return "inf %" if value is None else f"{value:.2f} %"


def _print_json(document: Any, out: TextIO) -> None:
    out.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def _client(args: argparse.Namespace) -> KperfClient:
    settings = None
    if args.url is None:
        # in-process: one worker is plenty for a single command and starts faster
        settings = {"workers": 1, "log_level": "WARNING"}
    # the bearer token of a server run for a team (README, "Run it for a team")
    return KperfClient(args.url, settings=settings, token=os.environ.get("KPERF_TOKEN") or None)


# ---------------------------------------------------------------------------- serve


def _serve(args: argparse.Namespace) -> int:
    # the server, only here: the other commands are HTTP clients (no server install needed)
    with server_imports("kperf serve"):
        import uvicorn

        from app import logging as kperf_logging
        from app.main import create_app
        from app.malloc import pin_mmap_threshold
        from app.settings import Settings
        from app.slow_clients import guarded_protocol

    overrides = {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "cache_path": args.cache_path,
    }
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    kperf_logging.configure(settings.log_level, settings.log_json)
    pin_mmap_threshold()
    # SIGTERM (docker stop, systemd, Kubernetes) asks for a graceful stop, which is a success:
    # uvicorn drains and runs the lifespan shutdown (worker pool, cache), then re-raises the
    # signal it caught into the handler it found, this one, so the exit status is 0, not 143.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        # header and body read deadlines (slowloris): KPERF_HEADER_TIMEOUT_S, _BODY_TIMEOUT_S
        http=guarded_protocol(settings.header_timeout_s, settings.body_timeout_s),
    )
    return 0


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


# ---------------------------------------------------------------------------- client commands


def _optimize_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"m": args.m, "n": args.n, "k": args.k, "device": args.device}
    body |= given(args, "dtype", "top_k", "time_limit_s", "pipeline_model", "memory_model")
    if args.timeline:
        body["include_timeline"] = True
    return body


def _write_svg(path: Path, svg: bytes, err: TextIO) -> None:
    path.write_bytes(svg)
    err.write(f"wrote {path} ({len(svg)} bytes)\n")


async def _optimize(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    async with _client(args) as client:
        answer = await client.optimize(_optimize_body(args))
        if args.svg is not None:
            # the same request again, as a picture: answered from the cache, then drawn
            svg = await client.optimize_svg(_optimize_body(args), args.candidate_rank)
            _write_svg(args.svg, svg, err)
    result = answer.response
    if args.json:
        _print_json(result.model_dump(mode="json"), out)
        return 0
    out.write(
        f"GEMM {args.m}x{args.n}x{args.k} on {result.device} ({result.dtype}, "
        f"{result.pipeline_model}, {result.memory_model}): status {result.status}, "
        f"cache {answer.cache or '-'}, "
        f"solver {result.solver.elapsed_ms:.1f} ms\n"
    )
    rows = [
        (
            c.rank,
            c.tile_m,
            c.tile_n,
            c.tile_k,
            c.buffer_depth,
            "-" if c.group_m is None else c.group_m,
            "-" if c.split_k is None else c.split_k,
            f"{c.predicted_time_us:.1f}",
            "-"
            if c.interval_low_us is None
            else f"{c.interval_low_us:.1f}..{c.interval_high_us:.1f}",
            "-" if c.probability_best is None else f"{c.probability_best:.2f}",
            c.waves,
            c.ctas_per_sm,
            c.stages,
            c.stages_in_flight,
            c.bound,
        )
        for c in result.candidates
    ]
    header = ("rank", "TM", "TN", "TK", "depth", "group", "split-K", "time_us", "10-90 %")
    residency = ("P(best)", "waves", "CTAs/SM", "stages", "in flight", "bound")
    out.write(_table((*header, *residency), rows) + "\n")
    if result.profile_provenance is not None:
        origin = result.profile_provenance
        runs = f", {origin.measurement_count} runs" if origin.measurement_count else ""
        out.write(f"figures: {origin.kind}{runs}")
        out.write(f"; shortlist: {result.shortlist.mode}\n" if result.shortlist else "\n")
    return 0


def _load_problems(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The problems of a JSON document (a list, or ``{"problems": [...]}``) or of JSON lines
    (read as ``kperf sweep`` reads them: comments and blank lines skipped), and a
    ``FILE:LINE: reason`` for each line that is not a problem."""
    from kperf_client.sweep import BadLine, read_shapes

    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("[") or stripped.startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            document = None
        if isinstance(document, list):
            return [dict(p) for p in document], []
        if isinstance(document, dict) and isinstance(document.get("problems"), list):
            return [dict(p) for p in document["problems"]], []
    parsed = read_shapes(path, "jsonl")
    bad = [f"{path}:{p.line}: {p.reason}" for p in parsed if isinstance(p, BadLine)]
    return [p.problem for p in parsed if not isinstance(p, BadLine)], bad


async def _batch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    problems, bad = _load_problems(args.file)
    for line in bad:
        err.write(f"{line}\n")
    if bad:
        err.write("nothing sent: fix the lines above\n")
        return 2
    if not problems:
        err.write("no problems in the file\n")
        return 2
    items: list[dict[str, Any]] = []
    async with _client(args) as client:
        for start in range(0, len(problems), args.chunk_size):
            chunk = problems[start : start + args.chunk_size]
            answer = await client.optimize_batch(chunk)
            for entry in answer.items:
                document = entry.model_dump(mode="json")
                document["index"] = start + entry.index
                items.append(document)
            done = len(items)
            failed = sum(1 for i in items if i["status"] == "error")
            # progress on stderr so --json output on stdout stays machine-readable
            err.write(f"\r[{done}/{len(problems)}] solved, {failed} failed")
            err.flush()
    err.write("\n")
    if args.json:
        _print_json({"items": items}, out)
    else:
        rows = []
        for item in items:
            if item["status"] == "ok":
                best = item["result"]["best"]
                tiling = (
                    f"{best['tile_m']}x{best['tile_n']}x{best['tile_k']}/{best['buffer_depth']}"
                )
                rows.append(
                    (
                        item["index"],
                        "ok",
                        item["result"]["status"],
                        item["cache"],
                        tiling,
                        f"{best['predicted_time_us']:.3f}",
                    )
                )
            else:
                error = item["error"]
                fields = ", ".join(e["field"] for e in error["errors"])
                rows.append((item["index"], f"error {error['status']}", fields, "", "", ""))
        out.write(_table(("#", "result", "status", "cache", "TMxTNxTK/depth", "time_us"), rows))
        out.write("\n")
    return 1 if any(i["status"] == "error" for i in items) else 0


async def _sweep(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Exit 0 when every shape has an answer, 1 when any line failed, 3 when interrupted."""
    from kperf_client.sweep import (
        BadLine,
        Journal,
        JournalLocked,
        Shape,
        Sweep,
        SweepOptions,
        read_shapes,
    )
    from kperf_client.sweep.console import progress_bar, summary_table

    parsed = read_shapes(args.file, args.format)
    shapes = [s for s in parsed if isinstance(s, Shape)]
    bad = [b for b in parsed if isinstance(b, BadLine)]
    for line in bad:
        err.write(f"{args.file}:{line.line}: {line.reason}; skipped\n")
    if not parsed:
        err.write(f"{args.file}: no shapes\n")
        return 2
    try:
        options = SweepOptions(
            urls=tuple(args.url or ()),
            batch_size=args.batch_size,
            concurrency=args.concurrency,
            retries=args.retries,
        )
    except ValueError as exc:
        err.write(f"error: {exc}\n")
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def failure(line: int, reason: str) -> None:
        err.write(f"{args.file}:{line}: {reason}\n")

    show = args.progress if args.progress is not None else (err.isatty() and not args.json)
    try:
        with Journal(args.output) as journal:
            with progress_bar(err, len(shapes), show) as on_progress:
                sweep = Sweep(options, journal, on_progress=on_progress, on_failure=failure)
                stats = await sweep.run(shapes, stop)
            statuses = [journal.done.get((s.line, s.digest)) for s in shapes]
    except JournalLocked as exc:
        err.write(f"error: {exc}\n")
        return 2
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    stats.invalid_lines = len(bad)
    summary = {
        **stats.as_dict(),
        "output": str(args.output),
        "lines_failed": sorted(
            [b.line for b in bad]
            + [s.line for s, st in zip(shapes, statuses, strict=True) if st not in (None, "ok")]
        ),
        "lines_unanswered": [s.line for s, st in zip(shapes, statuses, strict=True) if st is None],
    }
    if args.json:
        _print_json(summary, out)
    else:
        summary_table(stats, out)
    if stats.interrupted:
        err.write(f"interrupted: rerun the same command to resume ({args.output})\n")
        return 3
    return 1 if summary["lines_failed"] or summary["lines_unanswered"] else 0


def _dims(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected X[,Y[,Z]] integers, got {text!r}") from None
    if not 1 <= len(values) <= 3:
        raise argparse.ArgumentTypeError(f"expected 1 to 3 dimensions, got {text!r}")
    return values + [1] * (3 - len(values))


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _add_pairs(
    parser: argparse.ArgumentParser,
    flag: str,
    metavar: str,
    value: Callable[[str], Any],
    help_text: str,
) -> None:
    """A repeatable ``flag NAME=VALUE`` option read as a list of (NAME, value(VALUE)) pairs;
    ``value`` raises ValueError for what it cannot read, and the error names ``metavar``."""

    def pair(text: str) -> tuple[str, Any]:
        name, sep, raw = text.partition("=")
        if sep and name:
            try:
                return name, value(raw)
            except ValueError:
                pass
        raise argparse.ArgumentTypeError(f"expected {metavar}, got {text!r}")

    parser.add_argument(
        flag, type=pair, action="append", default=[], metavar=metavar, help=help_text
    )


async def _predict(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    ptx = args.kernel.read_text(encoding="utf-8")
    body: dict[str, Any] = {
        "ptx": ptx,
        "device": args.device,
        "launch": {"grid": args.grid, "block": args.block},
    }
    body |= given(args, "clock_mhz", kernel="kernel_name")
    resources = {
        "registers_per_thread": args.registers_per_thread,
        "shared_bytes_per_block": args.shared_bytes_per_block,
    }
    if any(v is not None for v in resources.values()):
        body["resources"] = {k: v for k, v in resources.items() if v is not None}
    if args.trip_count:
        body["loop_trip_counts"] = dict(args.trip_count)
    body.update(dict(args.param))
    async with _client(args) as client:
        result = await client.predict(body)
        if args.svg is not None:
            _write_svg(args.svg, await client.predict_svg(body), err)
    if args.json:
        _print_json(result, out)
        return 0
    rows = [(k, v) for k, v in result.items() if not isinstance(v, dict | list)]
    out.write(_table(("field", "value"), rows) + "\n")
    for warning in result.get("warnings", []):
        out.write(f"warning: {warning}\n")
    return 0


async def _devices(args: argparse.Namespace, out: TextIO) -> int:
    async with _client(args) as client:
        if args.device_id is not None:
            profile = await client.device(args.device_id)
            if args.json:
                _print_json(profile.model_dump(mode="json"), out)
                return 0
            out.write(f"{profile.id}: {profile.name} ({profile.architecture or '-'})\n")
            rows: list[tuple[Any, ...]] = []
            sections = {"hardware": profile.hardware, "gemm_ws": profile.gemm_ws or {}}
            for section, figures in sections.items():
                for name, figure in figures.items():
                    if figure is not None:
                        prior = figure.prior
                        belief = f"{prior.median:.4g} x/ e^{prior.sigma_log:g}" if prior else "-"
                        value = f"{figure.value:.6g}" + (" (estimate)" if figure.estimate else "")
                        rows.append((f"{section}.{name}", value, belief, figure.source))
            out.write(_table(("figure", "value", "prior", "source"), rows) + "\n")
            for model, need in profile.needs_calibration.items():
                out.write(f"{model}: {need.status}\n")
                for label, needs in (("calibrate", need.figures), ("cite", need.missing)):
                    if needs:
                        out.write(f"  {label}: {', '.join(f.figure for f in needs)}\n")
                if need.calibrate is not None:
                    out.write(f"  call: {need.calibrate.cli}\n")
            return 0
        listing = await client.devices()
    if args.json:
        _print_json(listing.model_dump(mode="json"), out)
        return 0
    rows = [
        (
            d.id,
            ", ".join(d.aliases) or "-",
            d.name,
            d.architecture or "-",
            d.sm_count,
            ", ".join(f"{m} ({d.model_status.get(m, '-')})" for m in d.models) or "-",
        )
        for d in listing.devices
    ]
    out.write(
        _table(("id", "names", "name", "architecture", "SMs", "models (status)"), rows) + "\n"
    )
    if listing.stored_profiles.status != "ok":
        out.write(
            "warning: calibrated profiles not listed, the store is unavailable "
            f"({listing.stored_profiles.reason}); shipped profiles only\n"
        )
    return 0


# ---------------------------------------------------------------------------- calibration

#: keys of the flat Many-BSP lines ``perfmodel.calibration.load_measurements_jsonl`` reads,
#: moved to where the HTTP measurement keeps them
_FLAT_LAUNCH = {"grid": "launch", "block": "launch"}
_FLAT_RESOURCES = ("registers_per_thread", "shared_bytes_per_block")


class RunsFileError(ValueError):
    """A line of a runs file the command cannot send (exit 2, naming the line)."""


def _as_measurement(obj: dict[str, Any], device: str | None) -> dict[str, Any]:
    """One line as the service's measurement: ``model`` and ``meta`` dropped; the flat
    Many-BSP form (grid, block, registers_per_thread, ... at the top) nested like the
    /predict-kernel body; a ``device`` key must be the device the runs are sent for."""
    run = {k: v for k, v in obj.items() if k not in ("model", "meta", "clock_mhz")}
    line_device = run.pop("device", None)
    if line_device is not None and device is not None and line_device != device:
        raise ValueError(f"the run is on device {line_device!r}, not {device!r}")
    for key, section in _FLAT_LAUNCH.items():
        if key in run:
            run.setdefault(section, {})[key] = run.pop(key)
    for key in _FLAT_RESOURCES:
        if key in run:
            run.setdefault("resources", {})[key] = run.pop(key)
    return run


def _infer_model(obj: dict[str, Any]) -> str:
    if "model" in obj:
        return str(obj["model"])
    return "many-bsp" if "measured_cycles" in obj or "ptx" in obj else "gemm-ws"


def read_runs(
    path: Path, model: str | None, device: str | None
) -> tuple[str, list[dict[str, Any]], list[int]]:
    """(model, runs, line number of each run) of a JSON-lines file: blank lines skipped, lines
    of another model skipped (a line's ``model`` key, else its keys, say which)."""
    runs: list[dict[str, Any]] = []
    numbers: list[int] = []
    skipped = 0
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunsFileError(f"{path}:{number}: not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise RunsFileError(f"{path}:{number}: each line must be one JSON object")
        line_model = _infer_model(obj)
        model = model or line_model
        if line_model != model:
            skipped += 1
            continue
        try:
            runs.append(_as_measurement(obj, device))
        except ValueError as exc:
            raise RunsFileError(f"{path}:{number}: {exc}") from None
        numbers.append(number)
    if not runs:
        raise RunsFileError(
            f"{path}: no {model or 'measurement'} lines"
            + (f" ({skipped} of another model)" if skipped else "")
        )
    assert model is not None
    return model, runs, numbers


_RUN_FIELD = re.compile(r"^measurements\.(\d+)")


def _on_runs(exc: KperfError, labels: Sequence[str]) -> KperfError:
    """The service's ``measurements.3.x`` fields as ``LABEL x`` (the label of run 3)."""
    for entry in exc.problem.get("errors", []):
        match = _RUN_FIELD.match(str(entry.get("field", "")))
        if match is not None and int(match[1]) < len(labels):
            rest = entry["field"][match.end() :].lstrip(".")
            entry["field"] = labels[int(match[1])] + (f" {rest}" if rest else "")
    return exc


def _on_lines(exc: KperfError, path: Path, numbers: Sequence[int]) -> KperfError:
    """The service's ``measurements.3.x`` fields as ``FILE:line x`` (the line run 3 came from)."""
    return _on_runs(exc, [f"{path}:{number}" for number in numbers])


def _note_if_not_kept(client: KperfClient, err: TextIO) -> None:
    if client.app is not None:
        store = client.app.state.service.store  # type: ignore[attr-defined]
        if store.name == "memory":
            err.write(
                "note: no --url: this ran an in-process service with an in-memory store, so "
                "nothing made here is kept; use --url (or a durable KPERF_STORE_URL)\n"
            )


def _print_calibration(answer: CalibrateResponse, as_json: bool, out: TextIO) -> None:
    if as_json:
        _print_json(answer.model_dump(mode="json"), out)
        return
    verb = "made" if answer.created else "already there:"
    alias = f" (name {answer.name})" if answer.name else ""
    out.write(
        f"{verb} {answer.device}{alias} from {answer.base_device}, "
        f"{answer.measurement_count} {answer.model} runs\n"
    )
    rows = [
        (
            f.name,
            f"{f.value:.6g}",
            "-" if f.interval_low is None else f"{f.interval_low:.4g} .. {f.interval_high:.4g}",
            "-" if f.prior is None else f"{f.prior.median:.4g} x/ e^{f.prior.sigma_log:g}",
            "determined" if f.identifiable else "prior kept",
        )
        for f in answer.fitted
    ]
    out.write(_table(("figure", "value", "10-90 %", "prior", "runs"), rows) + "\n")
    t, cv = answer.training_error, answer.cross_validation_error
    out.write(f"training error: mean {_pct(t.mean_abs_pct)}, max {_pct(t.max_abs_pct)}\n")
    if cv is not None:
        out.write(
            f"cross-validation error: mean {_pct(cv.mean_abs_pct)}, max {_pct(cv.max_abs_pct)}\n"
        )
    if answer.configless_runs:
        out.write(
            f"{len(answer.configless_runs)} runs without a configuration, fitted as the "
            "model's optimum over the default space\n"
        )
    if answer.noise_pct is not None:
        out.write(f"noise of the runs (estimated): {answer.noise_pct:.2g} %\n")
    for combination in answer.determined_combinations:
        out.write(f"determined: {combination}\n")
    for warning in answer.warnings:
        out.write(f"warning: {warning}\n")


def _fit_options(args: argparse.Namespace) -> dict[str, Any]:
    options = given(args, "name", "time_limit_s", "pipeline_model", cross_validation_folds="folds")
    if args.fit is not None:
        options["fit"] = [f.strip() for f in args.fit.split(",") if f.strip()]
    return options


async def _calibrate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.from_torch:
        return await _calibrate_from_torch(args, out, err)
    if (args.file is None) == (args.from_kernel_tuner is None):
        raise RunsFileError(
            "give either a runs file, --from-kernel-tuner CACHE.json or --from-torch"
        )
    if args.from_kernel_tuner is not None and args.model not in (None, "many-bsp"):
        raise RunsFileError("--from-kernel-tuner makes many-bsp runs: --model many-bsp")
    labels: list[str] = []
    tuning = None
    if args.file is not None:
        model, runs, numbers = read_runs(args.file, args.model, args.device)
        labels = [f"{args.file}:{number}" for number in numbers]
    else:
        model, tuning = "many-bsp", cli_kernel_tuner.plan(args)
    async with _client(args) as client:
        if tuning is not None:
            runs, labels = await cli_kernel_tuner.kernel_tuner_runs(args, tuning, client, err)
        body = {"model": model, "base_device": args.device, "measurements": runs}
        try:
            answer = await client.calibrate({**body, **_fit_options(args)})
        except KperfError as exc:
            raise _on_runs(exc, labels) from None
        _note_if_not_kept(client, err)
    _print_calibration(answer, args.json, out)
    return 0


def torch_matmul_timer() -> torch_timing.Timer:
    """The GPU timer of --from-torch (a seam: tests pass recorded timings)."""
    return torch_timing.torch_timer()


async def _calibrate_from_torch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        timer = torch_matmul_timer()
    except (ImportError, RuntimeError) as exc:
        err.write(f"kperf calibrate --from-torch: {exc}\n")
        return 2
    runs = torch_timing.runs_from_timings(torch_timing.STANDARD_SHAPES, args.dtype, timer)
    if args.write is not None:
        torch_timing.write_runs(runs, args.write)
        out.write(f"{len(runs)} runs written to {args.write}\n")
        return 0
    body = {"model": "gemm-ws", "base_device": args.device, "measurements": runs}
    async with _client(args) as client:
        answer = await client.calibrate({**body, **_fit_options(args)})
        _note_if_not_kept(client, err)
    _print_calibration(answer, args.json, out)
    return 0


async def _recalibrate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    options = _fit_options(args) | given(args, "model")
    async with _client(args) as client:
        answer = await client.recalibrate(args.device_id, options)
        _note_if_not_kept(client, err)
    _print_calibration(answer, args.json, out)
    return 0


async def _measurements_add(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    model, runs, numbers = read_runs(args.file, args.model, args.device)
    async with _client(args) as client:
        try:
            added = await client.add_measurements(args.device, model, runs)
        except KperfError as exc:
            raise _on_lines(exc, args.file, numbers) from None
        _note_if_not_kept(client, err)
    if args.json:
        _print_json(added.model_dump(mode="json"), out)
    else:
        out.write(
            f"recorded {added.added} {added.model} runs for {added.device} ({added.total} in "
            f"all); refit with: kperf recalibrate {args.device}\n"
        )
    return 0


async def _measurements_list(args: argparse.Namespace, out: TextIO) -> int:
    async with _client(args) as client:
        record = await client.measurements(args.device_id)
    if args.json:
        _print_json(record.model_dump(mode="json"), out)
        return 0
    for run in record.gemm_ws:
        out.write(json.dumps({"model": "gemm-ws", **run.model_dump(mode="json")}) + "\n")
    for kernel_run in record.many_bsp:
        out.write(json.dumps({"model": "many-bsp", **kernel_run.model_dump(mode="json")}) + "\n")
    return 0


# ---------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kperf", description="Analytical GPU kernel performance service and client."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP service (settings from KPERF_* env)")
    serve.add_argument("--host", default=None, help="overrides KPERF_HOST (127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="overrides KPERF_PORT (8000)")
    serve.add_argument("--workers", type=int, default=None, help="overrides KPERF_WORKERS")
    serve.add_argument(
        "--cache-path", type=Path, default=None, help="overrides KPERF_CACHE_PATH (SQLite file)"
    )
    serve.set_defaults(handler=_serve, kind="sync")

    def client_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--url", default=None, help="service URL; without it the service runs in-process"
        )
        p.add_argument("--json", action="store_true", help="print the JSON answer")

    optimize = sub.add_parser("optimize", help="best GeMM-WS tiling for one GEMM")
    optimize.add_argument("--m", type=int, required=True, help="rows of A and C")
    optimize.add_argument("--n", type=int, required=True, help="columns of B and C")
    optimize.add_argument("--k", type=int, required=True, help="reduction dimension")
    optimize.add_argument("--device", required=True, help="device profile id (kperf devices)")
    optimize.add_argument("--dtype", default=None, choices=["fp32", "tf32", "fp16", "bf16", "fp8"])
    optimize.add_argument("--top-k", type=int, default=None)
    optimize.add_argument("--time-limit-s", type=float, default=None)
    optimize.add_argument("--timeline", action="store_true", help="include per-stage times")
    optimize.add_argument(
        "--pipeline-model",
        default=None,
        choices=["paper", "async-copy"],
        help="GeMM-WS pipeline model to answer under; default: the device's",
    )
    optimize.add_argument(
        "--memory-model",
        default=None,
        choices=["l2-reuse", "dram-stream"],
        help="memory model to answer under; default: l2-reuse where the device has a memory "
        "section, else dram-stream",
    )
    optimize.add_argument(
        "--svg", type=Path, default=None, metavar="FILE", help="also write the timeline as SVG"
    )
    optimize.add_argument(
        "--candidate-rank",
        type=int,
        default=1,
        metavar="RANK",
        help="with --svg: draw this shortlist rank (default 1, the best)",
    )
    client_options(optimize)
    optimize.set_defaults(handler=_optimize, kind="out_err")

    batch = sub.add_parser("batch", help="solve many problems from a JSON / JSON-lines file")
    batch.add_argument("file", type=Path, help="JSON list, {'problems': [...]}, or JSON lines")
    batch.add_argument("--chunk-size", type=int, default=8, help="problems per request")
    client_options(batch)
    batch.set_defaults(handler=_batch, kind="out_err")

    sweep = sub.add_parser(
        "sweep",
        help="many shapes (CSV or JSON lines) through one or more services, resumable",
        description="Reads one /optimize-tiling problem per line (CSV with a header row: m, n, "
        "k, dtype, device, optional search_space as JSON; or JSON lines), sends them as "
        "batches, and appends one JSON line per answered shape to --output. Rerunning the "
        "same command resumes: shapes already in the output are not sent again.",
    )
    sweep.add_argument("file", type=Path, help="shapes: .csv (header row) or JSON lines")
    sweep.add_argument("--output", "-o", type=Path, required=True, help="JSONL results/journal")
    sweep.add_argument(
        "--url",
        action="append",
        default=None,
        help="service URL (repeat for several replicas); without it the service runs in-process",
    )
    sweep.add_argument("--format", choices=["csv", "jsonl"], default=None, help="default: suffix")
    sweep.add_argument("--batch-size", type=int, default=16, help="shapes per request")
    sweep.add_argument("--concurrency", type=int, default=4, help="batches in flight")
    sweep.add_argument("--retries", type=int, default=5, help="per batch, transient failures")
    sweep.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal and not --json)",
    )
    sweep.add_argument("--json", action="store_true", help="print the summary as JSON")
    sweep.set_defaults(handler=_sweep, kind="out_err")

    predict = sub.add_parser("predict", help="predict a PTX kernel's time (Many-BSP)")
    predict.add_argument("kernel", type=Path, help="PTX file")
    predict.add_argument("--device", required=True)
    predict.add_argument("--grid", type=_dims, required=True, help="X[,Y[,Z]] blocks")
    predict.add_argument("--block", type=_dims, required=True, help="X[,Y[,Z]] threads")
    predict.add_argument("--kernel-name", default=None, help="entry to analyse if several")
    predict.add_argument("--registers-per-thread", type=int, default=None)
    predict.add_argument("--shared-bytes-per-block", type=int, default=None)
    predict.add_argument("--clock-mhz", type=float, default=None)
    _add_pairs(
        predict,
        "--trip-count",
        "LABEL=N",
        _count,
        "iterations of the loop whose header has LABEL (repeatable)",
    )
    _add_pairs(
        predict,
        "--param",
        "NAME=VALUE",
        _json_or_text,
        "extra request field as JSON, e.g. --param 'memory_transactions={\"12\": 4}'",
    )
    predict.add_argument(
        "--svg",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the superstep breakdown as SVG",
    )
    client_options(predict)
    predict.set_defaults(handler=_predict, kind="out_err")

    def fit_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", default=None, help="alias of the new profile")
        p.add_argument("--fit", default=None, help="figures to fit, comma-separated")
        p.add_argument("--folds", type=int, default=None, help="cross-validation folds, 0 = off")
        p.add_argument("--time-limit-s", type=float, default=None, help="fitting budget")
        p.add_argument(
            "--pipeline-model",
            default=None,
            choices=["paper", "async-copy"],
            help="gemm-ws: the pipeline model to fit under; default: the device's",
        )

    models = ["gemm-ws", "many-bsp"]
    calibrate = sub.add_parser("calibrate", help="fit a device's figures to measured runs")
    calibrate.add_argument(
        "file", type=Path, nargs="?", default=None, help="JSON lines, one run per line"
    )
    calibrate.add_argument(
        "--from-torch",
        action="store_true",
        help="time torch.matmul over a standard shape set on this machine's GPU (needs torch "
        "and CUDA) and fit to those configuration-less runs",
    )
    calibrate.add_argument(
        "--dtype", default="tf32", choices=["fp32", "tf32", "fp16", "bf16"], help="--from-torch"
    )
    calibrate.add_argument(
        "--write", type=Path, default=None, help="--from-torch: save the runs there, post nothing"
    )
    calibrate.add_argument("--model", default=None, choices=models, help="default: the lines'")
    calibrate.add_argument("--device", required=True, help="base profile id (kperf devices)")
    fit_options(calibrate)
    cli_kernel_tuner.add_options(calibrate)
    client_options(calibrate)
    calibrate.set_defaults(handler=_calibrate, kind="out_err")

    recalibrate = sub.add_parser("recalibrate", help="refit a device from its recorded runs")
    recalibrate.add_argument("device_id")
    recalibrate.add_argument("--model", default=None, choices=models)
    fit_options(recalibrate)
    client_options(recalibrate)
    recalibrate.set_defaults(handler=_recalibrate, kind="out_err")

    measurements = sub.add_parser("measurements", help="a device's record of measured runs")
    measurements_sub = measurements.add_subparsers(dest="action", required=True)
    add = measurements_sub.add_parser("add", help="append measured runs from a JSON-lines file")
    add.add_argument("file", type=Path, help="JSON lines, one measured run per line")
    add.add_argument("--device", required=True, help="profile id or name")
    add.add_argument("--model", default=None, choices=models, help="default: the lines'")
    client_options(add)
    add.set_defaults(handler=_measurements_add, kind="out_err")
    listing = measurements_sub.add_parser("list", help="print a device's runs as JSON lines")
    listing.add_argument("device_id")
    client_options(listing)
    listing.set_defaults(handler=_measurements_list, kind="out")

    add_table_parser(sub, client_options, _client)

    devices = sub.add_parser("devices", help="list device profiles, or show one")
    devices.add_argument("device_id", nargs="?", default=None)
    client_options(devices)
    devices.set_defaults(handler=_devices, kind="out")
    return parser


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        code = _dispatch(build_parser().parse_args(argv), out, err)
        out.flush()  # here, not at exit: a reader gone by now is answered below
    except BrokenPipeError:
        # the reader of the output left (``kperf ... | head -1``): it has what it wanted, so
        # no error and no "Exception ignored" at exit (stdout then points at /dev/null)
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 0
    return code


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.kind == "sync":
        try:
            code: int = args.handler(args)
        except ServerNotInstalled as exc:
            err.write(f"error: {exc}\n")
            return 2
        return code
    handler: Callable[..., Coroutine[Any, Any, int]] = args.handler
    call_args = (args, out, err) if args.kind == "out_err" else (args, out)
    try:
        return asyncio.run(handler(*call_args))
    except KperfError as exc:
        if getattr(args, "json", False):
            problem = {k: v for k, v in exc.problem.items() if not k.startswith("_")}
            _print_json({"status": exc.status, **problem}, out)
        else:
            err.write(f"error: {exc}\n")
            for field, reason in exc.field_errors:
                err.write(f"  {field}: {reason}\n")
        return 1
    except (RunsFileError, TunerInputError, ServerNotInstalled) as exc:
        err.write(f"error: {exc}\n")
        return 2
    except BrokenPipeError:
        raise  # the output's reader left: main answers it
    except (OSError, httpx.HTTPError) as exc:
        err.write(f"error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
