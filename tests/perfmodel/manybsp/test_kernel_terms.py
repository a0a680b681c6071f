"""eq. (24)/(25) term by term: the addends the breakdown picture draws sum to the estimate."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from perfmodel.manybsp import predict_kernel
from perfmodel.manybsp.kernel import kernel_terms
from tests.perfmodel.manybsp.conftest import CASE_IDS, CASES, paper_request, paper_result


def _terms(case: dict[str, Any], registers: int | None = None) -> tuple[Any, Any]:
    request = paper_request(case)
    if registers is not None:
        request = dataclasses.replace(request, registers_per_thread=registers)
    result = predict_kernel(request) if registers is not None else paper_result(case)
    e, device = result.estimate, request.device.device
    terms = kernel_terms(
        block_launch_overhead_cycles=device.block_launch_overhead_cycles,
        n_b=result.n_b,
        n_sm=device.n_sm,
        comp=e.comp,
        novlp=e.novlp,
        rho=e.rho,
        K=e.K,
        tau=e.tau,
        mu=e.mu,
    )
    return e, terms


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_terms_sum_to_the_kernel_estimate(case: dict[str, Any]) -> None:
    e, terms = _terms(case)
    assert terms.equation == e.equation == "24"
    assert terms.total == e.kernel_exec_cycle
    assert terms.rounds == 0.0
    assert terms.tail == e.novlp / 2


def test_equation_25_adds_the_rounds_term() -> None:
    # 255 registers per thread: one resident block per SM, rho = 1 < tau
    e, terms = _terms(next(c for c in CASES if c["id"] == "hotspot-940mx"), registers=255)
    assert terms.equation == e.equation == "25"
    assert terms.rounds == pytest.approx((e.K - 1) * (e.tau - e.rho) / (e.tau - 1) * e.novlp)
    assert terms.total == e.kernel_exec_cycle


def test_fewer_blocks_than_slots_add_no_rounds() -> None:
    # K < 1: no round after the first, the term must not turn negative
    terms = kernel_terms(
        block_launch_overhead_cycles=10.0,
        n_b=2,
        n_sm=4,
        comp=100.0,
        novlp=300.0,
        rho=1,
        K=0.5,
        tau=4,
        mu=2.0,
    )
    assert terms.equation == "25" and terms.rounds == 0.0
    assert terms.total == 10.0 + 2 / 4 * 100.0 / 1.0 + 150.0


@pytest.mark.parametrize(("block_warps", "rho"), [(1, 2), (1, 4), (1, 8), (2, 2), (3, 4)])
def test_blocks_of_fewer_warps_than_schedulers_run_side_by_side(block_warps: int, rho: int) -> None:
    """A block of fewer warps than an SM's schedulers occupies only some of them. When every
    resident warp has a scheduler to itself (rho x block_warps <= n_ws), the SM runs its rho
    blocks side by side, each in its own comp: n_b / n_sm / rho rounds of comp, whatever the
    paper's one-scheduler overlap (1 + rho) / 2 says; with more warps than schedulers, each
    scheduler overlaps its share of them."""
    n_ws, n_sm, n_b, comp = 4, 10, 4000, 1000.0
    terms = kernel_terms(
        block_launch_overhead_cycles=0.0,
        n_b=n_b,
        n_sm=n_sm,
        comp=comp,
        novlp=0.0,
        rho=rho,
        K=n_b / (n_sm * rho),
        tau=1,
        mu=1e9,
        interleaved_warps=1,
        block_warps=block_warps,
        n_ws=n_ws,
    )
    per_scheduler = rho * block_warps / n_ws
    if per_scheduler <= 1:
        assert terms.blocks == pytest.approx(n_b / n_sm / rho * comp)
    else:
        # each scheduler holds per_scheduler warps of as many blocks, overlapped as eq. (24)
        # overlaps resident blocks: (1 + k) / 2
        side_by_side = n_ws / block_warps
        assert terms.blocks == pytest.approx(
            n_b / n_sm * comp / (side_by_side * (1 + per_scheduler) / 2)
        )
