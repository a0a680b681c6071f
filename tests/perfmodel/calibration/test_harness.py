"""The harness around a library's kernel: serial split-K's hand-offs and a framework call's
floor, in predictions and recovered by the configuration-less fit."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from perfmodel.calibration.configless import LibraryRun, RunModel, fit, harness_bases, scaled
from perfmodel.calibration.harness import Harness, observed_us
from perfmodel.gemm_ws_memory_model import MemoryModelFigures
from tests.perfmodel.calibration.test_configless import BASE, DEVICE, HIDDEN


def test_serial_split_k_trades_the_reduction_launch_for_its_hand_offs() -> None:
    """Same bytes either way: serial split-K minus the two-kernel form is (s - 1) hand-offs
    minus the reduction's fixed cost, whatever the shape; no split, no difference."""
    harness = Harness(serial_handoff_us=0.7)
    rng = random.Random(5)
    for _ in range(20):
        m, n = rng.choice((64, 256, 1024)), rng.choice((64, 256, 1024))
        k, s = rng.choice((2048, 8192)), rng.choice((1, 2, 4, 8))
        config = (64, 64, 32, 2, 1, s)
        parallel = RunModel(LibraryRun(m, n, k, "tf32", 1.0, config=config), DEVICE, 0)
        serial = RunModel(
            LibraryRun(m, n, k, "tf32", 1.0, config=config, serial_split_k=True), DEVICE, 0
        )
        expected = 0.0 if s == 1 else (s - 1) * 0.7 - BASE.reduction_overhead_us
        difference = serial.predict_us(BASE, harness) - parallel.predict_us(BASE, harness)
        assert abs(difference - expected) < 1e-9


def test_a_framework_floor_holds_small_runs_and_leaves_large_ones() -> None:
    """The larger of floor and kernel, smoothly: between max(both) and 2^(1/8) of it, within
    0.1 % of the larger where the other is under half of it."""
    floor = Harness(floor_us=60.0)
    small = RunModel(LibraryRun(64, 64, 64, "tf32", 1.0), DEVICE, 0).predict_us(BASE)
    large = RunModel(LibraryRun(4096, 4096, 4096, "tf32", 1.0), DEVICE, 0).predict_us(BASE)
    assert small < 30.0 and large > 120.0
    assert abs(observed_us(small, floor) / 60.0 - 1) < 1e-3
    assert abs(observed_us(large, floor) / large - 1) < 1e-3
    for kernel in np.linspace(1.0, 200.0, 50):
        seen = observed_us(float(kernel), floor)
        assert max(kernel, 60.0) <= seen <= 2 ** (1 / 8) * max(kernel, 60.0) + 1e-9
    assert observed_us(small, Harness()) == small


def _runs(count: int, seed: int, truth: MemoryModelFigures, harness: Harness) -> list[LibraryRun]:
    """Configured runs, a third with serial split-K, timed under ``harness``."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        m, n = rng.choice((32, 128, 512, 2048)), rng.choice((32, 128, 512, 2048))
        k = rng.choice((256, 2048, 8192))
        s = 4 if i % 3 == 0 else 1
        run = LibraryRun(m, n, k, "tf32", 1.0, config=(64, 64, 32, 2, 1, s))
        run = dataclasses.replace(run, serial_split_k=s > 1)
        measured = RunModel(run, DEVICE, i).predict_us(truth, harness)
        out.append(dataclasses.replace(run, measured_time_us=measured))
    return out


def test_the_fit_recovers_a_hidden_floor_and_hand_off() -> None:
    truth = scaled(BASE, HIDDEN)
    hidden = Harness(floor_us=40.0, serial_handoff_us=3.0)
    train, test = _runs(16, 1, truth, hidden), _runs(30, 2, truth, hidden)
    # the floor holds a share of the runs: the data can show it
    assert 0.2 < np.mean([r.measured_time_us < 40.4 for r in train]) < 0.8
    kernel_only = fit(train, DEVICE)
    result = fit(train, DEVICE, framework_floor=True)
    assert abs(result.harness.floor_us / 40.0 - 1) < 0.02
    assert abs(result.harness.serial_handoff_us / 3.0 - 1) < 0.25
    assert len(result.harness_log_scale) == len(harness_bases(BASE))

    def median_error(figures: MemoryModelFigures, harness: Harness) -> float:
        predicted = [RunModel(r, DEVICE, 0).predict_us(figures, harness) for r in test]
        measured = [r.measured_time_us for r in test]
        return float(np.median(np.abs(np.array(predicted) / np.array(measured) - 1)))

    assert median_error(result.figures, result.harness) < 0.02
    # without the floor, the additive T_INIT cannot describe both ends as well
    assert median_error(kernel_only.figures, kernel_only.harness) > median_error(
        result.figures, result.harness
    )
