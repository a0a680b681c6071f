"""Conversions for POST /predict-kernel: request schema -> core request, core result ->
response schema. Used by the route (early 4xx checks) and by the worker job alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter

from app.convert.fields import shared_fields
from app.schemas.base import provenance_out
from app.schemas.predict import (
    BlockClassOut,
    FuCycles,
    InstructionOut,
    KernelLaunch,
    ListsInfo,
    PredictKernelRequest,
    PredictKernelResponse,
    SuperstepModel,
    WarpRoleOut,
)
from device_profiles import DeviceProfile, get_profile
from device_profiles.provenance import Provenance
from perfmodel.errors import ModelInputError
from perfmodel.manybsp import (
    DeviceFigures,
    PredictRequest,
    PredictResult,
    RoleResult,
    Superstep,
    device_from_profile,
)
from perfmodel.manybsp.frontend import UNCOSTED
from perfmodel.manybsp.kernel import KernelTerms, kernel_terms

#: largest PTX text in UTF-8 bytes when :func:`to_core` is given no limit; the service passes
#: its setting (KPERF_MAX_PTX_BYTES, same default) instead
MAX_PTX_BYTES = 2_000_000


#: the statement limit is one ``;`` per this many bytes of the byte limit (100,000 for 2 MB).
#: The analysis costs memory and time per instruction, not per byte: within 2 MB, 4-byte
#: ``ret;`` statements made 494,000 instructions and a 375 MB, 11 s CPU request, where nvcc's
#: output averages about 30 bytes a statement (bench/bench_ptx_memory.py)
BYTES_PER_STATEMENT = 20


class PTXTooLarge(ValueError):
    """The submitted PTX exceeds the size limit, in bytes or in statements (413)."""

    def __init__(self, size_bytes: int, limit_bytes: int, statements: int | None = None) -> None:
        if statements is None:
            reason = f"ptx is {size_bytes} bytes; the limit is {limit_bytes} bytes"
        else:
            reason = (
                f"ptx has {statements} statements (';'); the limit is "
                f"{limit_bytes // BYTES_PER_STATEMENT}, one per {BYTES_PER_STATEMENT} bytes of "
                f"the {limit_bytes}-byte limit"
            )
        super().__init__(
            f"{reason}: submit one kernel's module, or strip debug sections (.loc/.file) first"
        )
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


def resolve_device(
    request: PredictKernelRequest, profile: DeviceProfile | None = None
) -> DeviceFigures:
    """The Many-BSP figures of ``profile`` (what ``request.device`` resolved to: the service
    resolves calibrated ids and names, ``Service.resolve_profile``; None looks up a shipped
    id) or of the inline ``device_params``."""
    if request.device is not None and request.device_params is not None:
        raise ModelInputError("device", "give either device or device_params, not both")
    if request.device is not None:
        return device_from_profile(profile if profile is not None else get_profile(request.device))
    if request.device_params is not None:
        return device_from_profile(request.device_params, field_prefix="device_params")
    raise ModelInputError("device", "give a device profile id (GET /devices) or device_params")


def check_ptx_size(ptx: str, limit_bytes: int | None = None) -> None:
    """Refuse PTX over ``limit_bytes`` UTF-8 bytes (default :data:`MAX_PTX_BYTES`), or with
    more statements than one per :data:`BYTES_PER_STATEMENT` bytes of that limit (each ``;``
    counted, comments' too: an upper bound on the instructions, found without parsing)."""
    limit = MAX_PTX_BYTES if limit_bytes is None else limit_bytes
    size = len(ptx.encode("utf-8"))
    if size > limit:
        raise PTXTooLarge(size, limit)
    statements = ptx.count(";")
    if statements > limit // BYTES_PER_STATEMENT:
        raise PTXTooLarge(size, limit, statements)


def launch_to_core(
    launch: KernelLaunch, device: DeviceFigures, clock_mhz: float | None = None
) -> PredictRequest:
    """The core request of a kernel launch on ``device``."""
    grid, block = launch.launch.grid, launch.launch.block
    return PredictRequest(
        ptx=launch.ptx,
        device=device,
        grid=(grid[0], grid[1], grid[2]),
        block=(block[0], block[1], block[2]),
        kernel=launch.kernel,
        registers_per_thread=launch.resources.registers_per_thread,
        shared_bytes_per_block=launch.resources.shared_bytes_per_block,
        loop_trip_counts=dict(launch.loop_trip_counts),
        memory_transactions=dict(launch.memory_transactions),
        clock_mhz=clock_mhz,
        kernel_args=dict(launch.kernel_args),
    )


def to_core(
    request: PredictKernelRequest,
    limit_bytes: int | None = None,
    profile: DeviceProfile | None = None,
) -> PredictRequest:
    """The core request; refuses PTX over ``limit_bytes`` (default :data:`MAX_PTX_BYTES`).
    ``profile``: what ``request.device`` resolved to (see :func:`resolve_device`)."""
    check_ptx_size(request.ptx, limit_bytes)
    return launch_to_core(request, resolve_device(request, profile), request.clock_mhz)


def _step(result: PredictResult | RoleResult, s: Superstep) -> SuperstepModel:
    return SuperstepModel(
        start_line=result.line_of(s.start),
        end_line=result.line_of(s.end),
        comp_cycles=s.comp_cycles,
        comm_cycles=s.comm_cycles,
        ovh_cycles=s.ovh_cycles,
        iterations=s.iterations,
    )


def to_response(
    result: PredictResult,
    clock_mhz: float | None,
    interval_cycles: tuple[float, float] | None = None,
    origin: Provenance | None = None,
    *,
    lists: bool = True,
) -> PredictKernelResponse:
    """The full answer; ``lists=False`` leaves the instruction and superstep lists empty (their
    totals still counted) for :func:`encode_view` to build only the page a request asks for."""
    e = result.estimate
    page: dict[str, Any] = _page(result, 0, None) if lists else _page(result, 0, 0)
    return PredictKernelResponse(
        predicted_cycles_interval=list(interval_cycles) if interval_cycles else None,
        profile_provenance=provenance_out(origin) if origin is not None else None,
        device=result.device_id,
        predicted_cycles=e.kernel_exec_cycle,
        clock_mhz=clock_mhz,
        # the launch (kernel, n_b, n_t, registers, shared bytes) and the time, as analysed
        **shared_fields(PredictKernelResponse, result, besides=("warnings", "block_classes")),
        **shared_fields(PredictKernelResponse, e),
        **page,
        warnings=_bounded(result.warnings),
        warp_roles=[_role(r) for r in result.roles],
        block_classes=[
            BlockClassOut(
                blocks=c.blocks,
                predicted_cycles=c.estimate.kernel_exec_cycle,
                throughput_floor_cycles=c.estimate.throughput_floor_cycles,
                instructions=len(c.costs),
            )
            for c in result.block_classes
        ],
        lists=ListsInfo(
            detail="full",
            offset=0,
            instructions_total=len(result.costs),
            level1_supersteps_total=len(result.level1),
            level2_supersteps_total=len(result.level2),
            note=None,
        ),
    )


#: warnings an answer lists; the model may give one per line (a class the device does not
#: cost, a loop without a trip count): 80,000 of them made a 6.5 MB "summary"
MAX_WARNINGS = 100


def _bounded(warnings: tuple[str, ...]) -> list[str]:
    if len(warnings) <= MAX_WARNINGS:
        return list(warnings)
    # the per-opcode summaries ("uncosted: OPCODE (n x, lines ...)") say what the prediction
    # leaves out and are few; the per-line notes repeat them line by line: summaries first
    ordered = sorted(warnings, key=lambda w: w.startswith("line "))
    left = len(warnings) - (MAX_WARNINGS - 1)
    return [*ordered[: MAX_WARNINGS - 1], f"{left} more warnings left out"]


def _role(r: RoleResult) -> WarpRoleOut:
    e = r.estimate
    return WarpRoleOut(
        warps=list(r.warps),
        threads=r.threads,
        instructions=len(r.costs),
        uncosted_instructions=sum(1 for k in r.class_keys if k == UNCOSTED),
        predicted_cycles=e.kernel_exec_cycle,
        **shared_fields(WarpRoleOut, e),
        bounds_kernel=r.bounds_kernel,
        level1_supersteps=[_step(r, s) for s in r.level1],
    )


_RESPONSE_JSON = TypeAdapter(PredictKernelResponse)


#: list items built and encoded at a time by :func:`encode_view`
_CHUNK = 1024
_PAGE_JSON: dict[str, TypeAdapter[Any]] = {
    "instructions": TypeAdapter(list[InstructionOut]),
    "level1_supersteps": TypeAdapter(list[SuperstepModel]),
    "level2_supersteps": TypeAdapter(list[SuperstepModel]),
}
#: the models of the lists' items from one index to another
_Items = Callable[[int, int], dict[str, list[Any]]]


def _page(result: PredictResult, start: int, stop: int | None) -> dict[str, list[Any]]:
    """The three lists' models from ``start`` to ``stop`` (a list slice's bounds)."""
    return {
        "instructions": _instructions(result, start, stop),
        "level1_supersteps": [_step(result, s) for s in result.level1[start:stop]],
        "level2_supersteps": [_step(result, s) for s in result.level2[start:stop]],
    }


def _lists_json(items: _Items, first: int, last: int, budget: int | None) -> list[bytes] | None:
    """``"name":[...]`` of each list from ``first`` to ``last``, encoded a chunk at a time (the
    models of one chunk exist at once, not of the whole list); None once they pass ``budget``
    bytes."""
    parts: dict[str, list[bytes]] = {name: [] for name in _PAGE_JSON}
    size = 0
    for chunk in range(first, last, _CHUNK):
        for name, models in items(chunk, min(chunk + _CHUNK, last)).items():
            if models:
                encoded = _PAGE_JSON[name].dump_json(models)[1:-1]  # without its brackets
                parts[name].append(encoded)
                size += len(encoded) + 1
        if budget is not None and size > budget:
            return None
    return [b'"%s":[%s]' % (name.encode(), b",".join(p)) for name, p in parts.items()]


def encode_view(
    full: PredictKernelResponse,
    request: PredictKernelRequest,
    summary_above_bytes: int,
    result: PredictResult | None = None,
) -> bytes:
    """The JSON body of the answer the request asked for (``detail``, ``list_offset``,
    ``list_limit``) from the full answer; ``auto`` leaves the lists out above
    ``summary_above_bytes``.

    With ``result`` (``full`` then made with ``lists=False``) the lists' models are built from
    it. Either way the lists are encoded a chunk at a time, and an ``auto`` answer stops
    encoding at the limit: a 2 MB module's 150,000 instruction and superstep models took
    ~320 MB at once, and their JSON ~120 MB more, only to be left out
    (bench/bench_ptx_memory.py)."""
    start = request.list_offset
    stop = None if request.list_limit is None else start + request.list_limit
    totals = full.lists
    note = "lists left out: detail=summary was asked"
    if request.detail != "summary":
        items: _Items = (
            (lambda a, b: _page(result, a, b))
            if result is not None
            else (
                lambda a, b: {
                    "instructions": full.instructions[a:b],
                    "level1_supersteps": full.level1_supersteps[a:b],
                    "level2_supersteps": full.level2_supersteps[a:b],
                }
            )
        )
        longest = max(
            totals.instructions_total,
            totals.level1_supersteps_total,
            totals.level2_supersteps_total,
        )
        first, last, _ = slice(start, stop).indices(longest)
        budget = summary_above_bytes if request.detail == "auto" else None
        lists = _lists_json(items, first, last, budget)
        if lists is not None:
            page = full.model_copy(
                update={"lists": totals.model_copy(update={"detail": "full", "offset": start})}
            )
            head = _RESPONSE_JSON.dump_json(page, exclude=set(_PAGE_JSON))
            body = b"".join((head[:-1], b",", b",".join(lists), b"}"))
            if request.detail == "full" or len(body) <= summary_above_bytes:
                return body
        note = (
            f"lists left out: with them this answer is more than {summary_above_bytes} bytes, "
            "this server's limit for full answers; ask for detail=full, or page with "
            "list_offset and list_limit"
        )
    summary = full.model_copy(
        update={
            "instructions": [],
            "level1_supersteps": [],
            "level2_supersteps": [],
            "lists": totals.model_copy(update={"detail": "summary", "offset": start, "note": note}),
        }
    )
    return _RESPONSE_JSON.dump_json(summary)


def _instructions(
    result: PredictResult, start: int = 0, stop: int | None = None
) -> list[InstructionOut]:
    """The instruction list's models from ``start`` to ``stop`` (a list slice's bounds)."""
    out = []
    first, last, _ = slice(start, stop).indices(len(result.costs))
    for i in range(first, last):
        c, r = result.costs[i], result.rows[i]
        f = r.fu_cycles
        uncosted = result.class_keys[i] == UNCOSTED
        out.append(
            InstructionOut(
                line=c.line,
                opcode=c.opcode,
                instruction_class=result.class_keys[i],
                fu=c.fu.value,
                latency_cycles=None if uncosted else c.latency_cycles,
                throughput_per_ws=None if uncosted else c.throughput_per_ws,
                u=result.line_of(c.consumer) if c.consumer is not None else None,
                d=1 if c.consumer == i + 1 else 0,
                n_ma=c.n_ma,
                n_ma_inferred=result.n_ma_inferred[i],
                sectors=result.sectors[i] if result.sectors else 0,
                cache_level=result.cache_level[i] if result.cache_level else "",
                issue_cycles=r.issue_cycles,
                fu_cycles=FuCycles(SPs=f[0], DPU=f[1], SFU=f[2], LDST=f[3]),
                comm_cycles=r.comm_cycles,
                ovh_cycles=r.ovh_cycles,
                sync_cycles=r.sync_cycles,
            )
        )
    return out


#: the fields of an answer that its breakdown picture reads (render.breakdown_svg)
BREAKDOWN_FIELDS = frozenset(
    {
        "kernel",
        "device",
        "n_b",
        "predicted_cycles",
        "predicted_time_us",
        "clock_mhz",
        "equation",
        "comp",
        "novlp",
        "rho",
        "K",
        "tau",
        "mu",
        "level1_supersteps",
    }
)


def terms_of(answer: Mapping[str, Any], figures: DeviceFigures) -> KernelTerms:
    """The eq. (24)/(25) addends of an answer (its JSON, :data:`BREAKDOWN_FIELDS` at
    least), with the device's n_sm and block_lnch_ovh."""
    device = figures.device
    return kernel_terms(
        block_launch_overhead_cycles=device.block_launch_overhead_cycles,
        n_b=int(answer["n_b"]),
        n_sm=device.n_sm,
        comp=float(answer["comp"]),
        novlp=float(answer["novlp"]),
        rho=int(answer["rho"]),
        K=float(answer["K"]),
        tau=int(answer["tau"]),
        mu=float(answer["mu"]),
    )
