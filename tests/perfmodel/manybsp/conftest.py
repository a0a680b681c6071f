"""Shared fixtures: the six worked examples of many-bsp-supplementary.txt §2-§7."""

from __future__ import annotations

from typing import Any

import pytest

from device_profiles import get_profile
from perfmodel.manybsp import PredictRequest, PredictResult, device_from_profile, predict_kernel
from tests.paper_cases import CASE_IDS, CASES, PAPER_DIR

__all__ = ["CASES", "CASE_IDS", "paper_request", "paper_result"]


def paper_request(case: dict[str, Any], *, with_n_ma: bool = True) -> PredictRequest:
    return PredictRequest(
        ptx=(PAPER_DIR / case["ptx"]).read_text(),
        device=device_from_profile(get_profile(case["device"])),
        grid=tuple(case["grid"]),
        block=tuple(case["block"]),
        registers_per_thread=case["registers_per_thread"],
        shared_bytes_per_block=case["shared_bytes_per_block"],
        loop_trip_counts=case["loop_trip_counts"],
        memory_transactions=(
            {int(k): v for k, v in case["memory_transactions"].items()} if with_n_ma else {}
        ),
    )


_RESULTS: dict[tuple[str, bool], PredictResult] = {}


def paper_result(case: dict[str, Any], *, with_n_ma: bool = True) -> PredictResult:
    key = (case["id"], with_n_ma)
    if key not in _RESULTS:
        _RESULTS[key] = predict_kernel(paper_request(case, with_n_ma=with_n_ma))
    return _RESULTS[key]


@pytest.fixture(params=CASES, ids=CASE_IDS)
def case(request: pytest.FixtureRequest) -> dict[str, Any]:
    c: dict[str, Any] = request.param
    return c
