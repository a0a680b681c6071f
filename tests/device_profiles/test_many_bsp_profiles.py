"""Many-BSP and synchronization sections of the profiles against the papers' tables."""

from __future__ import annotations

import pytest

from device_profiles import get_profile
from device_profiles.loader import ModelNotServed
from perfmodel.manybsp import device_from_profile


@pytest.mark.parametrize(
    ("device", "mem_lat", "block_launch", "mu", "bar_256"),
    [
        # many-bsp-supplementary.txt §2 and Table 1-5: G_2 = 32 + 98 + 61
        ("gtx-760", 191, 553, 3.36, 173),
        # §5 and Table 1-6: G_2 = 19 + 160 + 134
        ("940mx", 313, 382, 1.93, 120),
    ],
)
def test_parameter_blocks(
    device: str, mem_lat: float, block_launch: float, mu: float, bar_256: float
) -> None:
    profile = get_profile(device)
    assert "many-bsp" in profile.models_served()
    mb = profile.many_bsp
    assert mb is not None and mb.g0_cycles and mb.g1_cycles and mb.g2_cycles
    g = mb.g0_cycles.value + mb.g1_cycles.value + mb.g2_cycles.value
    assert mb.mem_lat_cycles is not None and mb.mem_lat_cycles.value == g == mem_lat  # eq. (26)
    figs = device_from_profile(profile)
    assert figs.device.block_launch_overhead_cycles == block_launch
    assert figs.device.mu == mu
    assert figs.bar_sync_overhead_cycles(256) == bar_256


def test_bar_sync_overhead_is_linear_in_block_size() -> None:
    figs = device_from_profile(get_profile("gtx-760"))
    # Table 1-5: 173 at 256 threads, 297 at 1024
    assert figs.bar_sync_overhead_cycles(1024) == 297
    assert figs.bar_sync_overhead_cycles(640) == pytest.approx((173 + 297) / 2)
    assert figs.bar_sync_overhead_cycles(32) < 173


@pytest.mark.parametrize("device", ["gtx-1070", "v100", "a100", "h100", "p100", "rtx-a6000"])
def test_a_profile_without_figures_says_what_is_missing(device: str) -> None:
    """Every shipped profile serves Many-BSP (out of the box); stripped of mu and its memory
    latency it cannot, and both the listing and ModelNotServed name them."""
    profile = get_profile(device)
    assert "many-bsp" in profile.models_served()
    assert profile.many_bsp is not None
    stripped = profile.model_copy(
        update={
            "many_bsp": profile.many_bsp.model_copy(update={"mu": None, "mem_lat_cycles": None})
        }
    )
    must_miss = {"many_bsp.mu", "many_bsp.mem_lat_cycles"}
    assert "many-bsp" not in stripped.models_served()
    assert must_miss == set(stripped.missing_many_bsp_figures())
    with pytest.raises(ModelNotServed) as info:
        device_from_profile(stripped)
    assert must_miss <= set(info.value.missing)


@pytest.mark.parametrize(
    ("device", "latencies"),
    [
        # gpu-synchronization-study.txt Table 5 (cycles, one block)
        ("v100", {32: 22, 256: 36, 1024: 84}),
        ("p100", {32: 220, 256: 235, 1024: 428}),
    ],
)
def test_block_sync_latencies_of_table_5(device: str, latencies: dict[int, float]) -> None:
    sync = get_profile(device).synchronization
    assert sync is not None
    got = {p.threads_per_block: p.latency_cycles for p in sync.block_sync}
    assert {t: got[t] for t in latencies} == latencies
    # Table 5 and Fig. 6: latency grows with the block size
    ordered = [got[t] for t in sorted(got)]
    assert ordered == sorted(ordered)


def test_grid_sync_fig_8_grows_with_blocks_per_sm() -> None:
    sync = get_profile("v100").synchronization
    assert sync is not None
    at_32_threads = {
        p.blocks_per_sm: p.latency_us for p in sync.grid_sync if p.threads_per_block == 32
    }
    assert at_32_threads[1] == 1.43 and at_32_threads[32] == 21.06
    assert [at_32_threads[k] for k in sorted(at_32_threads)] == sorted(at_32_threads.values())
