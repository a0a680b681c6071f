"""The calibration core's side of configuration-less GeMM-WS runs (worker-side only, as
``app/convert/calibration_core.py``): stored runs -> the core's library runs, the device of
the L2-aware model, the fit -> the response schema.

A run that leaves out its configuration is a library's own pick, fitted as the model's optimum
over the default space (perfmodel/calibration/configless.py); when any run of a set does, the
whole set, configured runs included, is fitted by that fit (one fit, one set of figures).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from app.schemas.calibrate import GemmWsMeasurementIn
from device_profiles import DeviceProfile
from device_profiles.memory import memory_model_device
from perfmodel.calibration.configless import FITTED, Device, LibraryRun, RunModel, fit, scaled
from perfmodel.calibration.records import (
    GEMM_WS_MODEL,
    CalibrationResult,
    FittedFigure,
)
from perfmodel.calibration.run import error_summary, residual_records
from perfmodel.errors import CalibrationInputError, ConfiglessRunsRefused

METHOD = (
    "configuration-less: maximum a posteriori over ln(figures) of the L2-aware model, runs "
    "without a configuration predicted as the model's optimum over the default space "
    "(group_m 1..8, split_k 1..), robust soft-L1 least squares plus log-normal priors "
    "(perfmodel/calibration/configless.py)"
)


def has_configless(documents: Sequence[Mapping[str, Any]]) -> bool:
    """True when some run leaves out its configuration."""
    return any(d.get("tile_m") is None for d in documents)


def library_runs(documents: Sequence[Mapping[str, Any]]) -> list[LibraryRun]:
    """The runs as the fit's records: a configured run is its tiling at group_m 1, split_k 1
    (what a GeMM-WS run describes), with its kernel's threads and registers where given."""
    out = []
    for d in documents:
        run = GemmWsMeasurementIn.model_validate(d)
        config = None
        if run.tile_m is not None:
            assert run.tile_n is not None and run.tile_k is not None
            assert run.buffer_depth is not None
            config = (run.tile_m, run.tile_n, run.tile_k, run.buffer_depth, 1, 1)
        out.append(
            LibraryRun(
                run.m,
                run.n,
                run.k,
                run.dtype,
                run.measured_time_us,
                1,
                config,
                threads_per_cta=run.threads_per_cta,
                registers_per_thread=run.registers_per_thread,
            )
        )
    return out


def device_of(base: DeviceProfile, runs: Sequence[LibraryRun]) -> Device:
    """The L2-aware model's device of ``base`` for the runs' element type (one per fit)."""
    dtype = runs[0].dtype
    for i, run in enumerate(runs):
        if run.dtype != dtype:
            raise ConfiglessRunsRefused(
                f"measurements[{i}].dtype",
                f"a set with configuration-less runs is fitted for one element type; "
                f"this run is {run.dtype}, the first {dtype}",
            )
    if base.memory is None or base.gemm_ws is None:
        raise ConfiglessRunsRefused(
            "base_device",
            f"configuration-less runs are fitted on the L2-aware model, which needs the base's "
            f"gemm_ws and memory sections; {base.id!r} lacks "
            + " and ".join(n for n in ("gemm_ws", "memory") if getattr(base, n) is None)
            + ": choose a shipped profile (GET /devices) or give every run its configuration",
        )
    try:
        return memory_model_device(base, dtype)
    except ValueError as exc:
        raise ConfiglessRunsRefused("measurements[0].dtype", str(exc)) from None


@contextmanager
def _runs_named() -> Iterator[None]:
    """The fit's ``measurements[i].config`` (a configured run no SM can hold) as the run."""
    try:
        yield
    except CalibrationInputError as exc:
        raise CalibrationInputError(exc.field.removesuffix(".config"), exc.reason) from None


def check_configless(base: DeviceProfile, documents: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a run no configuration of the default space runs (naming it)."""
    runs = library_runs(documents)
    device = device_of(base, runs)
    with _runs_named():
        for i, run in enumerate(runs):
            RunModel(run, device, i)


def fit_configless(
    base: DeviceProfile, documents: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None
) -> tuple[CalibrationResult, list[int]]:
    """Fit the L2-aware model's figures to the runs (canonical order): the fit as the
    calibration core reports one (each figure its base value times the fitted scale; no
    cross-validation, no posterior), and the positions of the runs without a configuration.
    It always fits all of FITTED: ``names`` other than those are said to be ignored in a
    warning."""
    runs = library_runs(documents)
    device = device_of(base, runs)
    with _runs_named():
        result = fit(runs, device)
    measured = np.array([r.measured_time_us for r in runs])
    predicted = np.array(
        [RunModel(r, device, i).predict_us(result.figures) for i, r in enumerate(runs)]
    )
    base_values = _values(device, (0.0,) * len(FITTED))
    values = _values(device, result.log_scale)
    ignored = names is not None and not set(names) <= {n for n, _ in FITTED}
    warnings = (
        "configuration-less runs: no cross-validation and no posterior intervals; "
        "reduction_overhead_us has no profile field and is reported only",
        *(
            [
                "fit: a set with configuration-less runs fits the L2-aware model's figures "
                f"({', '.join(n for n, _ in FITTED)}); the figures asked for are ignored"
            ]
            if ignored
            else []
        ),
    )
    core = CalibrationResult(
        model=GEMM_WS_MODEL,
        fitted=tuple(
            FittedFigure(name, values[name], base_values[name], None, False) for name, _ in FITTED
        ),
        training_error=error_summary(predicted, measured),
        cross_validation_error=None,
        residuals=residual_records(predicted, measured, range(len(runs))),
        warnings=warnings,
        method=METHOD,
    )
    return core, [i for i, r in enumerate(runs) if r.config is None]


def _values(device: Device, log_scale: Sequence[float]) -> dict[str, float]:
    """Each fitted figure's value under ``log_scale``; the load latency as its scale."""
    figures = scaled(device.base, log_scale)
    mem = figures.memory
    return {
        "compute_throughput_macs_per_us": figures.compute_throughput_macs_per_us,
        "l2_bandwidth_gb_per_s": mem.l2_bandwidth_gb_per_s,
        "dram_bandwidth_gb_per_s": mem.dram_bandwidth_gb_per_s,
        "load_latency_scale": math.exp(
            float(dict(zip((n for n, _ in FITTED), log_scale, strict=True))["load_latency_scale"])
        ),
        "t_init_us": figures.t_init_us,
        "t_epilogue_us": figures.t_epilogue_us,
        "reduction_overhead_us": figures.reduction_overhead_us,
        "compute_startup_latency_us": figures.compute_startup_latency_us,
    }
