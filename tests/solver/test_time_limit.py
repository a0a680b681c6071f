"""A solve cut short keeps the best configuration found and says it is not proven."""

from __future__ import annotations

import itertools

import pytest
import z3

from perfmodel.gemm_ws import GemmShape
from solver import SearchSpace, SolverTimeout, TilingProblem, optimize_tiling
from solver.lexicographic import Objective, lexicographic_optimum
from tests.gemm_ws_cases import A6000


def test_deadline_after_first_model_returns_it_unproven() -> None:
    x = z3.Int("x")
    solver = z3.Solver()
    solver.add(x >= 3, x <= 1000)
    # The clock reads 0 for the first check only, then is past the deadline.
    readings = itertools.chain([0.0], itertools.repeat(10.0))
    result = lexicographic_optimum(
        solver, [Objective(x, minimize=True)], deadline=1.0, clock=lambda: next(readings)
    )
    assert result.model is not None and not result.proven
    assert 3 <= result.model.eval(x).as_long() <= 1000
    assert result.checks == 1


def test_lexicographic_optimum_is_proven_when_time_allows() -> None:
    x, y = z3.Ints("x y")
    solver = z3.Solver()
    solver.add(x + y >= 10, x >= 0, y >= 0, x <= 7)
    result = lexicographic_optimum(
        solver,
        [Objective(x + y, minimize=True), Objective(x, minimize=False)],
        deadline=float("inf"),
    )
    assert result.proven and result.model is not None
    assert (result.model.eval(x).as_long(), result.model.eval(y).as_long()) == (7, 3)
    # The solver is left as it was found: x + y may be anything again.
    solver.add(x + y == 50)
    assert solver.check() == z3.sat


def test_no_time_at_all_raises_solver_timeout_or_reports_timeout() -> None:
    values = tuple(range(16, 257, 16))
    space = SearchSpace(values, values, values, tuple(range(1, 17)), False)
    try:
        result = optimize_tiling(
            TilingProblem(GemmShape(16384, 16384, 16384), A6000, space), time_limit_s=1e-6
        )
    except SolverTimeout as exc:
        assert "time limit" in str(exc)
    else:
        assert result.status == "timeout"


def test_arguments_are_checked() -> None:
    problem = TilingProblem(GemmShape(64, 64, 64), A6000, SearchSpace())
    with pytest.raises(ValueError, match="top_k"):
        optimize_tiling(problem, top_k=0)
    with pytest.raises(ValueError, match="time_limit_s"):
        optimize_tiling(problem, time_limit_s=0)
