"""Measurement records and calibration results: plain frozen data, no model logic."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.manybsp import PredictRequest
from perfmodel.prior import Prior

GEMM_WS_MODEL = "gemm-ws"
MANY_BSP_MODEL = "many-bsp"
MODELS: tuple[str, ...] = (GEMM_WS_MODEL, MANY_BSP_MODEL)

#: GemmWsMachine fields a GeMM-WS calibration fits by default (§2.2's machine figures less
#: sm_count and the shared-memory limit, which are read off the device, not fitted)
GEMM_WS_FIGURES: tuple[str, ...] = (
    "load_throughput_elements_per_us",
    "compute_throughput_macs_per_us",
    "load_startup_latency_us",
    "compute_startup_latency_us",
    "t_init_us",
    "t_epilogue_us",
)

#: ManyBspDevice fields a Many-BSP calibration fits by default: eq. (24)/(25)'s mu, the
#: launch overheads of eq. (4)/(5) and the throughput floor's efficiency (Volta+ profiles)
MANY_BSP_FIGURES: tuple[str, ...] = (
    "mu",
    "block_launch_overhead_cycles",
    "warp_launch_overhead_cycles",
    "throughput_efficiency",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelResources:
    """A timed kernel's threads per CTA and registers per thread, when known (a profiler names
    them beside the kernel): with the device's thread and register limits they bound the CTAs
    resident per SM, which the async-copy pipeline model shares an SM among (None: no limit
    from them). Keyword-only: a run record gives them after its own fields."""

    threads_per_cta: int | None = None
    registers_per_thread: int | None = None


@dataclass(frozen=True, slots=True)
class GemmWsMeasurement(KernelResources):
    """One timed GEMM: problem (m, n, k) in elements, dtype (a key of ELEMENT_BYTES), the
    tiling it ran with, and its measured time in microseconds."""

    m: int
    n: int
    k: int
    dtype: str
    tile_m: int
    tile_n: int
    tile_k: int
    buffer_depth: int
    measured_time_us: float


@dataclass(frozen=True, slots=True)
class ManyBspMeasurement:
    """One timed kernel launch; ``request.device`` is the device whose figures are calibrated
    (the same figures as the ``base`` given to the fit)."""

    request: PredictRequest
    measured_cycles: float


@dataclass(frozen=True, slots=True)
class FittedFigure:
    """One figure at the maximum a posteriori (MAP) fit.

    ``value`` is the MAP value (what the data determine is fitted; a direction they do not see
    stays where the prior holds it). ``standard_error`` is the posterior sd in the figure's unit
    (Laplace approximation); ``identifiable`` is true when the data determine the figure on its
    own (they shrink its prior sd at least by half). The prior (median, sd of ln value, source)
    and the 10-90 % posterior interval are in the figure's unit.
    """

    name: str
    value: float
    base_value: float
    standard_error: float | None
    identifiable: bool
    prior: Prior | None = None
    posterior_sd_log: float | None = None
    interval_low: float | None = None
    interval_high: float | None = None


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """Absolute relative errors of predictions against measurements, in percent."""

    mean_abs_pct: float
    max_abs_pct: float


@dataclass(frozen=True, slots=True)
class Residual:
    """Measurement ``index`` (its position in the input) against its prediction, in the
    model's unit (microseconds for GeMM-WS, cycles for Many-BSP);
    ``error_pct = 100 (predicted - measured) / measured``; ``predicted_low`` and
    ``predicted_high`` bound the prediction's 10-90 % posterior interval (None where no
    posterior was drawn, as for cross-validated predictions)."""

    index: int
    measured: float
    predicted: float
    error_pct: float
    predicted_low: float | None = None
    predicted_high: float | None = None


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    model: str
    fitted: tuple[FittedFigure, ...]
    training_error: ErrorSummary
    cross_validation_error: ErrorSummary | None
    residuals: tuple[Residual, ...]
    warnings: tuple[str, ...]
    method: str
    #: each measurement predicted by the fit of the folds that left it out (empty when
    #: cross-validation is off or could not run)
    cross_validation_residuals: tuple[Residual, ...] = ()
    #: the combinations of figures the data determine, in words (docs/model-notes.md)
    determined_combinations: tuple[str, ...] = ()
    #: the relative noise of the runs the fit estimated (percent) and how many figures' worth
    #: the runs determine (0 .. number of fitted figures)
    noise_pct: float | None = None
    effective_figures: float | None = None
    #: the Laplace posterior of ln(figure values), figures in the order of ``fitted``
    posterior_mean_log: tuple[float, ...] = ()
    posterior_covariance_log: tuple[tuple[float, ...], ...] = ()

    def figure(self, name: str) -> FittedFigure:
        """The fitted figure called ``name``; KeyError lists the fitted names otherwise."""
        for f in self.fitted:
            if f.name == name:
                return f
        raise KeyError(f"{name!r} was not fitted; fitted: {', '.join(f.name for f in self.fitted)}")
