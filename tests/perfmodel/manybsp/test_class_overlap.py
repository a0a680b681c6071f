"""Block classes share the SMs: a class's latency-bound excess is hidden by another class's
slack below its throughput floor (eq. (18)-(20): one eq. (24) over every block's profile).

Each class alone is checked against eq. (24)'s blocks term written out here (from the class's
own comp, rho and w); the grid of two classes against those terms, not against the sum."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_profiles import get_profile
from perfmodel.manybsp import device_from_profile
from perfmodel.manybsp.kernel import (
    BlockTotals,
    kernel_from_totals,
    occupancy_rho,
    sum_block_classes,
    throughput_floor,
)
from perfmodel.manybsp.types import KernelEstimate, LaunchShape, ManyBspDevice

A100 = device_from_profile(get_profile("a100")).device
GTX760 = device_from_profile(get_profile("gtx-760")).device


def _totals(w: int, comp: float, comm: float, warp_cycles: float, threads: int) -> BlockTotals:
    return BlockTotals(
        w=w,
        parallel_comp=comp,
        block_bar_ovh=0.0,
        block_comm=comm,
        block_comm_delta=comm / 2,
        l=100,
        l_c=90,
        l_m=10,
        l_b=0,
        warp_issue_cycles=warp_cycles,
        warp_unit_cycles=warp_cycles / 2,
        threads=threads,
    )


def _bounds(totals: BlockTotals, launch: LaunchShape, dev: ManyBspDevice) -> tuple[float, float]:
    """(eq. (24)'s latency-bound blocks term, throughput floor) of one class on its own:
    n_b / n_sm x comp / min(mu, (1 + rho w) / 2), comp by eq. (5) and (19)."""
    comp = totals.w * dev.warp_launch_overhead_cycles + totals.parallel_comp
    comp += totals.block_bar_ovh
    overlap = min(dev.mu, (1 + occupancy_rho(launch, dev) * totals.w) / 2)
    return launch.n_b / dev.n_sm * comp / overlap, throughput_floor(totals, launch, dev)


def _estimate(totals: BlockTotals, launch: LaunchShape) -> KernelEstimate:
    return kernel_from_totals(totals, launch, A100)


@settings(max_examples=200, deadline=None)
@given(
    majority_blocks=st.integers(2_000, 40_000),
    minority_blocks=st.integers(1, 2_000),
    majority_warp_cycles=st.floats(2_000.0, 20_000.0),
    minority_comp=st.floats(100.0, 20_000.0),
    minority_comm=st.floats(0.0, 50_000.0),
)
def test_a_small_class_adds_only_its_floor_while_the_majority_has_slack(
    majority_blocks: int,
    minority_blocks: int,
    majority_warp_cycles: float,
    minority_comp: float,
    minority_comm: float,
) -> None:
    # majority: 8 warps per block, short latency, much issue work -> floor-bound (slack);
    # minority: one active warp, little work, long latency -> latency-bound on its own
    shape = LaunchShape(
        n_b=majority_blocks, n_t=256, registers_per_thread=32, shared_bytes_per_block=0
    )
    majority = _totals(2, 1_000.0, 400.0, majority_warp_cycles, 256)
    minority = _totals(1, minority_comp, minority_comm, 500.0, 32)
    major_shape = shape
    minor_shape = dataclasses.replace(shape, n_b=minority_blocks)
    lat_major, floor_major = _bounds(majority, major_shape, A100)
    lat_minor, floor_minor = _bounds(minority, minor_shape, A100)
    major = _estimate(majority, major_shape)
    minor = _estimate(minority, minor_shape)
    alone = sum_block_classes([major], A100)
    both = sum_block_classes([major, minor], A100)
    drain = max(major.novlp, minor.novlp) / 2 - major.novlp / 2
    added = both - alone - drain
    tol = 1e-9 * both  # the difference of two sums of this size
    # never below the minority's own throughput work, never above the class run on its own
    assert added >= floor_minor - tol
    assert added <= max(lat_minor, floor_minor) + tol
    slack = floor_major - lat_major
    excess = lat_minor - floor_minor
    if slack >= excess:
        # the majority's spare latency slack hides the minority's excess whole
        assert added == pytest.approx(floor_minor, abs=tol)
    else:
        # only what the slack does not cover shows
        assert added == pytest.approx(floor_minor + excess - max(0.0, slack), abs=tol)


def test_a_latency_bound_minority_is_hidden_by_a_floor_bound_majority() -> None:
    # one example where the old per-class sum and the shared grid differ: the minority on
    # its own is latency-bound at several times its floor
    shape = LaunchShape(n_b=20_000, n_t=256, registers_per_thread=32, shared_bytes_per_block=0)
    majority = _totals(2, 1_000.0, 400.0, 10_000.0, 256)
    minority = _totals(1, 2_000.0, 30_000.0, 50.0, 32)
    minor_shape = dataclasses.replace(shape, n_b=500)
    lat_minor, floor_minor = _bounds(minority, minor_shape, A100)
    lat_major, floor_major = _bounds(majority, shape, A100)
    assert lat_minor > 2 * floor_minor  # the minority alone: latency-bound
    assert floor_major - lat_major > lat_minor  # the majority's slack covers it
    major, minor = _estimate(majority, shape), _estimate(minority, minor_shape)
    both = sum_block_classes([major, minor], A100)
    drain = max(major.novlp, minor.novlp) / 2 - major.novlp / 2
    # added: its floor, not the latency-bound lat_minor a class run on its own would add
    added = both - sum_block_classes([major], A100) - drain
    assert added == pytest.approx(floor_minor, abs=1e-9 * both)


def test_without_a_floor_the_classes_add() -> None:
    # the report's GPUs: eq. (24) per class, the classes' times add as before
    shape = LaunchShape(n_b=1_000, n_t=256, registers_per_thread=32, shared_bytes_per_block=0)
    a = kernel_from_totals(_totals(2, 1_000.0, 400.0, 0.0, 0), shape, GTX760)
    b = kernel_from_totals(_totals(1, 2_000.0, 30_000.0, 0.0, 0), shape, GTX760)
    assert sum_block_classes([a, b], GTX760) == a.kernel_exec_cycle + b.kernel_exec_cycle
