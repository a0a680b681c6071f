"""A solve cut short keeps the best configuration found and says it is not proven."""

from __future__ import annotations

import itertools
import time

import pytest
import z3

from perfmodel.gemm_ws import GemmShape
from solver import SearchSpace, SolverMode, SolverTimeout, TilingProblem, optimize_tiling
from solver.lexicographic import Objective, lexicographic_optimum
from tests.gemm_ws_cases import A6000, ISSUE_19_SPACE


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


def test_expired_solve_answers_with_the_presolve_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """Z3 gets no time at all: the answer is the best simulated configurations, unproven."""
    import solver.lexicographic as lexicographic_module
    from solver.lexicographic import LexResult
    from tests.gemm_ws_cases import brute_force_ranking

    monkeypatch.setattr(
        lexicographic_module,
        "lexicographic_optimum",
        lambda *args, **kwargs: LexResult(None, False, 1),
    )
    shape = GemmShape(2048, 1024, 4096)
    space = SearchSpace()
    result = optimize_tiling(TilingProblem(shape, A6000, space), top_k=3, mode=SolverMode.Z3_SEARCH)
    assert result.status == "timeout"
    assert 1 <= len(result.candidates) <= 3
    times = [(c.overall_time_ns, c.total_math_wait_ns) for c in result.candidates]
    assert times == sorted(times)
    # Best effort, but every entry is a real feasible candidate with its simulated time, and
    # the presolve samples the most promising triples: the first is within 5% of the optimum.
    optimum = brute_force_ranking(shape, A6000, space)[0]
    assert result.best.overall_time_ns <= optimum.overall_time_ns * 1.05
    assert all(c.tiling.shared_memory_bytes(2) <= 101376 for c in result.candidates)


def test_certificate_out_of_time_answers_the_scorers_exact_ranking_unproven(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import solver.per_configuration as solve_module
    from tests.gemm_ws_cases import brute_force_ranking

    real = solve_module.certify

    def no_time(*args: object, **kwargs: object) -> solve_module.Certificate:
        kwargs["deadline"] = 0.0
        return real(*args[:3], **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(solve_module, "certify", no_time)
    shape = GemmShape(2048, 1024, 4096)
    result = optimize_tiling(TilingProblem(shape, A6000, SearchSpace()), top_k=3)
    assert result.status == "timeout"
    assert [c.outcome for c in result.statistics.certificate] == ["unknown"]
    expected = brute_force_ranking(shape, A6000, SearchSpace())[:3]
    assert [c.tiling for c in result.candidates] == [e.tiling for e in expected]


def test_a_huge_space_past_its_time_answers_the_best_scored_so_far() -> None:
    """The issue's space (tile_m and tile_n 1..332, depth 1..8, 881,792 configurations) with
    far too little time: the scorer's first chunks are the answer, not an exception."""
    space = ISSUE_19_SPACE
    problem = TilingProblem(GemmShape(8192, 8192, 8192), A6000, space)
    started = time.perf_counter()
    result = optimize_tiling(problem, top_k=5, time_limit_s=0.05)
    elapsed = time.perf_counter() - started
    assert result.status == "timeout"
    assert len(result.candidates) == 5
    assert 0 < result.statistics.configurations_scored < space.size
    times = [(c.overall_time_ns, c.total_math_wait_ns) for c in result.candidates]
    assert times == sorted(times)
    assert elapsed < 2.0  # one chunk past the limit at most, never the whole space


@pytest.mark.slow
def test_the_huge_space_is_certified_within_seconds() -> None:
    space = ISSUE_19_SPACE
    problem = TilingProblem(GemmShape(8192, 8192, 8192), A6000, space)
    result = optimize_tiling(problem, top_k=5, time_limit_s=20)
    assert result.status == "optimal"
    assert result.statistics.configurations_scored == result.summary.feasible
