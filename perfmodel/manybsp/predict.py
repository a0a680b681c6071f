"""``predict_kernel``: the one entry point of the Many-BSP predictor (pure, picklable I/O)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field

from perfmodel.errors import ModelInputError
from perfmodel.manybsp.block import analyse_block
from perfmodel.manybsp.classify import Classified, classify
from perfmodel.manybsp.device import DeviceFigures
from perfmodel.manybsp.frontend import FrontEndResult, LaunchContext, build_table
from perfmodel.manybsp.kernel import combine_block_classes, estimate_kernel
from perfmodel.manybsp.ptxas import PtxasUnavailable, ptxas_registers
from perfmodel.manybsp.types import (
    BlockAnalysis,
    BlockRow,
    InstructionCost,
    KernelEstimate,
    LaunchShape,
    Superstep,
)
from perfmodel.ptx import Function, parse_module
from perfmodel.ptx.block_classes import block_classes
from perfmodel.ptx.linear import LinearValues, param_name
from perfmodel.ptx.roles import WarpRole, warp_roles


@dataclass(frozen=True, slots=True)
class PredictRequest:
    """A kernel launch to predict; sizes in threads/blocks, resources per thread/block."""

    ptx: str
    device: DeviceFigures
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    kernel: str | None = None
    registers_per_thread: int | None = None
    shared_bytes_per_block: int | None = None
    loop_trip_counts: Mapping[str, int] = field(default_factory=dict)
    memory_transactions: Mapping[int, int] = field(default_factory=dict)
    clock_mhz: float | None = None
    #: scalar kernel parameter values by name: loop bounds and addresses that depend on them
    #: are evaluated (perfmodel.ptx.linear)
    kernel_args: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RoleResult:
    """The Many-BSP evaluation of one warp role of a warp-specialized kernel: its own Table
    N-1, supersteps and eq. (4)-(25) with w for its warps (docs/model-notes.md, "Warp
    roles"). ``bounds_kernel`` marks the role whose prediction the kernel reports."""

    warps: tuple[int, ...]
    threads: int
    estimate: KernelEstimate
    costs: tuple[InstructionCost, ...]
    class_keys: tuple[str, ...]
    level1: tuple[Superstep, ...]
    bounds_kernel: bool

    def line_of(self, index: int) -> int:
        return self.costs[index].line


@dataclass(frozen=True, slots=True)
class BlockClassResult:
    """The blocks of the grid that run the same part of the kernel, and their estimate
    (eq. (4)-(25) with n_b their count)."""

    blocks: int
    estimate: KernelEstimate
    costs: tuple[InstructionCost, ...]
    level1: tuple[Superstep, ...]
    #: threads of each block that run the class's code (its active warps' threads)
    threads: int = 0


@dataclass(frozen=True, slots=True)
class PredictResult:
    """Everything the response reports. The per-instruction table is Table N-1
    (``costs``: class, unit, latency, u, n_ma) beside Table N-2 (``rows``: issue, FU
    occupancy, comm, ovh, sync); superstep bounds are indices into them (``line_of`` maps an
    index to its 1-based line in the submitted PTX)."""

    kernel: str
    device_id: str
    registers_per_thread: int
    registers_source: str
    shared_bytes_per_block: int
    n_b: int
    n_t: int
    estimate: KernelEstimate
    predicted_time_us: float | None
    costs: tuple[InstructionCost, ...]
    rows: tuple[BlockRow, ...]
    class_keys: tuple[str, ...]
    n_ma_inferred: tuple[bool, ...]
    level1: tuple[Superstep, ...]
    level2: tuple[Superstep, ...]
    warnings: tuple[str, ...]
    #: one entry per warp role when the warps run different paths (empty for SPMD kernels);
    #: the fields above are then those of the role with ``bounds_kernel``
    roles: tuple[RoleResult, ...] = ()
    #: one entry per block class when the grid's blocks run different parts of the kernel
    #: (empty otherwise); the fields above are then those of the costliest class, with
    #: ``estimate.kernel_exec_cycle`` the sum over the classes
    block_classes: tuple[BlockClassResult, ...] = ()
    #: per row of ``costs``: 32-byte sectors a warp's access moves (0: none or not modelled)
    sectors: tuple[int, ...] = ()
    #: per row: the cache level the hit model serves a global load from ("L1", "L2", "")
    cache_level: tuple[str, ...] = ()

    def line_of(self, index: int) -> int:
        return self.costs[index].line


def _check_launch(req: PredictRequest, n_t: int, regs: int, shared: int) -> None:
    dev = req.device.device
    if dev.max_threads_per_block is not None and n_t > dev.max_threads_per_block:
        raise ModelInputError(
            "launch.block",
            f"{n_t} threads per block exceed the device limit of {dev.max_threads_per_block}",
        )
    if n_t > dev.max_threads_per_sm:
        raise ModelInputError(
            "launch.block",
            f"{n_t} threads per block exceed the {dev.max_threads_per_sm} threads an SM holds",
        )
    if dev.max_registers_per_thread is not None and regs > dev.max_registers_per_thread:
        raise ModelInputError(
            "resources.registers_per_thread",
            f"{regs} registers exceed the device limit of {dev.max_registers_per_thread}",
        )
    if regs * n_t > dev.registers_per_sm:
        raise ModelInputError(
            "resources.registers_per_thread",
            f"{regs} registers x {n_t} threads exceed the {dev.registers_per_sm} registers of "
            "an SM; the block cannot launch",
        )
    limit = dev.shared_memory_per_block_bytes or dev.shared_memory_per_sm_bytes
    if shared > limit:
        raise ModelInputError(
            "resources.shared_bytes_per_block",
            f"{shared} bytes exceed the {limit} bytes of shared memory a block may use",
        )


#: why a prediction left the range of a double: eq. (10) multiplies by the loop trip counts,
#: eq. (22) by the grid size, and tiny device figures divide
_OVERFLOW_REASON = (
    "the prediction overflows a double (more than ~1.8e308 cycles): lower loop_trip_counts "
    "or launch.grid, or check the device figures"
)


def _all_finite(values: Iterable[object]) -> bool:
    return all(math.isfinite(v) for v in values if isinstance(v, float))


def predict_kernel(req: PredictRequest) -> PredictResult:
    """Parse the PTX, build Table N-1/N-2 and the supersteps, and evaluate eq. (4)-(25)."""
    for axis, v in zip("xyz", req.grid, strict=True):
        if v < 1:
            raise ModelInputError(f"launch.grid.{axis}", "the grid must have >= 1 block per axis")
    for axis, v in zip("xyz", req.block, strict=True):
        if v < 1:
            raise ModelInputError(f"launch.block.{axis}", "a block needs >= 1 thread per axis")
    module = parse_module(req.ptx)
    fn = module.entry(req.kernel)
    n_t = req.block[0] * req.block[1] * req.block[2]
    n_b = req.grid[0] * req.grid[1] * req.grid[2]
    warnings: list[str] = []

    if req.registers_per_thread is not None:
        regs, regs_source = req.registers_per_thread, "request"
    else:
        try:
            regs, arch = ptxas_registers(req.ptx, fn.name, module.target)
        except PtxasUnavailable as exc:
            raise ModelInputError(
                "resources.registers_per_thread",
                f"required: ptxas could not report the registers per thread ({exc}); give "
                "resources.registers_per_thread",
            ) from None
        regs_source = f"ptxas -v ({arch})"
        if arch != module.target:
            warnings.append(
                f"registers from ptxas for {arch}: this ptxas does not compile {module.target}"
            )
    shared = (
        req.shared_bytes_per_block if req.shared_bytes_per_block is not None else fn.shared_bytes
    )
    _check_launch(req, n_t, regs, shared)

    figs = req.device
    launch = LaunchShape(n_b=n_b, n_t=n_t, registers_per_thread=regs, shared_bytes_per_block=shared)
    _check_kernel_args(fn, req.kernel_args)
    dev = figs.device
    context = LaunchContext(
        values=LinearValues(fn, req.block, req.grid, req.kernel_args),
        block=req.block,
        grid=req.grid,
        sector_bytes=dev.sector_bytes,
        l2_hit_latency_cycles=dev.l2_hit_latency_cycles,
        l2_cache_bytes=dev.l2_cache_bytes,
    )
    roles = warp_roles(fn, req.block)
    classified = [classify(ins) for ins in fn.instructions]  # shared by the roles
    # block classes on the profiles of today's GPUs (docs/model-notes.md, "Block classes")
    classes = (
        block_classes(fn, req.block, req.grid, context.values)
        if len(roles) == 1 and dev.sector_bytes
        else ()
    )
    class_evaluations: list[_Evaluation] = []
    if len(classes) > 1 or (classes and (classes[0].fixed_branches or classes[0].iterations_run)):
        # blocks that run different parts of the kernel: each class is its own grid of
        # identical blocks, and the kernel takes them all (docs/model-notes.md, "Block classes")
        for c in classes:
            # warps a guard leaves idle in every iteration leave at once: the class is its
            # active warps (eq. (6)'s w and the floor count them; eq. (21) the whole block)
            threads = min(n_t, 32 * c.active_warps) if c.active_warps else n_t
            as_role = WarpRole(
                tuple(range(-(-threads // 32))), threads, c.fixed_branches, c.instructions
            )
            shape = dataclasses.replace(launch, n_b=c.blocks)
            e = _evaluate(req, fn, as_role, shape, classified, context, c.iterations_run, True)
            class_evaluations.append(
                dataclasses.replace(e, role=None, blocks=c.blocks, threads=threads)
            )
        evaluations = class_evaluations
        _check_trip_count_keys(req, fn, evaluations)
    else:
        evaluations = [
            _evaluate(req, fn, None if len(roles) == 1 else role, launch, classified, context)
            for role in roles
        ]
    if len(roles) > 1:
        _check_trip_count_keys(req, fn, evaluations)
    for e in evaluations:
        warnings.extend(e.table.warnings)
    warnings = list(dict.fromkeys(warnings))  # roles share lines: say each thing once
    # the kernel is bounded by its slowest role (docs/model-notes.md, "Warp roles")
    bound = max(evaluations, key=lambda e: e.estimate.kernel_exec_cycle)
    table, analysis, est = bound.table, bound.analysis, bound.estimate
    if class_evaluations:
        # the classes share the SMs: one eq. (24) for the grid
        est = combine_block_classes(est, [e.estimate for e in class_evaluations], dev)
    clock = req.clock_mhz if req.clock_mhz is not None else figs.clock_mhz
    # inf or nan cannot travel in JSON (they would reach the client as null in a number field)
    numbers: list[object] = []
    for e in evaluations:
        numbers += astuple(e.estimate)
        for row in e.analysis.rows:
            numbers += [row.issue_cycles, *row.fu_cycles, row.comm_cycles, row.ovh_cycles]
            numbers += [row.sync_cycles]
        for step in (*e.analysis.level1, *e.analysis.level2):
            numbers += [step.comp_cycles, step.comm_cycles, step.ovh_cycles]
    if not _all_finite(numbers):
        raise ModelInputError("body", _OVERFLOW_REASON)
    predicted_time_us = est.kernel_exec_cycle / clock if clock else None
    if predicted_time_us is not None and not math.isfinite(predicted_time_us):
        raise ModelInputError(
            "clock_mhz" if req.clock_mhz is not None else "device_params.hardware.clock_mhz",
            f"{est.kernel_exec_cycle} cycles at {clock} MHz overflow a double; give a real "
            "clock frequency in MHz",
        )
    return PredictResult(
        kernel=fn.name,
        device_id=figs.device_id,
        registers_per_thread=regs,
        registers_source=regs_source,
        shared_bytes_per_block=shared,
        n_b=n_b,
        n_t=n_t,
        estimate=est,
        predicted_time_us=predicted_time_us,
        costs=table.costs,
        rows=analysis.rows,
        class_keys=table.class_keys,
        n_ma_inferred=table.n_ma_inferred,
        level1=analysis.level1,
        level2=analysis.level2,
        warnings=tuple(warnings),
        roles=tuple(
            RoleResult(
                warps=e.role.warps,
                threads=e.role.threads,
                estimate=e.estimate,
                costs=e.table.costs,
                class_keys=e.table.class_keys,
                level1=e.analysis.level1,
                bounds_kernel=e is bound,
            )
            for e in evaluations
            if e.role is not None
        ),
        block_classes=tuple(
            BlockClassResult(
                blocks=e.blocks,
                threads=e.threads,
                estimate=e.estimate,
                costs=e.table.costs,
                level1=e.analysis.level1,
            )
            for e in class_evaluations
        ),
        sectors=table.sectors,
        cache_level=table.cache_level,
    )


@dataclass(frozen=True, slots=True)
class _Evaluation:
    role: WarpRole | None  # None: every warp runs the same code
    table: FrontEndResult
    analysis: BlockAnalysis
    estimate: KernelEstimate
    blocks: int = 0  #: a block class's blocks (0: not a block class)
    threads: int = 0  #: a block class's threads per block that run its code


def _evaluate(
    req: PredictRequest,
    fn: Function,
    role: WarpRole | None,
    launch: LaunchShape,
    classified: Sequence[Classified | None],
    context: LaunchContext | None = None,
    iterations_run: Mapping[int, tuple[int, int]] | None = None,
    block_class: bool = False,
) -> _Evaluation:
    """Table N-1/N-2, supersteps and eq. (4)-(25) for ``role``'s warps (all warps if None).

    eq. (6) counts the role's own threads into w; eq. (21) keeps the whole block, which is
    what occupies the SM.
    """
    figs = req.device
    dev = figs.device
    table = build_table(
        fn,
        figs.class_map(),
        mem_lat_cycles=dev.mem_lat_cycles,
        l1_hit_latency_cycles=figs.l1_hit_latency_cycles,
        barrier_overhead_cycles=figs.bar_sync_overhead_cycles(launch.n_t),
        loop_trip_counts=req.loop_trip_counts,
        memory_transactions=req.memory_transactions,
        segment_bytes=dev.segment_bytes,
        warp_size=dev.warp_size,
        role=role,
        classified=classified,
        launch=context,
        iterations_run=iterations_run,
    )
    n_t = launch.n_t if role is None else role.threads
    try:
        analysis = analyse_block(table.costs, table.spans, n_t, dev)
        threads = n_t if block_class else 0  # a block class's floor counts its own warps
        est = estimate_kernel(table.costs, analysis.level1, analysis.w, launch, dev, threads)
    except OverflowError as exc:  # an int too large for a float (huge trip counts or grid)
        raise ModelInputError("body", _OVERFLOW_REASON) from exc
    return _Evaluation(role, table, analysis, est)


def _check_trip_count_keys(
    req: PredictRequest, fn: Function, evaluations: Iterable[_Evaluation]
) -> None:
    """With roles, a ``loop_trip_counts`` key must name a loop of some role."""
    known: set[str] = set()
    for e in evaluations:
        known |= e.table.loop_headers
    for label in req.loop_trip_counts:
        if label not in known:
            raise ModelInputError(
                f"loop_trip_counts.{label}",
                f"no loop of kernel {fn.name!r} has header {label!r}; loop headers: "
                + (", ".join(sorted(known)) or "none"),
            )


def _check_kernel_args(fn: Function, args: Mapping[str, float]) -> None:
    """Each ``kernel_args`` name must be a parameter of the kernel, and a parameter the PTX
    reads as an integer needs a whole number."""
    int_params: set[str] = set()
    for ins in fn.instructions:
        name = param_name(ins)
        if name is not None and any(m[:1] in "usb" and m[1:].isdigit() for m in ins.modifiers):
            int_params.add(name)
    for name, value in args.items():
        if name not in fn.params:
            raise ModelInputError(
                f"kernel_args.{name}",
                f"kernel {fn.name!r} has no parameter {name!r}; its parameters: "
                + (", ".join(fn.params) or "none"),
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelInputError(f"kernel_args.{name}", "a kernel argument must be a number")
        if not math.isfinite(value):
            raise ModelInputError(f"kernel_args.{name}", "a kernel argument must be finite")
        if name in int_params and value != int(value):
            raise ModelInputError(
                f"kernel_args.{name}",
                f"parameter {name!r} is read as an integer; {value} is not a whole number",
            )
