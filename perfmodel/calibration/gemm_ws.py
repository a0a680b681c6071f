"""GeMM-WS calibration: fit the §2.2 machine figures to measured GEMM times.

The fit runs on the closed form of gemm_ws_model.py (piecewise linear in 1/throughputs and
latencies); residuals are reported with the service's own integer-nanosecond model,
:func:`predict_gemm_ws_us`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from perfmodel.calibration import validate
from perfmodel.calibration.engine import FigureSpec, FitProblem, FloatArray, IntArray
from perfmodel.calibration.gemm_ws_model import (
    THROUGHPUTS,
    GemmWsResidualModel,
    GemmWsRun,
    closed_form_model,
    shape_and_tiling,
)
from perfmodel.calibration.records import (
    GEMM_WS_FIGURES,
    GEMM_WS_MODEL,
    CalibrationResult,
    GemmWsMeasurement,
)
from perfmodel.calibration.run import calibrate, identifiable_values
from perfmodel.errors import CalibrationInputError
from perfmodel.gemm_ws import (
    ELEMENT_BYTES,
    DurationTable,
    GemmWsMachine,
    WaveTimeModel,
    overall_time_closed_form_ns,
)

#: multistart: the base figures, then draws over 1/30..30x the base throughputs
N_STARTS = 8
METHOD = (
    "scipy.optimize.least_squares (trf, bounded; plain then Cauchy loss on relative "
    "error), "
    f"{N_STARTS} starts, over 1/throughputs and latencies; closed form "
    "Sm(S) = L + (S-1) max(L, T), exact Jacobian per regime"
)


def predict_gemm_ws_us(
    machine: GemmWsMachine,
    run: GemmWsRun,
    wave_time_model: WaveTimeModel = WaveTimeModel.PAPER,
) -> float:
    """The service's prediction of ``run`` in microseconds: :func:`perfmodel.gemm_ws.simulate`'s
    overall time, computed in O(1) from the closed form."""
    shape, tiling = shape_and_tiling(run)
    return overall_time_closed_form_ns(shape, tiling, machine, wave_time_model) / 1000


def check_measurement(measurement: GemmWsMeasurement, prefix: str) -> None:
    """Types and ranges of one measurement; errors name ``prefix`` + the field."""
    for name in ("m", "n", "k", "tile_m", "tile_n", "tile_k", "buffer_depth"):
        validate.whole(getattr(measurement, name), f"{prefix}{name}")
    if measurement.dtype not in ELEMENT_BYTES:
        raise CalibrationInputError(
            f"{prefix}dtype",
            f"unknown dtype {measurement.dtype!r}; choose from: " + ", ".join(ELEMENT_BYTES),
        )
    validate.positive_time(measurement.measured_time_us, f"{prefix}measured_time_us")


def shared_memory_excess(
    machine: GemmWsMachine, measurements: Sequence[GemmWsMeasurement]
) -> list[tuple[int, int]]:
    """(index, bytes needed) of every measurement whose circular buffer does not fit the
    device's shared memory per block (none when the machine has no limit)."""
    limit = machine.shared_memory_per_block_bytes
    if limit is None:
        return []
    out = []
    for i, m in enumerate(measurements):
        need = shape_and_tiling(m)[1].shared_memory_bytes(ELEMENT_BYTES[m.dtype])
        if need > limit:
            out.append((i, need))
    return out


def check_gemm_ws_shared_memory(
    machine: GemmWsMachine, measurements: Sequence[GemmWsMeasurement]
) -> None:
    """Raise for the first measurement whose tiling needs more shared memory per block than
    ``machine`` allows (such a run cannot have run on that device as described)."""
    for i, need in shared_memory_excess(machine, measurements)[:1]:
        m = measurements[i]
        raise CalibrationInputError(
            f"measurements[{i}]",
            f"tiling {m.tile_m}x{m.tile_n}x{m.tile_k} with buffer depth {m.buffer_depth} "
            f"needs {need} bytes of {m.dtype} shared memory, above the device's "
            f"{machine.shared_memory_per_block_bytes}: check the tiling, or the device's "
            "shared_memory_per_block_bytes",
        )


def _specs(
    base: GemmWsMachine, names: Sequence[str], measured: FloatArray
) -> tuple[FigureSpec, ...]:
    longest, shortest = float(measured.max()), float(measured.min())
    specs = []
    for name in names:
        value = float(getattr(base, name))
        if name in THROUGHPUTS:
            x = 1.0 / value
            specs.append(FigureSpec(name, value, True, x / 1e6, x * 1e6, x / 30, x * 30, True, x))
        else:
            # no latency can exceed the longest run; starts spread over twice the base value
            typical = max(value, 0.01 * shortest)
            specs.append(
                FigureSpec(
                    name, value, False, 0.0, max(longest, value), 0.0, 2 * typical, False, typical
                )
            )
    return tuple(specs)


def machine_with(base: GemmWsMachine, values: dict[str, float]) -> GemmWsMachine:
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]


def fit_gemm_ws(
    base: GemmWsMachine,
    measurements: Sequence[GemmWsMeasurement],
    *,
    fit: Sequence[str] | None = None,
    folds: int = 5,
    wave_time_model: WaveTimeModel = WaveTimeModel.PAPER,
    seed: int = 0,
) -> CalibrationResult:
    """Fit ``fit`` (default: all of GEMM_WS_FIGURES) of ``base`` to measured times.

    Figures the measurements do not determine keep their base values (identifiable false);
    ``folds`` > 0 adds k-fold cross-validation (0 turns it off). Deterministic in ``seed``.
    """
    measurements = list(measurements)
    names, k, fold_warnings = validate.fit_arguments(
        fit, GEMM_WS_FIGURES, len(measurements), folds, seed
    )
    for i, m in enumerate(measurements):
        check_measurement(m, f"measurements[{i}].")
    wave_model = WaveTimeModel(wave_time_model)
    measured = np.array([m.measured_time_us for m in measurements], dtype=np.float64)
    specs = _specs(base, names, measured)
    model = closed_form_model(base, measurements, names, wave_model)

    def report(x: FloatArray, rows: IntArray) -> FloatArray:
        values = {s.name: s.to_value(float(xi)) for s, xi in zip(specs, x, strict=True)}
        machine = machine_with(base, values)
        table = DurationTable(machine)
        return np.array(
            [
                overall_time_closed_form_ns(
                    *shape_and_tiling(measurements[i]), machine, wave_model, table
                )
                / 1000
                for i in rows
            ],
            dtype=np.float64,
        )

    excess = [i for i, _ in shared_memory_excess(base, measurements)]
    warnings = (
        [
            f"{len(excess)} measurements need more shared memory per block than the base "
            f"device's {base.shared_memory_per_block_bytes} bytes (measurements "
            + ", ".join(map(str, excess[:10]))
            + (", ..." if len(excess) > 10 else "")
            + "): check their tilings or the device's limit"
        ]
        if excess
        else []
    )
    problem = FitProblem(model, measured, specs, N_STARTS, report)
    result = calibrate(
        problem,
        model_name=GEMM_WS_MODEL,
        folds=k,
        seed=seed,
        method=METHOD,
        warnings=[*fold_warnings, *warnings],
    )
    return _with_regime_warning(result, model, specs)


def _with_regime_warning(
    result: CalibrationResult, model: GemmWsResidualModel, specs: Sequence[FigureSpec]
) -> CalibrationResult:
    """Say so when every overlapped run is in one regime: then one throughput enters the
    predictions only through the first stage (or not at all)."""
    x = np.array([s.to_internal(f.value) for s, f in zip(specs, result.fitted, strict=True)])
    runs = model.overlapped_runs()
    bound = model.load_bound_runs(x)
    if runs == 0 or 0 < bound < runs:
        return result
    regime = "load-bound (T_LOAD > T_MATH)" if bound == runs else "compute-bound (T_MATH >= T_LOAD)"
    note = (
        f"all {runs} runs with buffer depth >= 2 are {regime} at the fitted figures: "
        "measure tilings of the other regime to pin the other throughput"
    )
    return dataclasses.replace(result, warnings=(*result.warnings, note))


def apply_gemm_ws(base: GemmWsMachine, result: CalibrationResult) -> GemmWsMachine:
    """``base`` with every identifiable fitted figure of ``result`` in place."""
    values = identifiable_values(result, GEMM_WS_MODEL, GEMM_WS_FIGURES)
    return machine_with(base, values)
