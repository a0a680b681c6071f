"""The explore shortlist's draws on the L2-reuse memory model (FigureScale): a draw of the
point figures is the point prediction, every configuration's time moves monotonically with
each figure, and a draw equals the model re-evaluated on figures scaled the same way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from device_profiles import get_profile
from device_profiles.memory import memory_model_device
from perfmodel.gemm_ws_memory_model import FigureScale, ShapeModel, Space, kernel_times

DEVICE = memory_model_device(get_profile("h100"), "bf16", "async-copy")


def _model(m: int, n: int, k: int) -> ShapeModel:
    space = DEVICE.space.where(DEVICE.space.split_k <= -(-k // DEVICE.space.tile_k))
    return ShapeModel(m, n, k, 2, space, DEVICE.sm_count, DEVICE.limits, "async-copy")


def _times(model: ShapeModel, scale: FigureScale | None = None) -> np.ndarray:
    stage, _ = model.stage_times_us(DEVICE.base, scale)
    total, _ = kernel_times(stage)
    return np.asarray(total, dtype=np.float64)


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (512, 8192, 1024), (128, 128, 16384)])
def test_a_draw_of_the_point_figures_is_the_point_prediction(shape: tuple[int, int, int]) -> None:
    model = _model(*shape)
    ones = np.ones((3, 1))
    scale = FigureScale(ones, ones, ones, ones, ones, ones)
    drawn = _times(model, scale)
    assert drawn.shape == (3, model.space.tile_m.size)
    np.testing.assert_array_equal(drawn, np.broadcast_to(_times(model), drawn.shape))
    np.testing.assert_allclose(_times(model), model.times_us(DEVICE.base)[0], rtol=1e-12)


@pytest.mark.parametrize("figure", [f.name for f in dataclasses.fields(FigureScale)])
def test_a_faster_figure_never_slows_a_configuration(figure: str) -> None:
    """Bandwidth and compute up, or a latency, launch or epilogue down, by any factor: no
    configuration's time grows."""
    model = _model(2048, 3072, 4096)
    speedup = figure in ("bandwidth", "compute")
    factors = np.array([[1.0], [1.3], [2.0], [5.0]])
    scale = FigureScale(**{figure: factors if speedup else 1.0 / factors})
    drawn = _times(model, scale)
    assert np.all(np.diff(drawn, axis=0) <= 1e-9 * drawn[:-1])
    assert np.any(drawn[-1] < drawn[0]), "the figure moves no configuration"


def test_a_compute_draw_is_the_model_on_a_scaled_mac_rate() -> None:
    model = _model(4096, 4096, 1024)
    faster = dataclasses.replace(
        DEVICE.base, compute_throughput_macs_per_us=DEVICE.base.compute_throughput_macs_per_us * 1.7
    )
    drawn = _times(model, FigureScale(compute=np.array([[1.7]])))[0]
    np.testing.assert_allclose(drawn, model.times_us(faster)[0], rtol=1e-12)


def test_where_selects_a_subset_the_draws_see_alike() -> None:
    model = _model(1024, 1024, 8192)
    index = np.arange(0, model.space.tile_m.size, 7)
    scale = FigureScale(bandwidth=np.array([[0.6], [1.4]]))
    np.testing.assert_allclose(
        _times(model.subset(index), scale), _times(model, scale)[:, index], rtol=1e-12
    )


def test_space_has_the_default_raster() -> None:
    assert set(np.unique(DEVICE.space.group_m)) == {1, 8}
    assert set(np.unique(DEVICE.space.split_k)) == {1, 2, 4, 8, 16}
    assert isinstance(DEVICE.space, Space)


@pytest.mark.parametrize("high", [3, 300, 1 << 40])
def test_unique_rows_is_numpys_unique_over_rows(high: int) -> None:
    """The packed fast path (and, for wide ranges, the fallback) is numpy's row unique."""
    from perfmodel.gemm_ws_traffic import unique_rows

    rng = np.random.default_rng(high)
    keys = rng.integers(0, high, size=(500, 5), dtype=np.int64)
    keys[250:] = keys[:250]  # repeated rows
    unique, inverse = unique_rows(keys)
    expected, expected_inverse = np.unique(keys, axis=0, return_inverse=True)
    np.testing.assert_array_equal(unique, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.reshape(-1))
    np.testing.assert_array_equal(unique[inverse], keys)
