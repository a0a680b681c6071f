"""L2 reuse and split-K traffic against a CTA-by-CTA simulation of the grouped raster order."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from perfmodel.gemm_ws_traffic import (
    MAX_EXACT_WAVES,
    Grid,
    MemoryFigures,
    distinct_panels,
    gemm_traffic,
    split_k_reduction_us,
)


def triton_tile(pid: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """Triton's grouped ordering, written as its tutorial writes it."""
    in_group = group_m * tiles_n
    group_id = pid // in_group
    first_m = group_id * group_m
    size_m = min(tiles_m - first_m, group_m)
    return first_m + (pid % in_group) % size_m, (pid % in_group) // size_m


def panels(ids: range, tiles_m: int, tiles_n: int, group_m: int) -> set[tuple[str, int, int]]:
    out = set()
    for cta in ids:
        z, pid = divmod(cta, tiles_m * tiles_n)
        row, col = triton_tile(pid, tiles_m, tiles_n, group_m)
        out |= {("A", row, z), ("B", col, z)}
    return out


def simulate(
    m: int,
    n: int,
    k: int,
    e: int,
    tm: int,
    tn: int,
    tk: int,
    g: int,
    s: int,
    c: int,
    fig: MemoryFigures,
) -> tuple[float, float]:
    """(DRAM bytes, requested bytes): wave by wave, sets of panels; a panel of the previous
    wave is kept in the proportion L2 / bytes of both waves' panels."""
    tiles_m, tiles_n = -(-m // tm), -(-n // tn)
    k_per_cta = -(-k // s)
    k_loaded = -(-k_per_cta // tk) * tk
    size = {"A": tm * k_loaded * e, "B": tn * k_loaded * e}
    ctas, per_wave = tiles_m * tiles_n * s, fig.sm_count * c
    dram = requested = 0.0
    previous: set[tuple[str, int, int]] = set()
    for start in range(0, ctas, per_wave):
        ids = range(start, min(start + per_wave, ctas))
        now = panels(ids, tiles_m, tiles_n, g)
        both = sum(size[p[0]] for p in now | previous)
        kept = min(1.0, fig.l2_size_bytes / both) if previous else 0.0
        dram += sum(size[p[0]] for p in now) - kept * sum(size[p[0]] for p in now & previous)
        requested += len(ids) * (size["A"] + size["B"])
        previous = now
    return dram, requested


def figures(sms: int, l2: float) -> MemoryFigures:
    return MemoryFigures(sms, 1500.0, 5000.0, l2, 0.4, 0.15)


def test_distinct_panels_match_enumeration() -> None:
    rng = random.Random(1)
    for _ in range(400):
        tiles_m, tiles_n, g, s = (
            rng.randint(1, 9),
            rng.randint(1, 9),
            rng.randint(1, 10),
            rng.randint(1, 3),
        )
        total = tiles_m * tiles_n * s
        a = rng.randrange(total)
        b = rng.randint(a + 1, total)
        rows, cols = distinct_panels(*(np.array([v]) for v in (a, b, tiles_m, tiles_n, g)))
        found = panels(range(a, b), tiles_m, tiles_n, g)
        assert (int(rows[0]), int(cols[0])) == (
            sum(p[0] == "A" for p in found),
            sum(p[0] == "B" for p in found),
        ), (tiles_m, tiles_n, g, s, a, b)


def test_traffic_equals_wave_by_wave_simulation() -> None:
    rng = random.Random(2)
    for _ in range(300):
        m, n, k = (rng.randint(1, 700) for _ in range(3))
        tm, tn, tk = (rng.choice([16, 32, 64, 128]) for _ in range(3))
        g, s, c = rng.randint(1, 9), rng.randint(1, 4), rng.randint(1, 3)
        e = rng.choice([1, 2, 4])
        fig = figures(rng.randint(1, 12), rng.choice([0.0, 1e4, 1e5, 1e6, 1e12]))
        t = gemm_traffic(m, n, k, e, Grid.of(tm, tn, tk, g, s, c), fig)
        dram, requested = simulate(m, n, k, e, tm, tn, tk, g, s, c, fig)
        full_waves = int(t.ctas[0]) // (fig.sm_count * c)
        # exact up to MAX_EXACT_WAVES - 1 full waves; a sample of them beyond
        if full_waves < MAX_EXACT_WAVES:
            assert t.dram_bytes[0] == pytest.approx(dram, rel=1e-9)
            assert t.requested_bytes[0] == pytest.approx(requested, rel=1e-12)


def test_sampled_waves_stay_close_on_gpu_sized_grids() -> None:
    """Beyond MAX_EXACT_WAVES full waves, sampled waves stand for the rest: requested bytes
    within 1 %, DRAM bytes within 30 % of the wave-by-wave simulation on GPU-sized grids."""
    rng = random.Random(5)
    checked = 0
    while checked < 15:
        m, n, k = (rng.randint(512, 3000) for _ in range(3))
        tm, tn, tk = (rng.choice([16, 32, 64]) for _ in range(3))
        g, c = rng.choice([1, 4, 8]), rng.randint(1, 2)
        fig = figures(rng.randint(20, 40), rng.choice([1e5, 1e6, 1e8]))
        t = gemm_traffic(m, n, k, 2, Grid.of(tm, tn, tk, g, 1, c), fig)
        if int(t.ctas[0]) // (fig.sm_count * c) < MAX_EXACT_WAVES:
            continue
        checked += 1
        dram, requested = simulate(m, n, k, 2, tm, tn, tk, g, 1, c, fig)
        assert t.dram_bytes[0] == pytest.approx(dram, rel=0.3)
        assert t.requested_bytes[0] == pytest.approx(requested, rel=0.01)


def test_hit_rate_bounds_and_no_reuse_alone() -> None:
    # one CTA per wave and no L2: nothing is shared, every request goes to DRAM
    t = gemm_traffic(512, 512, 512, 2, Grid.of(128, 128, 32), figures(1, 0.0))
    assert t.l2_hit_rate[0] == pytest.approx(0.0)
    rng = random.Random(3)
    for _ in range(100):
        tm, tn, tk = (rng.choice([16, 64, 128, 256]) for _ in range(3))
        m, n, k = (rng.randint(64, 8192) for _ in range(3))
        t = gemm_traffic(m, n, k, 2, Grid.of(tm, tn, tk, rng.randint(1, 16)), figures(132, 4e7))
        assert 0.0 <= t.l2_hit_rate[0] < 1.0
        # never below the compulsory traffic: every panel of the grid read once
        k_loaded = -(-k // tk) * tk
        compulsory = (-(-m // tm) * tm + -(-n // tn) * tn) * k_loaded * 2
        # (up to the sampling of waves beyond MAX_EXACT_WAVES)
        assert t.dram_bytes[0] >= compulsory * 0.8


def test_grouping_raises_reuse_on_a_wide_grid() -> None:
    # 64 x 64 tiles, 132 CTAs a wave: row-major waves share 2-3 rows but 64 columns; groups of
    # 8 rows share 8 rows and ~17 columns. L2 fast enough that DRAM bounds both waves (under
    # the L2 bound alone the two rasters request the same bytes and load equally fast)
    fig = dataclasses.replace(figures(132, 5e7), l2_bandwidth_gb_per_s=20000.0)
    plain, grouped = (
        gemm_traffic(8192, 8192, 8192, 2, Grid.of(128, 128, 64, g), fig) for g in (1, 8)
    )
    assert grouped.dram_bytes[0] < 0.6 * plain.dram_bytes[0]
    assert grouped.load_throughput_elements_per_us[0] > plain.load_throughput_elements_per_us[0]


def test_split_k_multiplies_ctas_and_divides_k() -> None:
    fig = figures(132, 5e7)
    t = gemm_traffic(1024, 1024, 8192, 2, Grid.of(128, 128, 64, 1, [1, 2, 4]), fig)
    assert t.ctas.tolist() == [64, 128, 256]
    assert t.k_per_cta.tolist() == [8192, 4096, 2048]
    reduction = split_k_reduction_us(t, fig, 3.0)
    assert reduction[0] == 0.0
    # 2 x s x m x n x 4 bytes at 1500 GB/s, plus the fixed cost
    assert reduction[1] == pytest.approx(2 * 2 * 1024 * 1024 * 4 / 1.5e6 + 3.0)


def test_more_l2_never_costs_dram_bytes() -> None:
    rng = random.Random(4)
    for _ in range(50):
        tm, tn, tk = (rng.choice([32, 64, 128]) for _ in range(3))
        grid = Grid.of(tm, tn, tk, rng.randint(1, 8))
        m, n, k = (rng.randint(256, 4096) for _ in range(3))
        small, large = (gemm_traffic(m, n, k, 2, grid, figures(20, l2)) for l2 in (1e5, 1e7))
        assert large.dram_bytes[0] <= small.dram_bytes[0] + 1e-6


def test_a_wave_smaller_than_the_gpu_spreads_one_cta_per_sm() -> None:
    """40 CTAs on 132 SMs: each has an SM of its own whether 1 or 4 CTAs would fit one, so
    the per-SM load throughput (and a CTA's load time) does not depend on the CTAs per SM."""
    fig = figures(132, 5e7)
    t = gemm_traffic(640, 1024, 2048, 2, Grid.of(128, 128, 64, 1, 1, [1, 4]), fig)
    assert t.ctas.tolist() == [40, 40]
    throughput = t.load_throughput_elements_per_us
    assert throughput[1] == pytest.approx(throughput[0])


def test_an_l2_bound_wave_draws_its_sms_share_of_the_l2_bandwidth() -> None:
    """DRAM too fast to bind: a wave on any number of SMs loads at L2 bandwidth / all SMs per
    SM, so 40 CTAs load as fast per SM as a full wave of 132."""
    fig = dataclasses.replace(figures(132, 5e7), dram_bandwidth_gb_per_s=1e6)
    per_sm_elements = fig.l2_bandwidth_gb_per_s * 1e3 / fig.sm_count / 2
    for m, n in ((640, 1024), (1408, 1536)):  # 5 x 8 = 40 CTAs; 11 x 12 = 132 CTAs
        t = gemm_traffic(m, n, 2048, 2, Grid.of(128, 128, 64), fig)
        assert t.load_throughput_elements_per_us[0] == pytest.approx(per_sm_elements)
