"""Optimize, measure, calibrate, optimize again: the GeMM-WS closed loop on the pure core.

Each round solves every tiling problem with the current figures, measures each ranked
shortlist (``measure`` is the GPU, or a simulator standing in for one), fits the device's
figures to every measurement so far (always starting from the base figures), and hands the
calibrated figures to the next round. Deterministic when ``measure`` is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perfmodel.belief import FigureBelief, Prior
from perfmodel.calibration import (
    GEMM_WS_FIGURES,
    CalibrationResult,
    GemmWsMeasurement,
    apply_gemm_ws,
    fit_gemm_ws,
)
from perfmodel.calibration.gemm_ws import default_priors
from perfmodel.errors import CalibrationInputError
from perfmodel.gemm_ws import ELEMENT_BYTES, GemmShape, GemmWsMachine, Tiling
from solver.explore import explore_problem
from solver.optimize import optimize_tiling
from solver.problem import TilingProblem
from solver.shortlist import ShortlistMode

#: measured time in microseconds of one run of ``shape`` with ``tiling``
Measure = Callable[[GemmShape, Tiling], float]


@dataclass(frozen=True, slots=True)
class LoopRound:
    """``picks`` are the optimizer's best per problem with ``machine``; ``measured`` the
    shortlists' runs; ``calibration`` the fit of all measurements up to this round."""

    round: int
    machine: GemmWsMachine
    picks: tuple[Tiling, ...]
    measured: tuple[GemmWsMeasurement, ...]
    calibration: CalibrationResult


@dataclass(frozen=True, slots=True)
class LoopResult:
    rounds: tuple[LoopRound, ...]
    #: the figures of the last calibration, and the optimizer's best per problem with them
    final_machine: GemmWsMachine
    final_picks: tuple[Tiling, ...]

    def picks_of(self, problem: int) -> tuple[Tiling, ...]:
        """Problem ``problem``'s pick before any calibration, then after each round's."""
        return (*(r.picks[problem] for r in self.rounds), self.final_picks[problem])


def _measure_shortlist(
    problem: TilingProblem,
    machine: GemmWsMachine,
    belief: FigureBelief,
    mode: ShortlistMode,
    measure: Measure,
    dtype: str,
    top_k: int,
    time_limit_s: float,
    seed: int,
) -> tuple[Tiling, tuple[GemmWsMeasurement, ...]]:
    """The proven optimum under ``machine``, then the shortlist the tuner times: the
    explore shortlist under ``belief`` (or the point estimate's top_k in exploit mode)."""
    current = dataclasses.replace(problem, machine=machine)
    result = optimize_tiling(current, top_k=1, time_limit_s=time_limit_s)
    picks = explore_problem(current, belief, top_k, mode, seed=seed)
    if picks is None:
        raise CalibrationInputError("problems", "the search space is too large to explore")
    if picks.tilings[0] != result.best.tiling:  # the enumeration is exact: a bug if not
        raise AssertionError(f"explore's point optimum {picks.tilings[0]} is not Z3's")
    shape = problem.shape
    runs = tuple(
        GemmWsMeasurement(
            shape.m,
            shape.n,
            shape.k,
            dtype,
            t.tile_m,
            t.tile_n,
            t.tile_k,
            t.buffer_depth,
            measure(shape, t),
        )
        for t in picks.tilings
    )
    return result.best.tiling, runs


def calibration_loop(
    problems: Sequence[TilingProblem],
    measure: Measure,
    *,
    dtype: str = "fp16",
    rounds: int = 3,
    top_k: int = 5,
    fit: Sequence[str] | None = None,
    seed: int = 0,
    time_limit_s: float = 10.0,
    mode: ShortlistMode = ShortlistMode.EXPLORE,
    priors: Mapping[str, Prior] | None = None,
) -> LoopResult:
    """Run ``rounds`` rounds of: optimize every problem -> measure each top ``top_k`` -> fit
    the device's figures to all measurements so far; then optimize once more.

    The problems share one device (the same base machine): its figures are fitted from the
    runs of all of them, every figure of ``fit`` (default GEMM_WS_FIGURES) from the first
    round on (the MAP fit holds what the runs do not determine at its prior). The shortlists
    explore (``mode``): the point optimum, then the configurations most often fastest under
    the figures' posterior (``priors`` before the first fit; default: wide ones around the
    base figures).
    """
    if not problems:
        raise CalibrationInputError("problems", "give at least one tiling problem")
    if rounds < 1:
        raise CalibrationInputError("rounds", f"must be at least 1, got {rounds}")
    base = problems[0].machine
    for i, p in enumerate(problems):
        if p.machine != base or p.wave_model != problems[0].wave_model:
            raise CalibrationInputError(
                f"problems[{i}]",
                "every problem must use the same device figures and wave-time model (one "
                "device is calibrated); run one loop per device",
            )
        if ELEMENT_BYTES.get(dtype) != p.element_bytes:
            raise CalibrationInputError(
                "dtype", f"{dtype!r} is not the {p.element_bytes}-byte elements of problems[{i}]"
            )
    requested = tuple(fit) if fit is not None else GEMM_WS_FIGURES
    priors = {**default_priors(base, requested), **(priors or {})}
    machine = base
    belief = FigureBelief.from_priors(
        {n: priors[n] for n in requested}, {n: float(getattr(base, n)) for n in requested}
    )
    measurements: list[GemmWsMeasurement] = []
    history = []
    for number in range(1, rounds + 1):
        picks: list[Tiling] = []
        new: list[GemmWsMeasurement] = []
        for p in problems:
            pick, runs = _measure_shortlist(
                p, machine, belief, mode, measure, dtype, top_k, time_limit_s, seed
            )
            picks.append(pick)
            new += runs
        measurements += new
        calibration = fit_gemm_ws(
            base,
            measurements,
            fit=requested,
            folds=0,
            wave_time_model=problems[0].wave_model,
            seed=seed,
            priors=priors,
        )
        history.append(LoopRound(number, machine, tuple(picks), tuple(new), calibration))
        machine = apply_gemm_ws(base, calibration)
        belief = FigureBelief.from_calibration(
            [f.name for f in calibration.fitted],
            calibration.posterior_mean_log,
            calibration.posterior_covariance_log,
        )
    final = tuple(
        optimize_tiling(
            dataclasses.replace(p, machine=machine), top_k=1, time_limit_s=time_limit_s
        ).best.tiling
        for p in problems
    )
    return LoopResult(tuple(history), machine, final)
