"""Acceptance 1: the six worked examples (Hotspot, KNN, MM on GTX 760 and 940MX), PTX rebuilt
from Tables 2-1..7-1, launched as each section says; oracle = the published tables.

Cases where the paper's own tables contradict each other so that no single reading of the
model reproduces both are marked ``xfail(strict=True)`` with the contradiction named; they
are listed in docs/model-notes.md ("Many-BSP") and must start passing (XPASS fails the run)
if the model is changed to reproduce them.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfmodel.manybsp import PredictResult
from tests.perfmodel.manybsp.conftest import CASES, paper_result

# (case id, level-1 superstep number) whose published comp the rules cannot reproduce.
_COMP_CONTRADICTIONS = {
    ("knn-gtx-760", 1): "Tables 3-2 and 6-2 treat the same rows 11-12 (same u = 12, printed "
    "d = 0, sync 2) differently: row 12 hides its latency on the GTX 760 ('2') and shows it "
    "on the 940MX ('6+1'), and Table 3-2 itself exposes row 9 after the identical row 8; "
    "exposing row 12 costs 113 vs 98",
    ("mm-940mx", 3): "Table 7-2 charges cvta (row 152) 8 cycles, 32/T_i = 1, although its "
    "own 32/T column, rows 14-15 ('32') and Table 1-6 (T_i = 8) give 32/T_i = 4: with w = 8 "
    "the superstep is >= 216 (ours 224) vs 192",
}
_KERNEL_CONTRADICTIONS: dict[str, str] = {}


def _level1_params() -> list[Any]:
    out = []
    for c in CASES:
        for k in range(1, len(c["published"]["level1"]) + 1):
            reason = _COMP_CONTRADICTIONS.get((c["id"], k))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(c, k, id=f"{c['id']}-sstep{k}", marks=marks))
    return out


def _kernel_params() -> list[Any]:
    out = []
    for c in CASES:
        reason = _KERNEL_CONTRADICTIONS.get(c["id"])
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(c, id=c["id"], marks=marks))
    return out


def _inst_line(result: PredictResult, inst_no: int) -> int:
    """Line of the paper's Inst# ``inst_no`` (the listing numbers modelled instructions)."""
    return result.costs[inst_no - 1].line


@pytest.mark.parametrize("case", _kernel_params())
def test_predicted_cycles_within_5_percent(case: dict[str, Any]) -> None:
    result = paper_result(case)
    published = case["published"]["kernel_exec_cycle"]
    assert result.estimate.kernel_exec_cycle == pytest.approx(published, rel=0.05)


@pytest.mark.parametrize(("case", "k"), _level1_params())
def test_level1_comp_within_10_percent(case: dict[str, Any], k: int) -> None:
    result = paper_result(case)
    first, last, comp, _comm, _ovh, _its = case["published"]["level1"][k - 1]
    step = result.level1[k - 1]
    bounds = (result.line_of(step.start), result.line_of(step.end))
    assert bounds == (_inst_line(result, first), _inst_line(result, last))
    assert step.comp_cycles == pytest.approx(comp, rel=0.10)


def test_level1_structure_comm_ovh_and_iterations(case: dict[str, Any]) -> None:
    """Boundaries, comm (w x n_ma x mem_lat), ovh (bar.sync by block size) and iterations are
    exactly the published ones, except the KNN 940MX iteration the paper's sums ignore."""
    result = paper_result(case)
    published = case["published"]["level1"]
    assert len(result.level1) == len(published)
    for step, (first, last, _comp, comm, ovh, its) in zip(result.level1, published, strict=True):
        assert result.line_of(step.start) == _inst_line(result, first)
        assert result.line_of(step.end) == _inst_line(result, last)
        assert step.comm_cycles == comm
        assert step.ovh_cycles == ovh
        if case["id"] == "knn-940mx":
            its = 1  # Table 6-3 prints 2; eq. (10)-(12) of §6 count it once
        assert step.iterations == its


def test_dynamic_instruction_counts(case: dict[str, Any]) -> None:
    """l_m and l_b as the parameter blocks give them; l within the 2 the Hotspot block adds."""
    est = paper_result(case).estimate
    pub = case["published"]
    assert (est.l_m, est.l_b) == (pub["l_m"], pub["l_b"])
    assert abs(est.l - pub["l"]) <= 2


def test_rho_and_mu_match_published(case: dict[str, Any]) -> None:
    est = paper_result(case).estimate
    assert est.rho == case["published"]["rho"]
    assert est.mu == case["published"]["mu"]
    assert est.K == pytest.approx(case["published"]["K"], rel=1e-3)
