"""Calibration: fit device figures of the GeMM-WS and Many-BSP models to measured runs.

Pure core (no HTTP): typed measurement records in, a :class:`CalibrationResult` out, with a
value, standard error and identifiability per figure, training and cross-validation errors,
residuals and warnings. Method and choices: docs/model-notes.md, "Calibration".
"""

from perfmodel.calibration.gemm_ws import (
    apply_gemm_ws,
    check_gemm_ws_shared_memory,
    fit_gemm_ws,
    predict_gemm_ws_us,
)
from perfmodel.calibration.jsonl import (
    load_gemm_ws_jsonl,
    load_many_bsp_jsonl,
    load_measurements_jsonl,
)
from perfmodel.calibration.many_bsp import apply_many_bsp, fit_many_bsp, predict_many_bsp_cycles
from perfmodel.calibration.records import (
    GEMM_WS_FIGURES,
    GEMM_WS_MODEL,
    MANY_BSP_FIGURES,
    MANY_BSP_MODEL,
    MODELS,
    CalibrationResult,
    ErrorSummary,
    FittedFigure,
    GemmWsMeasurement,
    ManyBspMeasurement,
    Residual,
)
from perfmodel.errors import CalibrationInputError, MeasurementLineError

__all__ = [
    "GEMM_WS_FIGURES",
    "GEMM_WS_MODEL",
    "MANY_BSP_FIGURES",
    "MANY_BSP_MODEL",
    "MODELS",
    "CalibrationInputError",
    "CalibrationResult",
    "ErrorSummary",
    "FittedFigure",
    "GemmWsMeasurement",
    "ManyBspMeasurement",
    "MeasurementLineError",
    "Residual",
    "apply_gemm_ws",
    "apply_many_bsp",
    "check_gemm_ws_shared_memory",
    "fit_gemm_ws",
    "fit_many_bsp",
    "load_gemm_ws_jsonl",
    "load_many_bsp_jsonl",
    "load_measurements_jsonl",
    "predict_gemm_ws_us",
    "predict_many_bsp_cycles",
]
