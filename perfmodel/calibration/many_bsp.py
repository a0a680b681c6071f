"""Many-BSP calibration: fit mu, the launch overheads and the throughput efficiency to
measured kernel cycles.

None of the four figures reaches the BLOCK table or the supersteps: mu enters eq. (24)/(25)
only, the overheads eq. (4)/(5) (and through COMP eq. (15), (19), (23)), the throughput
efficiency the throughput floor only (Volta+ profiles). So each distinct run
is analysed once (:func:`predict_kernel`), reduced to its block totals (eq. (10)-(12) and the
instruction counts), and a trial set of figures re-evaluates only
:func:`perfmodel.manybsp.kernel.kernel_from_totals`.

Runs of one kernel that differ only in the grid share the analysis: n_b enters eq. (22),
(24), (25) piecewise linearly, so three evaluations per kernel give every run's cycles. On
profiles with sectors (Volta+) the grid also decides which blocks re-read each other's bytes
from L2 (perfmodel.manybsp.frontend), so there each grid is analysed on its own.

In 1/mu, 1/throughput_efficiency and the overheads the total is piecewise linear
(1/min(mu, (1+rho)/2) is max(1/mu, 2/(1+rho)); the floor is a max() of its own; block_lnch_ovh
adds once; warp_lnch_ovh scales COMP by w, with steps where eq. (15)'s ceiling or eq. (23)'s tau
change), so the fit runs on the reciprocals (RECIPROCAL) with a central-difference
Jacobian (the steps are crossed with vanishing probability by a 1e-6 relative step) and checks
identifiability with one-sided differences (a run at mu = (1+rho)/2 has a slope on one side).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from device_profiles.schema import FLOOR_FIGURE
from perfmodel.belief import FigureBelief, Prior, interval_of
from perfmodel.calibration import validate
from perfmodel.calibration.engine import FitProblem, FloatArray, IntArray, figure_specs
from perfmodel.calibration.engine import default_priors as default_priors_of
from perfmodel.calibration.records import (
    MANY_BSP_FIGURES,
    MANY_BSP_MODEL,
    CalibrationResult,
    ManyBspMeasurement,
)
from perfmodel.calibration.run import calibrate, identifiable_values
from perfmodel.errors import CalibrationInputError, ModelInputError
from perfmodel.manybsp import DeviceFigures, PredictRequest, PredictResult, predict_kernel
from perfmodel.manybsp.kernel import (
    BlockTotals,
    block_totals,
    kernel_from_totals,
    occupancy_rho,
    sum_block_classes,
)
from perfmodel.manybsp.types import LaunchShape, ManyBspDevice

N_STARTS = 4
METHOD = (
    "maximum a posteriori: scipy.optimize.least_squares (trf) over ln(figures), Cauchy "
    "loss on relative error at an estimated noise scale plus log-normal prior residuals; "
    f"{N_STARTS} starts, Laplace posterior, over mu, the launch overheads and the "
    "throughput efficiency; each "
    "distinct run analysed once, eq. (4)-(5), (13)-(25) re-evaluated per trial; "
    "central-difference Jacobian"
)
#: relative step of the central differences (of max(|x|, 1) for the overheads in cycles)
_STEP = 1e-6
#: figures the total is piecewise linear in the reciprocal of (eq. (24)/(25)'s 1/mu; the
#: throughput floor's 1/throughput_efficiency): the fit's internal coordinate is 1/value
RECIPROCAL = frozenset({"mu", "throughput_efficiency"})


@dataclass(frozen=True, slots=True)
class AnalysedKernel:
    """One distinct analysed launch, all but its block count: the block totals of each warp
    role (one for an SPMD kernel; the kernel is its slowest role, docs/model-notes.md "Warp
    roles"), the launch with n_b = 0, and n_sm x rho, the n_b at which eq. (22)'s K is 1."""

    role_totals: tuple[BlockTotals, ...]
    launch: LaunchShape
    full_wave_blocks: int
    #: block classes (perfmodel.ptx.block_classes): each entry of ``role_totals`` is a class
    #: holding this fraction of the grid's blocks, and the kernel is their sum; () for roles
    class_fractions: tuple[float, ...] = ()

    def role_cycles(self, n_b: int, device: ManyBspDevice) -> list[float]:
        launch = dataclasses.replace(self.launch, n_b=n_b)
        if self.class_fractions:
            return [
                sum_block_classes(
                    [
                        kernel_from_totals(
                            t, dataclasses.replace(launch, n_b=round(n_b * f)), device
                        )
                        for t, f in zip(self.role_totals, self.class_fractions, strict=True)
                    ],
                    device,
                )
            ]
        return [kernel_from_totals(t, launch, device).kernel_exec_cycle for t in self.role_totals]

    def cycles(self, n_b: int, device: ManyBspDevice) -> float:
        return max(self.role_cycles(n_b, device))


@dataclass(frozen=True, slots=True)
class AnalysedRuns:
    kernels: tuple[AnalysedKernel, ...]
    kernel_of: IntArray  # per run, index into kernels
    blocks: NDArray[np.int64]  # per run, n_b

    def subset(self, rows: IntArray) -> AnalysedRuns:
        used = np.unique(self.kernel_of[rows])
        renumber = np.full(len(self.kernels), -1, dtype=np.intp)
        renumber[used] = np.arange(used.size)
        return AnalysedRuns(
            tuple(self.kernels[i] for i in used.tolist()),
            renumber[self.kernel_of[rows]],
            self.blocks[rows],
        )


def _device_with(base: ManyBspDevice, values: dict[str, float]) -> ManyBspDevice:
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]


def _analysis_key(req: PredictRequest) -> tuple[object, ...]:
    """Everything but the grid: the grid changes only n_b, which enters eq. (22)-(25), unless
    it decides which blocks leave early (block classes: then the grid joins the key)."""
    return (
        req.ptx,
        req.kernel,
        req.block,
        req.registers_per_thread,
        req.shared_bytes_per_block,
        tuple(sorted(req.loop_trip_counts.items())),
        tuple(sorted(req.memory_transactions.items())),
        tuple(sorted(req.kernel_args.items())),
    )


def _analyse(
    base: DeviceFigures, request: PredictRequest, field: str
) -> tuple[tuple[BlockTotals, ...], LaunchShape, tuple[float, ...]]:
    try:
        result = predict_kernel(dataclasses.replace(request, device=base))
    except ModelInputError as exc:
        raise CalibrationInputError(f"{field}.request.{exc.field}", exc.reason) from exc
    return _totals(result, base.device)


def _totals(
    result: PredictResult, device: ManyBspDevice
) -> tuple[tuple[BlockTotals, ...], LaunchShape, tuple[float, ...]]:
    """A prediction reduced to its block totals per warp role (none of the fitted figures
    reaches them) and its launch shape without the block count."""
    fractions: tuple[float, ...] = ()
    if result.block_classes:
        totals = tuple(
            block_totals(c.costs, c.level1, c.estimate.w, device, c.threads)
            for c in result.block_classes
        )
        fractions = tuple(c.blocks / result.n_b for c in result.block_classes)
    elif result.roles:
        totals = tuple(block_totals(r.costs, r.level1, r.estimate.w, device) for r in result.roles)
    else:
        totals = (block_totals(result.costs, result.level1, result.estimate.w, device),)
    # eq. (21) occupancy counts the whole block, whatever the role
    launch = LaunchShape(0, result.n_t, result.registers_per_thread, result.shared_bytes_per_block)
    return totals, launch, fractions


def analyse_runs(base: DeviceFigures, measurements: Sequence[ManyBspMeasurement]) -> AnalysedRuns:
    """Validate the runs and analyse each distinct kernel launch once (with ``base``)."""
    index: dict[tuple[object, ...], int] = {}
    grid_keyed: set[tuple[object, ...]] = set()  # analyses whose block classes need the grid
    kernels: list[AnalysedKernel] = []
    kernel_of, blocks = [], []
    for i, m in enumerate(measurements):
        field = f"measurements[{i}]"
        if not isinstance(m.request, PredictRequest):
            raise CalibrationInputError(f"{field}.request", "must be a PredictRequest")
        validate.positive_time(m.measured_cycles, f"{field}.measured_cycles")
        if m.request.device.device_id != base.device_id:
            raise CalibrationInputError(
                f"{field}.request.device",
                f"the run is on device {m.request.device.device_id!r} but the figures being "
                f"calibrated are {base.device_id!r}; calibrate one device at a time",
            )
        for axis, v in zip("xyz", m.request.grid, strict=True):
            validate.whole(v, f"{field}.request.grid.{axis}")
        key = _analysis_key(m.request)
        if base.device.sector_bytes is not None:
            # the L2 reuse between blocks depends on the grid's multi-block axes
            key = (*key, m.request.grid)
        if key in grid_keyed:
            key = (*key, m.request.grid)
        if key not in index:
            totals, launch, fractions = _analyse(base, m.request, field)
            if fractions and len(key) == len(_analysis_key(m.request)):
                grid_keyed.add(key)
                key = (*key, m.request.grid)
            rho = occupancy_rho(launch, base.device)  # eq. (21): no fitted figure enters it
            index[key] = len(kernels)
            kernels.append(AnalysedKernel(totals, launch, base.device.n_sm * rho, fractions))
        kernel_of.append(index[key])
        g = m.request.grid
        blocks.append(g[0] * g[1] * g[2])
    return AnalysedRuns(
        tuple(kernels), np.array(kernel_of, dtype=np.intp), np.array(blocks, dtype=np.int64)
    )


class ManyBspResidualModel:
    """kernel_exec_cycle of a list of analysed runs; ``x`` holds 1/value for the figures in
    RECIPROCAL, the overhead (cycles) for the others, in the order of ``names``.

    n_b enters eq. (22), (24) and (25) only as ``a + b n_b + c max(0, n_b / (n_sm rho) - 1)``,
    so :meth:`predict` evaluates each distinct kernel (each of its warp roles) at n_b = 0,
    n_sm rho and 2 n_sm rho and interpolates every run of it exactly, then takes the slowest
    role (tested against :meth:`predict_exact`). On profiles with a throughput floor
    (``sector_bytes``) each run is evaluated at its own n_b.
    """

    def __init__(self, runs: AnalysedRuns, base: ManyBspDevice, names: Sequence[str]) -> None:
        self._runs = runs
        self._rows = [np.flatnonzero(runs.kernel_of == k) for k in range(len(runs.kernels))]
        self._base = base
        self._names = tuple(names)

    def subset(self, rows: IntArray) -> ManyBspResidualModel:
        return ManyBspResidualModel(self._runs.subset(rows), self._base, self._names)

    def device(self, x: FloatArray) -> ManyBspDevice:
        values = {
            name: 1.0 / float(v) if name in RECIPROCAL else float(v)
            for name, v in zip(self._names, x, strict=True)
        }
        return _device_with(self._base, values)

    def predict(self, x: FloatArray) -> FloatArray:
        device = self.device(x)
        out = np.empty(self._runs.blocks.size, dtype=np.float64)
        for kernel, rows in zip(self._runs.kernels, self._rows, strict=True):
            if device.sector_bytes is not None:
                # the throughput floor's max() and the block classes' shares of n_b are not
                # piecewise linear in n_b with one bend: evaluate each run at its own n_b
                out[rows] = [kernel.cycles(n, device) for n in self._runs.blocks[rows].tolist()]
                continue
            wave = kernel.full_wave_blocks
            u = self._runs.blocks[rows] / wave
            at = [np.array(kernel.role_cycles(n, device)) for n in (0, wave, 2 * wave)]
            slope, bend = at[1] - at[0], at[2] - 2 * at[1] + at[0]
            per_role = at[0] + np.outer(u, slope) + np.outer(np.maximum(0, u - 1), bend)
            out[rows] = per_role.max(axis=1)  # the slowest role bounds the kernel
        return out

    def predict_exact(self, x: FloatArray) -> FloatArray:
        """kernel_from_totals evaluated for every run at its own n_b."""
        device = self.device(x)
        kernels, blocks = self._runs.kernels, self._runs.blocks.tolist()
        return np.array(
            [
                kernels[k].cycles(n, device)
                for k, n in zip(self._runs.kernel_of, blocks, strict=True)
            ],
            dtype=np.float64,
        )

    def _step(self, x: FloatArray, j: int) -> float:
        scale = abs(float(x[j])) if self._names[j] in RECIPROCAL else max(abs(float(x[j])), 1.0)
        return _STEP * scale

    def _differences(self, x: FloatArray, forward: bool, backward: bool) -> FloatArray:
        centre = self.predict(x) if not (forward and backward) else None
        columns = []
        for j in range(len(self._names)):
            h = self._step(x, j)
            up, down = x.copy(), x.copy()
            up[j] += h if forward else 0.0
            down[j] -= h if backward else 0.0
            high = self.predict(up) if forward else centre
            low = self.predict(down) if backward else centre
            assert high is not None and low is not None
            columns.append((high - low) / (up[j] - down[j]))
        return np.column_stack(columns)

    def jacobian(self, x: FloatArray) -> FloatArray:
        return self._differences(x, forward=True, backward=True)


#: a launch overhead whose base value is 0 gets a median of 10 cycles and a wide spread (ln 0
#: has no prior; 10 cycles is as negligible as 0 beside a kernel's thousands)
ZERO_OVERHEAD_PRIOR = Prior(10.0, 3.0, "base value 0: 10 cycles, wide (docs/model-notes.md)")


def default_priors(base: ManyBspDevice, names: Sequence[str]) -> dict[str, Prior]:
    """Priors for figures no profile cites one for: centred on the base values, wide."""
    return default_priors_of(base, names, ZERO_OVERHEAD_PRIOR, RECIPROCAL)


def fittable_figures(device: ManyBspDevice) -> tuple[str, ...]:
    """The figures of MANY_BSP_FIGURES a run on ``device`` can depend on: all of them on a
    profile with a throughput floor (sector_bytes), all but the floor's efficiency without."""
    if device.sector_bytes is not None:
        return MANY_BSP_FIGURES
    return tuple(n for n in MANY_BSP_FIGURES if n != FLOOR_FIGURE)


def predict_many_bsp_cycles(device: DeviceFigures, request: PredictRequest) -> float:
    """The service's kernel_exec_cycle for ``request`` run on ``device``'s figures."""
    return predict_kernel(dataclasses.replace(request, device=device)).estimate.kernel_exec_cycle


def fit_many_bsp(
    base: DeviceFigures,
    measurements: Sequence[ManyBspMeasurement],
    *,
    fit: Sequence[str] | None = None,
    folds: int = 5,
    seed: int = 0,
    priors: Mapping[str, Prior] | None = None,
) -> CalibrationResult:
    """The MAP fit of ``fit`` (default: :func:`fittable_figures` of ``base``) of ``base`` to
    measured kernel cycles; each request's device must be ``base``. ``priors`` by figure name
    (missing ones: :func:`default_priors`). Same contract as
    :func:`perfmodel.calibration.gemm_ws.fit_gemm_ws` otherwise."""
    measurements = list(measurements)
    allowed = fittable_figures(base.device)
    if fit is not None and FLOOR_FIGURE in fit and FLOOR_FIGURE not in allowed:
        raise CalibrationInputError(
            "fit",
            f"{FLOOR_FIGURE} scales the throughput floor, which these device figures do not "
            "have (no many_bsp.sector_bytes): no run can depend on it",
        )
    names, k, fold_warnings = validate.fit_arguments(fit, allowed, len(measurements), folds, seed)
    runs = analyse_runs(base, measurements)
    measured = np.array([m.measured_cycles for m in measurements], dtype=np.float64)
    # mu enters eq. (24)/(25) as 1/mu, the efficiency the floor as its reciprocal: the fit's
    # internal coordinate is theirs
    priors = {**default_priors(base.device, names), **(priors or {})}
    specs = figure_specs(base.device, names, priors, RECIPROCAL)
    model = ManyBspResidualModel(runs, base.device, names)

    def report(x: FloatArray, rows: IntArray) -> FloatArray:
        return model.subset(rows).predict_exact(x)

    problem = FitProblem(model, measured, specs, N_STARTS, report)
    return calibrate(
        problem,
        model_name=MANY_BSP_MODEL,
        folds=k,
        seed=seed,
        method=METHOD,
        unit="cycles",
        warnings=fold_warnings,
    )


def apply_many_bsp(base: DeviceFigures, result: CalibrationResult) -> DeviceFigures:
    """``base`` with every fitted figure of ``result`` (its MAP value) in place."""
    values = identifiable_values(result, MANY_BSP_MODEL, MANY_BSP_FIGURES)
    return dataclasses.replace(base, device=_device_with(base.device, values))


def predict_interval_cycles(
    base: DeviceFigures,
    result: PredictResult,
    belief: FigureBelief,
    *,
    draws: int = 128,
    seed: int = 0,
) -> tuple[float, float]:
    """The 10 % and 90 % quantiles of ``result``'s kernel_exec_cycle (a prediction on
    ``base``) when the figures ``belief`` covers (mu, the launch overheads, the throughput
    efficiency) are drawn from it:
    only eq. (4)-(5), (13)-(25) are re-evaluated per draw, as in the fit. Widened to contain
    the point prediction (docs/model-notes.md, "MAP calibration")."""
    totals, launch, fractions = _totals(result, base.device)
    kernel = AnalysedKernel(
        totals, launch, base.device.n_sm * occupancy_rho(launch, base.device), fractions
    )
    point = result.estimate.kernel_exec_cycle
    values = belief.draws(np.random.default_rng(seed), draws)
    samples = [
        kernel.cycles(
            result.n_b, _device_with(base.device, {n: float(v[d]) for n, v in values.items()})
        )
        for d in range(draws)
    ]
    low, high = interval_of(np.array(samples), point)
    return float(low), float(high)
