"""Table 1 of the GeMM-WS paper: the solver must return exactly the published tilings."""

from __future__ import annotations

import pytest

from perfmodel.gemm_ws import GemmShape
from solver import TilingProblem, optimize_tiling
from tests.gemm_ws_cases import A6000, TABLE_1, TABLE_1_SPACE


@pytest.mark.parametrize(("problem", "tiling"), TABLE_1, ids=[str(p) for p, _ in TABLE_1])
def test_table_1_tilings(problem: tuple[int, int, int], tiling: tuple[int, int, int]) -> None:
    result = optimize_tiling(
        TilingProblem(GemmShape(*problem), A6000, TABLE_1_SPACE), top_k=1, time_limit_s=60
    )
    assert result.status == "optimal"
    best = result.best.tiling
    assert (best.tile_m, best.tile_n, best.tile_k) == tiling
