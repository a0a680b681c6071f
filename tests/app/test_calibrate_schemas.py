"""The calibration request schemas name the figures the core fits, and nothing else."""

from __future__ import annotations

from app.schemas.calibrate import FIGURES
from device_profiles.schema import REQUIRED_GEMM_WS_FIGURES
from perfmodel.calibration import GEMM_WS_FIGURES, MANY_BSP_FIGURES, MODELS


def test_the_figures_a_request_may_fit_are_the_cores() -> None:
    # the service's process reads them from the profile schema (it never imports the core)
    assert set(FIGURES) == set(MODELS)
    assert set(FIGURES["gemm-ws"]) == set(GEMM_WS_FIGURES) == set(REQUIRED_GEMM_WS_FIGURES)
    assert set(FIGURES["many-bsp"]) == set(MANY_BSP_FIGURES)
    for names in FIGURES.values():
        assert len(set(names)) == len(names)
