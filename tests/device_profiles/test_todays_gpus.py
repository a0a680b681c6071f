"""Profiles of today's GPUs (v100, a100, h100): published figures, and exactly the figures that
need calibration.

The expected sets are computed here from the raw files and from the issue's list of what a
calibration run fits, not with device_profiles.status; the published numbers come from the
documents the profiles cite.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from device_profiles import calibration_status, get_profile
from device_profiles.loader import PROFILE_DIR
from device_profiles.schema import REQUIRED_MANY_BSP_CLASSES, DeviceProfile, Figure
from device_profiles.status import calibration_needs
from perfmodel.gemm_ws_traffic import Grid, gemm_traffic

TODAY = ("v100", "a100", "h100")

#: what POST /calibrate fits for each model
FITTED = {
    "many-bsp": {"mu", "block_launch_overhead_cycles", "warp_launch_overhead_cycles"},
    "gemm-ws": {
        "t_init_us",
        "t_epilogue_us",
        "load_startup_latency_us",
        "compute_startup_latency_us",
        "load_throughput_elements_per_us",
        "compute_throughput_macs_per_us",
    },
}
#: Many-BSP: Table 1-8's scalars, the bar.sync overheads, and the five classes the classifier
#: falls back to (perfmodel/manybsp/classify.py)
MANY_BSP_NEEDS = {
    "warp_size",
    "n_ws",
    "n_du",
    "issue_cycle",
    "mem_lat_cycles",
    "warp_launch_overhead_cycles",
    "block_launch_overhead_cycles",
    "max_threads_per_sm",
    "registers_per_sm",
    "shared_memory_per_sm_bytes",
    "mu",
    "bar_sync_overhead",
}
MANY_BSP_CLASSES = {"alu", "ld_global", "st_global", "ld_shared", "st_shared"}


def _raw(device: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((PROFILE_DIR / f"{device}.json").read_text())
    return raw


def _unmeasured(device: str, model: str) -> set[str]:
    """Dotted names of the figures ``model`` needs that the file lacks or flags estimate."""
    raw = _raw(device)
    if model == "gemm-ws":
        section = raw.get("gemm_ws") or {}
        return {
            f"gemm_ws.{n}"
            for n in FITTED["gemm-ws"]
            if n not in section or section[n].get("estimate")
        }
    section = raw.get("many_bsp") or {}
    out = {
        f"many_bsp.{n}"
        for n in MANY_BSP_NEEDS
        if not section.get(n)
        or (isinstance(section[n], dict) and section[n].get("estimate"))
        or (isinstance(section[n], list) and any(p.get("estimate") for p in section[n]))
    }
    classes = section.get("instruction_classes", {})
    out |= {f"many_bsp.instruction_classes.{c}" for c in MANY_BSP_CLASSES - set(classes)}
    # optional: the throughput floor's efficiency, on the profiles with a floor
    if section.get(FLOOR_FIGURE, {}).get("estimate"):
        out.add(f"many_bsp.{FLOOR_FIGURE}")
    return out


def _fitted(model: str) -> set[str]:
    prefix = "gemm_ws" if model == "gemm-ws" else "many_bsp"
    return {f"{prefix}.{n}" for n in FITTED[model]}


#: calibratable where a profile carries it (a throughput floor: sector_bytes)
FLOOR_FIGURE = "throughput_efficiency"


ALL = ("v100", "a100", "h100", "p100", "gtx-1070", "gtx-760", "940mx", "rtx-a6000")


@pytest.mark.parametrize("device", ALL)
@pytest.mark.parametrize("model", ["many-bsp", "gemm-ws"])
def test_every_profile_serves_both_models_listing_its_estimates(device: str, model: str) -> None:
    """Every shipped profile serves both models out of the box; what a calibration
    fits and the file only estimates is listed under needs_calibration, nothing is missing."""
    status = calibration_status(get_profile(device))[model]
    assert status.missing == ()
    assert status.served
    unmeasured = _unmeasured(device, model)
    fitted = _fitted(model) | ({f"many_bsp.{FLOOR_FIGURE}"} if model == "many-bsp" else set())
    assert {n.figure for n in status.needs_calibration} == unmeasured & fitted
    assert calibration_needs(get_profile(device))[model] == [
        n.figure for n in status.needs_calibration
    ]
    assert status.state == ("served" if not unmeasured else "uncalibrated-estimates")


@pytest.mark.parametrize("device", ALL)
@pytest.mark.parametrize("model", ["many-bsp", "gemm-ws"])
def test_every_calibratable_figure_has_a_cited_prior(device: str, model: str) -> None:
    section = _raw(device)["gemm_ws" if model == "gemm-ws" else "many_bsp"]
    for name in FITTED[model]:
        prior = section[name]["prior"]
        assert prior["median"] > 0 and 0 < prior["sigma_log"] <= 3, (device, name)
        assert len(prior["source"]) > 20, (device, name)
        if section[name].get("estimate"):  # an estimate's value is its prior's median
            assert section[name]["value"] == pytest.approx(prior["median"], rel=1e-6)


@pytest.mark.parametrize(
    ("device", "fitted"),
    [
        # the report's own devices: mu and the launch overheads are its fits (§2, §5)
        ("gtx-760", {"mu": 3.36, "block_launch_overhead_cycles": 553}),
        ("940mx", {"mu": 1.93, "block_launch_overhead_cycles": 382}),
    ],
)
def test_the_reports_devices_keep_their_published_many_bsp_figures(
    device: str, fitted: dict[str, float]
) -> None:
    section = _raw(device)["many_bsp"]
    for name, value in fitted.items():
        assert section[name]["value"] == value and not section[name].get("estimate")
        assert section[name]["prior"]["median"] == value


def fill(profile: DeviceProfile, **values: float) -> DeviceProfile:
    """The profile with Many-BSP figures set, as a calibration run would set them."""
    assert profile.many_bsp is not None
    figures = {
        k: Figure(value=v, source="test: a plausible fitted value") for k, v in values.items()
    }
    return profile.model_copy(update={"many_bsp": profile.many_bsp.model_copy(update=figures)})


# plausible values to exercise the path (the GTX 760 and 940MX parameter blocks give 553/382
# cycles per block, 10 per warp, mu 3.36/1.93)
FILLED = {
    "mu": 2.0,
    "block_launch_overhead_cycles": 450.0,
    "warp_launch_overhead_cycles": 10.0,
    FLOOR_FIGURE: 0.9,
}


@pytest.mark.parametrize("device", TODAY)
def test_fitting_the_listed_figures_leaves_only_the_borrowed_ones(device: str) -> None:
    profile = get_profile(device)
    filled = fill(profile, **FILLED)
    status = calibration_status(filled)["many-bsp"]
    assert status.served and status.needs_calibration == () and status.missing == ()
    # the A100/H100 bar.sync overheads stay flagged: no calibration fits them
    flagged = {n.figure for n in status.estimates}
    # ... and so do the optional instruction rows carried from another architecture
    rows = {f for f in flagged if f.startswith("many_bsp.instruction_classes.")}
    mb = profile.many_bsp
    assert mb is not None
    assert rows == {
        f"many_bsp.instruction_classes.{k}"
        for k, c in mb.instruction_classes.items()
        if c.estimate and k not in REQUIRED_MANY_BSP_CLASSES
    }
    assert flagged - rows == ({"many_bsp.bar_sync_overhead"} if device != "v100" else set())
    assert status.state == ("served" if device == "v100" else "uncalibrated-estimates")


@pytest.mark.parametrize("device", ALL)
def test_a_profile_without_the_calibratable_figures_says_so(device: str) -> None:
    """The status machinery on a profile stripped of mu and the launch overheads: exactly
    those are listed (absent, calibratable) and Many-BSP is not served."""
    profile = get_profile(device)
    assert profile.many_bsp is not None
    stripped = profile.model_copy(
        update={
            "many_bsp": profile.many_bsp.model_copy(
                update=dict.fromkeys([*FITTED["many-bsp"], FLOOR_FIGURE])
            )
        }
    )
    status = calibration_status(stripped)["many-bsp"]
    assert not status.served and status.state == "needs-calibration"
    assert {n.figure for n in status.needs_calibration} == _fitted("many-bsp")
    assert all(n.state == "absent" for n in status.needs_calibration)


# ----------------------------------------------------------------- published figures
# (value, source document): independent of the profile files


@pytest.mark.parametrize(
    ("device", "sms", "fp32_lanes_per_sm", "peak_fp32_tflops"),
    [
        ("v100", 80, 64, 15.7),  # V100 whitepaper Table 1 (Tesla V100 SXM2)
        ("a100", 108, 64, 19.5),  # A100 whitepaper / datasheet
        ("h100", 132, 128, 67.0),  # H100 SXM datasheet
    ],
)
def test_sm_count_and_clock_reproduce_the_published_fp32_peak(
    device: str, sms: int, fp32_lanes_per_sm: int, peak_fp32_tflops: float
) -> None:
    hw = get_profile(device).hardware
    assert hw.sm_count.value == sms
    assert hw.clock_mhz is not None
    peak = hw.sm_count.value * fp32_lanes_per_sm * 2 * hw.clock_mhz.value * 1e6 / 1e12
    assert peak == pytest.approx(peak_fp32_tflops, rel=0.01)


def test_the_h100_tensor_clock_reproduces_the_published_tensor_peak() -> None:
    """H100 SXM datasheet: 989.4 dense FP16 tensor TFLOPS; whitepaper: 4,096 dense FP16
    tensor FLOP per clock per SM (twice the A100 SM's, whose 312 TFLOPS = 108 x 2,048 x 1,410
    MHz): the tensor peak's clock is below the SM's 1,980 MHz maximum."""
    hw = get_profile("h100").hardware
    assert hw.tensor_clock_mhz is not None and hw.clock_mhz is not None
    peak = hw.sm_count.value * 4096 * hw.tensor_clock_mhz.value * 1e6 / 1e12
    assert peak == pytest.approx(989.4, rel=0.001)
    assert hw.tensor_clock_mhz.value < hw.clock_mhz.value


def test_tensor_core_gemms_see_the_sm_clocked_figures_at_the_tensor_clock() -> None:
    """L2 bandwidth and shared-memory bandwidth scale with the SM clock, L2 latency inversely,
    DRAM figures not at all; FFMA (fp32) GEMMs and GPUs without a tensor clock are unchanged."""
    from device_profiles.memory import memory_model_device

    h100 = get_profile("h100")
    tensor, ffma = (memory_model_device(h100, d).base for d in ("tf32", "fp32"))
    # the L2 figures stay the profile's (a fit reports and stores them so); the traffic
    # applies the clock
    assert tensor.memory.sm_clock_ratio == pytest.approx(1830 / 1980)
    assert ffma.memory.sm_clock_ratio == 1.0
    assert dataclasses.replace(tensor.memory, sm_clock_ratio=1.0) == ffma.memory
    assert tensor.shared_memory_bytes_per_us == pytest.approx(128 * 1830)
    assert ffma.shared_memory_bytes_per_us == pytest.approx(128 * 1980)
    grid = Grid.of(128, 128, 32, 1, 1, 1)
    # 4096^2 x 4096 at 128 x 128: every wave bound by the L2's per-SM share
    hot, cold = (
        gemm_traffic(4096, 4096, 4096, 4, grid, f.memory).load_throughput_elements_per_us[0]
        for f in (tensor, ffma)
    )
    assert hot == pytest.approx(cold * 1830 / 1980, rel=1e-9)
    a100 = get_profile("a100")
    assert memory_model_device(a100, "tf32").base.memory == (
        memory_model_device(a100, "fp32").base.memory
    )


@pytest.mark.parametrize(
    ("device", "shared_per_sm_kb", "shared_per_block_kb"),
    # CUDA C++ Programming Guide, technical specifications per compute capability
    [("v100", 96, 96), ("a100", 164, 163), ("h100", 228, 227)],
)
def test_shared_memory_limits_of_the_programming_guide(
    device: str, shared_per_sm_kb: int, shared_per_block_kb: int
) -> None:
    profile = get_profile(device)
    hw, mb = profile.hardware, profile.many_bsp
    assert mb is not None and mb.shared_memory_per_sm_bytes is not None
    assert hw.shared_memory_per_sm_bytes is not None
    assert hw.shared_memory_per_block_bytes is not None
    assert hw.shared_memory_per_sm_bytes.value == shared_per_sm_kb * 1024
    assert mb.shared_memory_per_sm_bytes.value == shared_per_sm_kb * 1024
    assert hw.shared_memory_per_block_bytes.value == shared_per_block_kb * 1024


@pytest.mark.parametrize(
    ("device", "fp32_per_sm", "int32_per_sm"),
    # results per clock per SM, CUDA C++ Programming Guide arithmetic throughput table
    [("v100", 64, 64), ("a100", 64, 64), ("h100", 128, 64)],
)
def test_per_scheduler_throughputs_add_up_to_the_per_sm_rates(
    device: str, fp32_per_sm: int, int32_per_sm: int
) -> None:
    mb = get_profile(device).many_bsp
    assert mb is not None and mb.n_ws is not None
    classes = mb.instruction_classes
    assert mb.n_ws.value * classes["fma_f32"].throughput_per_ws == fp32_per_sm
    assert mb.n_ws.value * classes["alu"].throughput_per_ws == int32_per_sm
    # shared memory: 128 bytes per clock per SM (the survey's bandwidths / (SMs x clock))
    assert mb.n_ws.value * classes["ld_shared"].throughput_per_ws * 4 == 128


def test_a100_latencies_of_abdelkhalik_et_al() -> None:
    # arXiv:2208.11174: memory latencies (global 290, L1 33, shared ld/st 23/19) and the CPI of
    # dependent add.u32 (4), mad.rn.f32 (4), add.f64 (5); div.rn.f32 525, rcp.rn.f32 198
    mb = get_profile("a100").many_bsp
    assert mb is not None and mb.mem_lat_cycles is not None and mb.l1_hit_latency_cycles
    assert mb.mem_lat_cycles.value == 290 and mb.l1_hit_latency_cycles.value == 33
    latency = {k: c.latency_cycles for k, c in mb.instruction_classes.items()}
    # the classes cited from that paper (the finer sm_80 rows cite other sources)
    cited = {k: v for k, v in latency.items() if "Abdelkhalik" in mb.instruction_classes[k].source}
    assert {k: latency[k] for k in cited if not mb.instruction_classes[k].estimate} == {
        "alu": 4,
        "fma_f32": 4,
        "dp_arith": 5,
        "sfu_div": 525,
        "sfu_rcp": 198,
        "ld_global": 290,
        "st_global": 290,
        "ld_shared": 23,
        "st_shared": 19,
        "ld_global_nc": 290,  # the read-only path: the ld_global row's figures
    }


@pytest.mark.parametrize("device", ["v100", "h100"])
def test_survey_latencies(device: str) -> None:
    # Ultrasonics Sonochemistry 99 (2023) 106546, Table 3: global 400, shared 20, arithmetic 4
    mb = get_profile(device).many_bsp
    assert mb is not None and mb.mem_lat_cycles is not None
    assert mb.mem_lat_cycles.value == 400
    classes = mb.instruction_classes
    assert classes["ld_global"].latency_cycles == classes["st_global"].latency_cycles == 400
    assert classes["ld_shared"].latency_cycles == classes["st_shared"].latency_cycles == 20
    assert classes["fma_f32"].latency_cycles == 4


@pytest.mark.parametrize("device", ["a100", "h100"])
def test_borrowed_bar_sync_overheads_are_flagged_v100_figures(device: str) -> None:
    v100, other = get_profile("v100").many_bsp, get_profile(device).many_bsp
    assert v100 is not None and other is not None
    # gpu-synchronization-study.txt Table 5 (V100): 22 cycles at 32 threads, 84 at 1024
    points = {p.threads_per_block: p.overhead_cycles for p in other.bar_sync_overhead}
    assert points[32] == 22 and points[1024] == 84
    assert points == {p.threads_per_block: p.overhead_cycles for p in v100.bar_sync_overhead}
    assert all(p.estimate for p in other.bar_sync_overhead)
    assert not any(p.estimate for p in v100.bar_sync_overhead)
