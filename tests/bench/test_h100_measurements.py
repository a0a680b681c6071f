"""The H100 timings this project measured (bench/h100/): the script's host-side parts, and
what the model must keep doing on them (its ranking of real Triton tilings)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from bench import bench_h100_triton, measure_h100
from device_profiles import get_profile
from device_profiles.memory import memory_model_device

HERE = Path(__file__).resolve().parents[2] / "bench" / "h100"


def test_the_host_dedispersion_matches_a_channel_by_channel_sum() -> None:
    """numpy_dedispersion (the check of every GPU output) against a plain loop over channels
    in float32, the kernel's own order, on three samples of one DM."""
    rng = np.random.default_rng(3)
    per_channel = measure_h100.NR_SAMPLES + measure_h100.MAX_SHIFT
    data = rng.integers(0, 256, size=per_channel * measure_h100.NR_CHANNELS, dtype=np.uint8)
    shifts = measure_h100.dispersion_shifts()
    dm = 1777
    row = measure_h100.numpy_dedispersion(data, shifts, dm)
    dm_value = np.float32(dm) * np.float32(measure_h100.DM_STEP)
    for sample in (0, 4321, measure_h100.NR_SAMPLES - 1):
        total = np.float32(0.0)
        for channel in range(measure_h100.NR_CHANNELS):
            shift = int(np.float32(dm_value * shifts[channel]))
            total = np.float32(total + np.float32(data[channel * per_channel + sample + shift]))
        assert row[sample] == total


def test_the_dispersion_shifts_stay_inside_the_kernels_padding() -> None:
    """The lowest channel is delayed most, the highest not at all, and the largest DM's shift
    fits the max_shift samples of padding the kernel's input has (the tuning problem's own
    consistency check)."""
    shifts = measure_h100.dispersion_shifts()
    assert shifts[-1] == 0.0
    assert np.all(np.diff(shifts) < 0)
    largest = (measure_h100.NR_DMS - 1) * measure_h100.DM_STEP * float(shifts[0])
    assert largest < measure_h100.MAX_SHIFT


def test_every_sweep_tiling_fits_the_shared_memory_and_is_distinct() -> None:
    for dtype, element in (("bf16", 2), ("tf32", 4)):
        tilings = measure_h100.sweep_tilings(dtype, 10_000, 0, 232_448)
        assert len(set(tilings)) == len(tilings)
        for bm, bn, bk, stages, _group, _warps in tilings:
            assert stages * (bm + bn) * bk * element <= 232_448


def test_the_timed_dedispersion_configurations_are_the_benchs_samples() -> None:
    """The H100 file holds exactly the union of the configurations bench_real_kernels samples
    for the shared GPUs, with Kernel Tuner's launch geometry."""
    if not measure_h100.DEDISP.is_dir():
        pytest.skip(f"{measure_h100.DEDISP} absent")
    with open(HERE / "run4" / "dedispersion_h100.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    timed = {tuple(int(r[k]) for k in measure_h100.TUNABLES) for r in rows}
    sample = {tuple(p.values()) for p in measure_h100.dedispersion_sample()}
    assert timed == sample
    for r in rows:
        params = {k: int(r[k]) for k in measure_h100.TUNABLES}
        grid = (int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"]))
        assert grid == measure_h100.grid_of(params)


@pytest.mark.parametrize("dtype", ["bf16", "tf32"])
def test_the_model_ranks_real_triton_tilings_better_than_a_blind_pick(dtype: str) -> None:
    """On every shape of the H100 sweep, the uncalibrated model's fastest tiling runs faster
    than the median tiling does, and its order agrees with the measured one (Spearman > 0.3)."""
    sweep = bench_h100_triton.read_sweep(HERE / "run2" / "triton_sweep.csv")[dtype]
    device = memory_model_device(get_profile("h100"), dtype)
    assert len(sweep) == 12
    for shape, runs in sweep.items():
        measured = [r.measured_time_us for r in runs]
        predicted = bench_h100_triton.predictions(runs, device, device.base)
        rho, pick, _top5, _error = bench_h100_triton.ranking(predicted, measured)
        assert pick < float(np.median(measured)) / min(measured), shape
        assert rho > 0.3, shape
