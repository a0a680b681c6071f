"""eq. (4)-(25) on the published level-1 supersteps: with Table N-3's comp/comm/ovh as input,
every intermediate quantity printed in §2-§7 must come out (oracle: the paper's numbers)."""

from __future__ import annotations

from typing import Any

import pytest

from perfmodel.manybsp.block import warps_per_scheduler
from perfmodel.manybsp.frontend import build_table
from perfmodel.manybsp.kernel import estimate_kernel, occupancy_rho
from perfmodel.manybsp.types import LaunchShape, ManyBspDevice, Superstep
from perfmodel.ptx import parse_module
from tests.perfmodel.manybsp.conftest import paper_request


def _estimate(case: dict[str, Any]) -> Any:
    req = paper_request(case)
    fn = parse_module(req.ptx).entry(None)
    dev = req.device.device
    n_t = req.block[0] * req.block[1] * req.block[2]
    table = build_table(
        fn,
        req.device.class_map(),
        mem_lat_cycles=dev.mem_lat_cycles,
        l1_hit_latency_cycles=req.device.l1_hit_latency_cycles,
        barrier_overhead_cycles=req.device.bar_sync_overhead_cycles(n_t),
        loop_trip_counts=req.loop_trip_counts,
        memory_transactions=req.memory_transactions,
        segment_bytes=dev.segment_bytes,
        warp_size=dev.warp_size,
    )
    published = [
        Superstep(
            start=first - 1,
            end=last - 1,
            comp_cycles=comp,
            comm_cycles=comm,
            ovh_cycles=ovh,
            iterations=1 if case["id"] == "knn-940mx" else its,
        )
        for first, last, comp, comm, ovh, its in case["published"]["level1"]
    ]
    w = warps_per_scheduler(n_t, dev)
    launch = LaunchShape(
        n_b=req.grid[0] * req.grid[1] * req.grid[2],
        n_t=n_t,
        registers_per_thread=case["registers_per_thread"],
        shared_bytes_per_block=case["shared_bytes_per_block"],
    )
    return estimate_kernel(table.costs, published, w, launch, dev)


def test_sums_of_eq_10_to_12_and_5(case: dict[str, Any]) -> None:
    est = _estimate(case)
    pub = case["published"]
    assert est.parallel_comp == pub["parallel_comp"]
    assert est.block_bar_ovh == pub["block_bar_ovh"]
    assert est.block_comm == pub["block_comm"]
    assert est.block_comm_delta == pub["block_comm_delta"]
    assert est.COMP == pub["COMP"]
    assert est.comp == pub["comp"]


def test_overlap_eq_15_to_17(case: dict[str, Any]) -> None:
    """warps_need within one scheduler's step (l_c differs by 2 for Hotspot), nonoverlapped
    within rounding."""
    est = _estimate(case)
    pub = case["published"]
    assert abs(est.warps_need - pub["warps_need"]) <= 4 * 2
    assert est.nonoverlapped == pytest.approx(pub["nonoverlapped"], abs=2)
    assert est.novlp == pytest.approx(pub["novlp"], abs=2)


def test_block_exec_cycle_eq_4(case: dict[str, Any]) -> None:
    est = _estimate(case)
    pub = case["published"]
    expected = pub["block_exec_cycle"]
    if case["id"] == "mm-940mx":
        # §7 prints 382 + 4600 + 26627 + 6110 = 37719 although eq. (5) gave COMP = 26487.
        expected = 382 + 4600 + 26487 + 6110
    assert est.block_exec_cycle == pytest.approx(expected, abs=2)


def test_occupancy_and_tau_eq_21_to_23(case: dict[str, Any]) -> None:
    est = _estimate(case)
    pub = case["published"]
    assert (est.rho, est.tau) == (pub["rho"], pub["tau"])
    assert est.K == pytest.approx(pub["K"], rel=1e-3)


def test_kernel_exec_cycle_eq_24(case: dict[str, Any]) -> None:
    est = _estimate(case)
    assert est.equation == "24"
    assert est.kernel_exec_cycle == pytest.approx(case["published"]["kernel_exec_cycle"], rel=2e-3)


def _device(**kw: Any) -> ManyBspDevice:
    base: dict[str, Any] = {
        "warp_size": 32,
        "n_sm": 4,
        "n_ws": 4,
        "n_du": 8,
        "issue_cycle": 1,
        "mem_lat_cycles": 313,
        "warp_launch_overhead_cycles": 10,
        "block_launch_overhead_cycles": 382,
        "max_threads_per_sm": 2048,
        "registers_per_sm": 65536,
        "shared_memory_per_sm_bytes": 49152,
        "mu": 1.93,
    }
    base.update(kw)
    return ManyBspDevice(**base)


@pytest.mark.parametrize(
    ("n_t", "regs", "shared", "expected"),
    [
        (256, 34, 3072, 7),  # §2: registers limit, floor(65536 / (256 x 34)) = 7
        (1024, 22, 2048, 2),  # §4: threads limit, 2048 / 1024
        (256, 9, 0, 8),  # §3: no shared memory: that resource sets no limit
        (1024, 0, 49152, 1),  # shared memory limit
        (1024, 64, 0, 1),  # max{1, ...}: a block that needs more than an SM still counts 1
    ],
)
def test_rho_eq_21_brute_force(n_t: int, regs: int, shared: int, expected: int) -> None:
    dev = _device()
    rho = occupancy_rho(LaunchShape(10, n_t, regs, shared), dev)
    # brute force: the largest count of blocks whose threads/registers/shared memory fit
    fits = [
        k
        for k in range(1, 64)
        if k * n_t <= 2048 and k * n_t * regs <= 65536 and k * shared <= 49152
    ]
    assert rho == max(fits, default=1) == expected
