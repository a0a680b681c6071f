"""The default GeMM-WS pipeline model of a profile (device_profiles/pipeline.py)."""

from __future__ import annotations

import pytest

from device_profiles import get_profile
from device_profiles.loader import default_profiles
from device_profiles.pipeline import ASYNC_COPY_FROM_COMPUTE_CAPABILITY, default_pipeline_model


@pytest.mark.parametrize("device", sorted(default_profiles()))
def test_published_figures_keep_the_paper_model_and_estimated_ampere_ones_copy_async(
    device: str,
) -> None:
    profile = get_profile(device)
    estimated = any(name.startswith("gemm_ws.") for name in profile.estimated_figures())
    major, minor = (int(p) for p in (profile.compute_capability or "0.0").split("."))
    expected = (
        "async-copy"
        if estimated and (major, minor) >= ASYNC_COPY_FROM_COMPUTE_CAPABILITY
        else "paper"
    )
    assert default_pipeline_model(profile) == expected


def test_the_papers_a6000_is_the_paper_model_though_it_is_an_ampere_gpu() -> None:
    # eq. (1)-(3) are what the published A6000 figures were measured under (§4.2)
    profile = get_profile("rtx-a6000")
    assert profile.compute_capability is not None
    assert profile.compute_capability.startswith("8.")
    assert default_pipeline_model(profile) == "paper"


@pytest.mark.parametrize("fitted_under", ["paper", "async-copy"])
def test_a_calibrated_profile_answers_under_the_model_it_was_fitted_with(fitted_under: str) -> None:
    base = get_profile("a100")
    calibration = {
        "base_device": "a100",
        "base_digest": "0" * 64,
        "root_device": "a100",
        "model": "gemm-ws",
        "pipeline_model": fitted_under,
        "fitted": ["gemm_ws.t_init_us"],
        "measurement_count": 1,
        "measurements_digest": "0" * 64,
        "created_at": "2026-11-25T00:00:00Z",
        "training_error": {"mean_abs_pct": 1.0, "max_abs_pct": 1.0},
        "method": "test",
    }
    fitted = base.model_validate(
        {**base.model_dump(), "id": "a100-fit", "calibration": calibration}
    )
    assert default_pipeline_model(fitted) == fitted_under


def test_inline_figures_are_the_paper_model() -> None:
    assert default_pipeline_model(None) == "paper"
