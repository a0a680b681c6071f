"""Calibration from configuration-less runs: hidden figures recovered from the optimum's
times, runs with and without configurations in one fit, refusals naming the field."""

from __future__ import annotations

import random

import numpy as np
import pytest

from perfmodel.calibration.configless import (
    Device,
    LibraryRun,
    Objective,
    RunModel,
    fit,
    scaled,
)
from perfmodel.errors import CalibrationInputError
from perfmodel.gemm_ws import SmLimits
from perfmodel.gemm_ws_memory_model import MemoryModelFigures, Space
from perfmodel.gemm_ws_traffic import MemoryFigures

SPACE = Space.product(tiles=(32, 64, 128), depths=(2, 4), group_m=(1, 8), split_k=(1, 4))
BASE = MemoryModelFigures(2.5, 1.5, 0.02, 1.4e6, MemoryFigures(40, 2000, 6000, 2e7, 0.7, 0.35), 2.5)
DEVICE = Device(BASE, 40, SmLimits(8, 200_000), 100_000, "async-copy", SPACE)
#: the "real" GPU: slower MATH, slower launch, longer latency than the base believes
HIDDEN = (-0.3, 0.1, 0.0, 0.6, 0.4, 0.2, 0.0, 0.5)


def _shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    sizes = [256, 512, 1024, 2048, 4096]
    return [(rng.choice(sizes), rng.choice(sizes), rng.choice(sizes)) for _ in range(count)]


def _runs(shapes: list[tuple[int, int, int]], config: bool = False) -> list[LibraryRun]:
    truth = scaled(BASE, HIDDEN)
    out = []
    for i, (m, n, k) in enumerate(shapes):
        chosen = (64, 128, 32, 4, 8, 1) if config and i % 2 else None
        run = LibraryRun(m, n, k, "tf32", 1.0, config=chosen)
        measured = RunModel(run, DEVICE, i).predict_us(truth)
        out.append(LibraryRun(m, n, k, "tf32", measured, config=chosen))
    return out


def test_configless_runs_recover_the_hidden_figures_held_out() -> None:
    train, test = _runs(_shapes(16, 1)), _runs(_shapes(30, 2))
    base_errors = [
        abs(RunModel(r, DEVICE, 0).predict_us(BASE) / r.measured_time_us - 1) for r in test
    ]
    result = fit(train, DEVICE)
    errors = [
        abs(RunModel(r, DEVICE, 0).predict_us(result.figures) / r.measured_time_us - 1)
        for r in test
    ]
    assert np.median(base_errors) > 0.2  # the base is far off
    assert np.median(errors) < 0.03


def test_runs_with_and_without_configurations_mix_in_one_fit() -> None:
    train, test = _runs(_shapes(16, 3), config=True), _runs(_shapes(20, 4), config=True)
    assert {r.config is None for r in train} == {True, False}
    result = fit(train, DEVICE)
    errors = [
        abs(RunModel(r, DEVICE, 0).predict_us(result.figures) / r.measured_time_us - 1)
        for r in test
    ]
    assert np.median(errors) < 0.03


def test_a_shape_no_configuration_runs_is_refused_naming_the_run() -> None:
    tiny = Device(BASE, 40, SmLimits(8, 200_000), 1000, "async-copy", SPACE)
    with pytest.raises(CalibrationInputError) as caught:
        fit([LibraryRun(512, 512, 512, "tf32", 10.0)], tiny)
    assert caught.value.field == "measurements[0].m"


def test_split_k_beyond_the_k_tiles_is_refused_naming_the_configuration() -> None:
    run = LibraryRun(512, 512, 64, "tf32", 10.0, config=(64, 64, 32, 2, 1, 4))
    with pytest.raises(CalibrationInputError) as caught:
        fit([run], DEVICE)
    assert caught.value.field == "measurements[0].config"


def test_a_kernels_threads_bound_its_ctas_per_sm() -> None:
    """2048 threads per SM hold two 1024-thread CTAs, whatever shared memory would allow."""
    limits = SmLimits(32, 200_000, max_threads_per_sm=2048)
    device = Device(BASE, 40, limits, 100_000, "async-copy", SPACE)
    config = (32, 32, 32, 2, 1, 1)
    free = RunModel(LibraryRun(4096, 4096, 512, "tf32", 1.0, config=config), device, 0)
    bound = RunModel(
        LibraryRun(4096, 4096, 512, "tf32", 1.0, config=config, threads_per_cta=1024), device, 0
    )
    assert int(free.model.ctas_per_sm[0]) > 2
    assert int(bound.model.ctas_per_sm[0]) == 2
    with_registers = RunModel(
        LibraryRun(
            4096,
            4096,
            512,
            "tf32",
            1.0,
            config=config,
            threads_per_cta=256,
            registers_per_thread=128,
        ),
        Device(
            BASE,
            40,
            SmLimits(32, 200_000, registers_per_sm=65536, max_threads_per_sm=2048),
            100_000,
            "async-copy",
            SPACE,
        ),
        0,
    )
    assert int(with_registers.model.ctas_per_sm[0]) == 65536 // (256 * 128)


@pytest.mark.parametrize("config", [False, True])
def test_the_fits_jacobian_is_the_residuals_derivative(config: bool) -> None:
    """Away from ties between configurations the envelope Jacobian equals a central
    difference of the residuals themselves (the minimum included)."""
    runs = _runs(_shapes(8, 5), config=config)
    models = [RunModel(r, DEVICE, i) for i, r in enumerate(runs)]
    objective = Objective(models, BASE)
    x = np.array(HIDDEN) / 2
    jacobian = objective.jacobian(x)
    h = 1e-6
    for j in range(x.size):
        step = np.zeros_like(x)
        step[j] = h
        central = (objective.residuals(x + step) - objective.residuals(x - step)) / (2 * h)
        np.testing.assert_allclose(jacobian[:, j], central, rtol=2e-3, atol=2e-3)
