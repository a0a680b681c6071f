"""The default GeMM-WS pipeline model of a profile (device_profiles/pipeline.py)."""

from __future__ import annotations

import dataclasses

import pytest

from device_profiles import get_profile
from device_profiles.loader import default_profiles
from device_profiles.pipeline import (
    ASYNC_COPY_FROM_COMPUTE_CAPABILITY,
    default_pipeline_model,
    sm_limits,
)


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


@pytest.mark.parametrize("device", sorted(default_profiles()))
def test_sm_limits_of_a_profile_hold_the_ctas_its_hardware_section_allows(device: str) -> None:
    profile = get_profile(device)
    hardware = profile.hardware
    limits = sm_limits(profile)
    cap = int(hardware.max_blocks_per_sm.value) if hardware.max_blocks_per_sm else 1
    # a 1-byte buffer: only the block cap (and nothing else without threads per CTA) limits
    assert limits.ctas_per_sm(1) == cap
    if hardware.shared_memory_per_sm_bytes is not None:
        per_sm = int(hardware.shared_memory_per_sm_bytes.value)
        # a buffer of a third of the SM: three fit (if the cap allows), one byte more: two
        assert limits.ctas_per_sm(per_sm // 3) == min(cap, 3)
        assert limits.ctas_per_sm(per_sm // 3 + 1) == min(cap, 2)
        assert limits.ctas_per_sm(per_sm + 1) == 0
        assert sm_limits(profile, enforce_shared_memory=False).ctas_per_sm(per_sm + 1) == cap
    if hardware.max_threads_per_sm is not None:
        threads = int(hardware.max_threads_per_sm.value)
        with_threads = dataclasses.replace(limits, threads_per_cta=threads // 2)
        assert with_threads.ctas_per_sm(1) == min(cap, 2)


@pytest.mark.parametrize("section", ["gemm_ws", "many_bsp", "hardware"])
def test_a_sections_estimates_are_the_profiles_estimates_under_it(section: str) -> None:
    for profile in default_profiles().values():
        whole = [name for name in profile.estimated_figures() if name.startswith(f"{section}.")]
        assert profile.estimated_figures_of(section) == whole, profile.id
