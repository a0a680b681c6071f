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
