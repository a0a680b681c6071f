"""Priors of every calibratable figure (issue 16), checked against the papers' numbers, the
public hardware figures the derivations cite, and real measured GEMM times."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from app.convert.optimize import gemm_ws_machine
from device_profiles import default_profiles, get_profile
from device_profiles.priors import gemm_ws_dtype_ratios, gemm_ws_priors, many_bsp_priors
from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, machine_for_dtype, simulate
from tests.device_profiles.test_todays_gpus import FITTED

PROFILES = sorted(default_profiles())
GEMM_WS = FITTED["gemm-ws"]
MANY_BSP = FITTED["many-bsp"]
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real-gemm"


@pytest.mark.parametrize("device", PROFILES)
def test_every_calibratable_figure_has_a_cited_prior(device: str) -> None:
    profile = get_profile(device)
    for priors, names in ((gemm_ws_priors(profile), GEMM_WS), (many_bsp_priors(profile), MANY_BSP)):
        assert set(priors) == names
        for prior in priors.values():
            assert prior.median > 0 and prior.sigma_log > 0 and len(prior.source) > 20


@pytest.mark.parametrize("device", PROFILES)
def test_an_estimate_is_its_priors_median(device: str) -> None:
    profile = get_profile(device)
    for section, priors in (
        (profile.gemm_ws, gemm_ws_priors(profile)),
        (profile.many_bsp, many_bsp_priors(profile)),
    ):
        for name, prior in priors.items():
            figure = getattr(section, name)
            if figure.estimate:
                assert figure.value == prior.median, name


def test_a6000_priors_are_the_papers_measurements() -> None:
    priors = gemm_ws_priors(get_profile("rtx-a6000"))
    # warp-specialization-gemm-model.txt §4.2.1-§4.2.3: mean and standard deviation
    assert priors["t_init_us"].median == 1.680
    assert priors["t_init_us"].sigma_log == pytest.approx(0.027 / 1.680, rel=0.01)
    assert priors["t_epilogue_us"].median == 1.543
    assert priors["t_epilogue_us"].sigma_log == pytest.approx(0.174 / 1.543, rel=0.01)
    assert priors["load_startup_latency_us"].median == 0.770
    assert priors["load_throughput_elements_per_us"].median == 152.96
    assert priors["compute_throughput_macs_per_us"].median == 24610
    # "negligible": a small positive median, a wide spread; the point value stays 0 (Table 1)
    negligible = priors["compute_startup_latency_us"]
    assert negligible.median < 0.05 and negligible.sigma_log >= 1.5
    section = get_profile("rtx-a6000").gemm_ws
    assert section is not None and section.compute_startup_latency_us.value == 0


@pytest.mark.parametrize(("device", "mu", "block"), [("gtx-760", 3.36, 553), ("940mx", 1.93, 382)])
def test_many_bsp_priors_of_the_papers_devices(device: str, mu: float, block: float) -> None:
    # many-bsp-supplementary.txt §2 and §5 parameter blocks
    priors = many_bsp_priors(get_profile(device))
    assert priors["mu"].median == mu and priors["block_launch_overhead_cycles"].median == block
    assert priors["warp_launch_overhead_cycles"].median == 10
    # the other devices: wider than the paper's own, centred between its two devices
    for other in ("gtx-1070", "p100", "v100", "a100", "h100", "rtx-a6000"):
        derived = many_bsp_priors(get_profile(other))["mu"]
        assert 1.93 < derived.median < 3.36 and derived.sigma_log > priors["mu"].sigma_log


#: public figures, independent of the profile files: DRAM GB/s, SMs, dense fp16-input TFLOPS
#: (A6000 data sheet; A100 and V100 whitepapers; H100 SXM datasheet)
PUBLIC = {
    "rtx-a6000": (768.0, 84, 154.8),
    "a100": (1555.0, 108, 312.0),
    "v100": (900.0, 80, 125.0),
    "h100": (3352.0, 132, 989.4),
}


@pytest.mark.parametrize("device", ["a100", "v100", "h100"])
def test_throughput_priors_scale_the_a6000_by_public_per_sm_figures(device: str) -> None:
    bw, sms, peak = PUBLIC[device]
    bw0, sms0, peak0 = PUBLIC["rtx-a6000"]
    priors = gemm_ws_priors(get_profile(device))
    load = priors["load_throughput_elements_per_us"].median
    compute = priors["compute_throughput_macs_per_us"].median
    assert load == pytest.approx(152.96 * (bw / sms) / (bw0 / sms0), rel=1e-3)
    assert compute == pytest.approx(24610 * (peak / sms) / (peak0 / sms0), rel=1e-3)
    # the A6000 figures are one kernel's, ~30-40x below peak: the spread must say so
    assert priors["compute_throughput_macs_per_us"].sigma_log >= 1.5


ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@pytest.mark.parametrize(
    ("device", "dtypes"),
    [
        ("h100", {"fp32", "fp16", "bf16", "fp8"}),
        ("a100", {"fp32", "fp16", "bf16"}),
        ("rtx-a6000", {"fp32", "fp16", "bf16"}),
        ("v100", {"fp32", "fp16"}),
        ("p100", {"fp32", "fp16"}),
        ("gtx-1070", {"fp32", "fp16"}),
        ("gtx-760", {"fp32", "fp16"}),
        ("940mx", {"fp32", "fp16"}),
    ],
)
def test_dtype_ratios(device: str, dtypes: set[str]) -> None:
    ratios = gemm_ws_dtype_ratios(get_profile(device))
    assert set(ratios) == dtypes and ratios["fp16"] == (1.0, 1.0)
    for dtype, (load, _) in ratios.items():
        assert load == 2 / ELEMENT_BYTES[dtype]  # bandwidth-bound loads
    if "fp8" in ratios:
        assert ratios["fp8"][1] == 2.0  # H100 datasheet: FP8 tensor = 2x FP16
    with pytest.raises(ModelInputError) as info:
        gemm_ws_machine(get_profile(device), "fp8" if "fp8" not in dtypes else "nope")
    assert info.value.field == "dtype" and "fp16" in info.value.reason


def test_machine_for_dtype_scales_only_the_throughputs() -> None:
    base = GemmWsMachine(84, 1.68, 1.543, 0.77, 0.0, 152.96, 24610)
    assert machine_for_dtype(base, 1.0, 1.0) is base
    scaled = machine_for_dtype(base, 0.5, 2.0)
    assert scaled.load_throughput_elements_per_us == 76.48
    assert scaled.compute_throughput_macs_per_us == 49220
    assert (scaled.t_init_us, scaled.t_epilogue_us, scaled.sm_count) == (1.68, 1.543, 84)


def test_a6000_fp16_machine_is_the_papers() -> None:
    # Table 1's oracle: §4.2 figures, untouched by the dtype ratios
    m = gemm_ws_machine(get_profile("rtx-a6000"), "fp16")
    assert (m.load_throughput_elements_per_us, m.compute_throughput_macs_per_us) == (152.96, 24610)
    assert (m.t_init_us, m.t_epilogue_us, m.load_startup_latency_us) == (1.680, 1.543, 0.770)
    assert m.compute_startup_latency_us == 0


def _sgemm_4096_best_per_tile(gpu_prefix: str) -> dict[tuple[int, int, int], float]:
    """Kernel Tuner's measured CLBlast SGEMM 4096^3 (PROVENANCE.md there): fastest time (ms)
    per work-group tile (MWG, NWG, KWG)."""
    path = SHARED / "kt_xgemm_sgemm4096" / "xgemm_sgemm4096_all.csv"
    if not path.exists():
        pytest.skip(f"{path} absent (public data set, not in the repository)")
    best: dict[tuple[int, int, int], float] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["gpu"].startswith(gpu_prefix):
                key = (int(row["MWG"]), int(row["NWG"]), int(row["KWG"]))
                best[key] = min(best.get(key, math.inf), float(row["time_ms"]))
    assert best, f"no {gpu_prefix} rows"
    return best


@pytest.mark.parametrize(("device", "gpu", "dtype"), [("a100", "A100", "fp32")])
def test_measured_sgemm_times_lie_within_the_priors_spread(
    device: str, gpu: str, dtype: str
) -> None:
    """The prior's predicted time of each measured tile is within 2.5 sigma_log (of the
    throughput priors) of the measured one, and the median tile within 2: the medians are the
    A6000 kernel's rates scaled, a tuned SGEMM runs far faster, and the spread says so."""
    profile = get_profile(device)
    machine = gemm_ws_machine(profile, dtype)
    sigma = max(
        gemm_ws_priors(profile)[n].sigma_log
        for n in ("load_throughput_elements_per_us", "compute_throughput_macs_per_us")
    )
    shape = GemmShape(4096, 4096, 4096)
    log_ratios = sorted(
        math.log(simulate(shape, Tiling(tm, tn, tk, 2), machine).overall_time_ns / 1e6 / t)
        for (tm, tn, tk), t in _sgemm_4096_best_per_tile(gpu).items()
    )
    assert max(abs(r) for r in log_ratios) <= 2.5 * sigma
    assert abs(log_ratios[len(log_ratios) // 2]) <= 2 * sigma
