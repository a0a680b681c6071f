"""Calibration from plain library timings under the L2-aware model (gemm_ws_memory_model).

A run may leave out its configuration. It then means "the fastest kernel's time for this
shape" (torch.matmul, cuBLAS, XLA) and is fitted as the model's optimum over the default space;
a run that names its configuration is fitted as that configuration's time. Both kinds mix in
one fit.

Fitted: eight log-scale figures (MATH throughput, L2 and DRAM bandwidth, load latency scale,
T_INIT, T_EPILOGUE, split-K reduction overhead, MATH startup), maximum a posteriori: robust
(soft-L1) least squares on ln(predicted / measured) plus log-normal prior residuals, scipy's
trf. Speed: each run's traffic geometry is computed once; a configuration-less run is then
scored on its shortlist, the configurations within a factor of its base optimum (the optimum
under figures near the base lies among them), re-drawn once around the fitted figures; the
Jacobian differences only each run's optimum configuration (the envelope of a minimum).
A configured run may name its kernel's threads per CTA and registers per thread, which bound
its CTAs per SM, and whether its library reduced split-K in the kernel (perfmodel.calibration.
harness: serial split-K); a fit may also take the runs as framework timings (a floor).
docs/model-notes.md, "Memory hierarchy, L2 reuse, split-K and tf32" 4.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from perfmodel.calibration.harness import (
    KERNEL_TIMES,
    SERIAL_HANDOFF_L2_ROUND_TRIPS,
    Harness,
    observed_us,
    serial_split_k_us,
)
from perfmodel.calibration.records import KernelResources
from perfmodel.errors import CalibrationInputError
from perfmodel.gemm_ws import ELEMENT_BYTES, SmLimits
from perfmodel.gemm_ws_memory_model import (
    MemoryModelFigures,
    Recurrences,
    ShapeModel,
    Space,
    feasible,
)
from perfmodel.gemm_ws_traffic import FloatArray, MemoryFigures

#: the fitted figures, in parameter order, with the prior sigma of ln(figure / base)
FITTED: tuple[tuple[str, float], ...] = (
    ("compute_throughput_macs_per_us", 0.5),
    ("l2_bandwidth_gb_per_s", 0.3),
    ("dram_bandwidth_gb_per_s", 0.2),
    ("load_latency_scale", 0.7),
    ("t_init_us", 1.5),
    ("t_epilogue_us", 0.7),
    ("reduction_overhead_us", 1.0),
    ("compute_startup_latency_us", 1.5),
)
FITTED_INDEX = {name: i for i, (name, _) in enumerate(FITTED)}
#: the harness figures a fit may add (perfmodel.calibration.harness), with the prior sigma of
#: ln(figure / base): the floor's base is T_INIT's (the launch), so a framework's call floor of
#: tens of us is 2-3 sigma out; the hand-off's is SERIAL_HANDOFF_L2_ROUND_TRIPS L2 latencies
HARNESS_FITTED: tuple[tuple[str, float], ...] = (
    ("floor_us", 2.0),
    ("serial_handoff_us", 1.5),
)
#: a configuration-less run's shortlist: configurations within this factor of its optimum
SHORTLIST_FACTOR = 3.0
#: relative residual scale of the soft-L1 loss (about the noise of library timings)
NOISE = 0.05
#: forward-difference step of the Jacobian, relative to max(1, |ln scale|)
DIFF_STEP = 1e-3


@dataclass(frozen=True, slots=True)
class LibraryRun(KernelResources):
    """One timed GEMM (``batch`` independent m x n x k products). ``config`` (tile_m, tile_n,
    tile_k, buffer_depth, group_m, split_k) is None for a library's own pick."""

    m: int
    n: int
    k: int
    dtype: str
    measured_time_us: float
    batch: int = 1
    config: tuple[int, int, int, int, int, int] | None = None
    #: the library reduced split-K's partial sums inside the GEMM kernel, slice after slice
    #: (no reduction kernel): the run's split_k > 1 pays hand-offs instead of a second launch
    serial_split_k: bool = False


@dataclass(frozen=True, slots=True)
class Device:
    """What a fit needs of a device: the base figures (for the runs' dtype), SMs, limits."""

    base: MemoryModelFigures
    sm_count: int
    limits: SmLimits
    shared_memory_per_block_bytes: int | None
    pipeline: Recurrences
    space: Space = dataclasses.field(default_factory=Space.product)


def scaled(base: MemoryModelFigures, log_scale: Sequence[float] | FloatArray) -> MemoryModelFigures:
    """``base`` with each fitted figure multiplied by exp(its log scale)."""
    f = dict(
        zip((name for name, _ in FITTED), (math.exp(float(v)) for v in log_scale), strict=True)
    )
    mem = base.memory
    return MemoryModelFigures(
        t_init_us=base.t_init_us * f["t_init_us"],
        t_epilogue_us=base.t_epilogue_us * f["t_epilogue_us"],
        compute_startup_latency_us=base.compute_startup_latency_us
        * f["compute_startup_latency_us"],
        compute_throughput_macs_per_us=base.compute_throughput_macs_per_us
        * f["compute_throughput_macs_per_us"],
        memory=MemoryFigures(
            sm_count=mem.sm_count,
            dram_bandwidth_gb_per_s=mem.dram_bandwidth_gb_per_s * f["dram_bandwidth_gb_per_s"],
            l2_bandwidth_gb_per_s=mem.l2_bandwidth_gb_per_s * f["l2_bandwidth_gb_per_s"],
            l2_size_bytes=mem.l2_size_bytes,
            dram_latency_us=mem.dram_latency_us * f["load_latency_scale"],
            l2_latency_us=mem.l2_latency_us * f["load_latency_scale"],
            sm_clock_ratio=mem.sm_clock_ratio,
        ),
        reduction_overhead_us=base.reduction_overhead_us * f["reduction_overhead_us"],
        shared_memory_bytes_per_us=base.shared_memory_bytes_per_us,
    )


class RunModel:
    """One run's candidate configurations and their traffic geometry."""

    def __init__(self, run: LibraryRun, device: Device, index: int) -> None:
        if run.dtype not in ELEMENT_BYTES:
            raise CalibrationInputError(f"measurements[{index}].dtype", f"unknown {run.dtype!r}")
        element_bytes = ELEMENT_BYTES[run.dtype]
        space = device.space
        if run.config is not None:
            space = Space(*(np.array([v], dtype=np.int64) for v in run.config))
        limits = device.limits
        if run.threads_per_cta is not None:
            limits = dataclasses.replace(
                limits,
                threads_per_cta=run.threads_per_cta,
                registers_per_thread=run.registers_per_thread,
            )
        model = ShapeModel(
            run.m,
            run.n,
            run.k,
            element_bytes,
            space,
            device.sm_count,
            limits,
            device.pipeline,
            run.batch,
        )
        ok = feasible(
            space, run.k, element_bytes, device.shared_memory_per_block_bytes, model.resident
        )
        if not ok.any():
            field = "config" if run.config is not None else "m"
            raise CalibrationInputError(
                f"measurements[{index}].{field}",
                "no configuration of the space runs this shape (shared memory, split_k beyond "
                "k / tile_k)",
            )
        self.model = model.subset(np.flatnonzero(ok))
        self.full = self.model
        self.measured = run.measured_time_us
        #: slices reduced in turn inside the kernel (0: none, or a reduction kernel)
        self.serial_slices = run.config[5] if run.serial_split_k and run.config is not None else 0

    def kernel_figures(self, figures: MemoryModelFigures) -> MemoryModelFigures:
        """``figures`` as this run's kernel sees them: serial split-K launches no reduction
        kernel, so its fixed cost is not paid (the partial sums' bytes still are)."""
        if self.serial_slices > 1:
            return dataclasses.replace(figures, reduction_overhead_us=0.0)
        return figures

    def observed(self, kernel_us: float, harness: Harness) -> float:
        """The run's time for a kernel time under ``harness``: serial split-K's hand-offs,
        then the framework floor."""
        serial = serial_split_k_us(self.serial_slices, harness.serial_handoff_us)
        return observed_us(kernel_us + serial, harness)

    def shortlist(self, figures: MemoryModelFigures) -> None:
        """Keep the configurations within SHORTLIST_FACTOR of the optimum under ``figures``."""
        times, _ = self.full.times_us(self.kernel_figures(figures))
        self.model = self.full.subset(np.flatnonzero(times <= SHORTLIST_FACTOR * times.min()))

    def predict_us(self, figures: MemoryModelFigures, harness: Harness = KERNEL_TIMES) -> float:
        times, _ = self.model.times_us(self.kernel_figures(figures))
        return self.observed(float(times.min()), harness)

    def optimum(self, figures: MemoryModelFigures) -> ShapeModel:
        """The shortlist's fastest configuration under ``figures``, as a one-configuration
        model: the optimum's time moves with the figures as that configuration's does, where
        it stays the optimum (the envelope of a minimum), so derivatives need only it."""
        times, _ = self.model.times_us(self.kernel_figures(figures))
        return self.model.subset(np.array([int(np.argmin(times))]))


@dataclass(frozen=True, slots=True)
class FitResult:
    figures: MemoryModelFigures
    log_scale: tuple[float, ...]
    training_median_error: float
    #: the harness figures (KERNEL_TIMES where the fit added none) and their ln(figure / base)
    harness: Harness = KERNEL_TIMES
    harness_log_scale: tuple[float, ...] = ()


def harness_bases(base: MemoryModelFigures) -> dict[str, float]:
    """Base values of HARNESS_FITTED: T_INIT's for the floor, L2 round trips for a hand-off."""
    return {
        "floor_us": base.t_init_us,
        "serial_handoff_us": SERIAL_HANDOFF_L2_ROUND_TRIPS * base.memory.l2_latency_us,
    }


def harness_of(
    base: MemoryModelFigures, names: Sequence[str], log_scale: Sequence[float] | FloatArray
) -> Harness:
    """The harness with each named figure at its base times exp(its log scale), the others 0."""
    bases = harness_bases(base)
    values = {n: bases[n] * math.exp(float(v)) for n, v in zip(names, log_scale, strict=True)}
    return Harness(**values)


class Objective:
    """The MAP fit's residuals over ln(figure / base): each run's ln(predicted / measured) over
    NOISE, then each figure's prior residual, and their Jacobian."""

    def __init__(
        self, models: Sequence[RunModel], base: MemoryModelFigures, harness: Sequence[str] = ()
    ) -> None:
        self.models, self.base = list(models), base
        self.measured = np.array([m.measured for m in self.models])
        priors = dict(HARNESS_FITTED)
        self.harness = tuple(harness)
        self.sigmas = np.array([s for _, s in FITTED] + [priors[n] for n in self.harness])

    def split(self, x: FloatArray) -> tuple[MemoryModelFigures, Harness]:
        """The model's figures and the harness at ``x`` (FITTED, then the harness names)."""
        n = len(FITTED)
        return scaled(self.base, x[:n]), harness_of(self.base, self.harness, x[n:])

    def residuals(self, x: FloatArray) -> FloatArray:
        figures, harness = self.split(x)
        predicted = np.array([m.predict_us(figures, harness) for m in self.models])
        return np.concatenate([np.log(predicted / self.measured) / NOISE, x / self.sigmas])

    def jacobian(self, x: FloatArray) -> FloatArray:
        """Forward differences (scipy's 2-point steps, DIFF_STEP relative) of each run's
        optimum configuration at ``x``: the shortlist is scored once per Jacobian, not once
        per figure (a minimum moves with its argmin's time while that stays the argmin)."""
        optima = [m.optimum(self.split(x)[0]) for m in self.models]

        def log_times(at: FloatArray) -> FloatArray:
            figures, harness = self.split(at)
            return np.log(
                [
                    m.observed(float(o.times_us(m.kernel_figures(figures))[0][0]), harness)
                    for m, o in zip(self.models, optima, strict=True)
                ]
            )

        at_x = log_times(x)
        n = len(self.models)
        out = np.zeros((n + x.size, x.size))
        for j in range(x.size):
            step = DIFF_STEP * max(1.0, abs(float(x[j])))
            moved = x.copy()
            moved[j] += step
            out[:n, j] = (log_times(moved) - at_x) / step / NOISE
        out[n:] = np.diag(1.0 / self.sigmas)
        return out


def fit(
    runs: Sequence[LibraryRun],
    device: Device,
    *,
    envelope_jacobian: bool = True,
    framework_floor: bool = False,
) -> FitResult:
    """MAP fit of the eight figures to ``runs`` (module docstring). ``envelope_jacobian``
    False: scipy's own differences of the whole objective (every shortlist scored once per
    figure), for the speed bench's comparison. ``framework_floor``: the runs are framework
    calls timed with events, fitted with the harness's floor; a run with serial split-K adds
    the hand-off figure (perfmodel.calibration.harness)."""
    if not runs:
        raise CalibrationInputError("measurements", "at least one run is needed")
    models = [RunModel(r, device, i) for i, r in enumerate(runs)]
    names = ["floor_us"] if framework_floor else []
    if any(m.serial_slices > 1 for m in models):
        names.append("serial_handoff_us")
    objective = Objective(models, device.base, names)
    x = np.zeros(len(FITTED) + len(names))
    if framework_floor:
        # start from the fit without a floor, the floor at its T_INIT (the additive constant
        # that fit found; the floor's base is T_INIT's): where no run sits on the floor, that
        # T_INIT is the launch and the floor stays out of the way
        start = fit(runs, device, envelope_jacobian=envelope_jacobian)
        x[: len(FITTED)] = start.log_scale
        t_init = FITTED_INDEX["t_init_us"]
        x[len(FITTED) :] = [start.log_scale[t_init], *start.harness_log_scale]
    for _ in range(2):  # shortlists at the base, then around the first fit
        figures = objective.split(x)[0]
        for m in models:
            m.shortlist(figures)
        if envelope_jacobian:
            x = least_squares(
                objective.residuals, x, jac=objective.jacobian, loss="soft_l1", method="trf"
            ).x
        else:
            x = least_squares(
                objective.residuals, x, loss="soft_l1", method="trf", diff_step=DIFF_STEP
            ).x
    figures, harness = objective.split(x)
    errors = [abs(m.predict_us(figures, harness) / m.measured - 1) for m in models]
    n = len(FITTED)
    return FitResult(
        figures,
        tuple(float(v) for v in x[:n]),
        float(np.median(errors)),
        harness,
        tuple(float(v) for v in x[n:]),
    )


def predict_optimum_us(run: LibraryRun, device: Device, figures: MemoryModelFigures) -> float:
    """The model's time for ``run``: its configuration's, or the optimum over the space."""
    return RunModel(run, device, 0).predict_us(figures)
