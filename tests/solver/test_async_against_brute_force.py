"""Async-copy variant: the Z3 optimum and ranked shortlist equal an independent brute-force
enumeration of the space with the stage-by-stage simulator (the variant's acceptance)."""

from __future__ import annotations

import random

import pytest

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation, simulate_async
from solver import InfeasibleSearchSpace, SearchSpace, SolverMode, TilingProblem, optimize_tiling
from tests.gemm_ws_cases import (
    async_copy_problem,
    brute_force_order,
    limits_of,
)

#: the pure Z3 search pays ~3 checks per rank: a bounded count keeps the suite fast (the
#: certified path, the default, is checked on thousands: tests/solver/test_async_certified.py)
INSTANCES = 150
Z3 = SolverMode.Z3_SEARCH


def _brute_force(problem: TilingProblem) -> list[AsyncSimulation]:
    """Every feasible configuration, simulated, in the §3.2 lexicographic order with the
    documented tie-break (larger tile_m, tile_n, tile_k, then smaller depth)."""
    sims = []
    per_block = problem.machine.shared_memory_per_block_bytes
    for t in problem.space.tilings():
        smem = t.shared_memory_bytes(problem.element_bytes)
        if per_block is not None and smem > per_block:
            continue
        if limits_of(problem).ctas_per_sm(smem) < 1:
            continue
        sims.append(
            simulate_async(
                problem.shape, t, problem.machine, limits_of(problem), problem.element_bytes
            )
        )
    return sorted(sims, key=brute_force_order)


def _instance(rng: random.Random) -> TilingProblem:
    machine = GemmWsMachine(
        sm_count=rng.choice([4, 28, 84, 108]),
        t_init_us=rng.uniform(0, 3),
        t_epilogue_us=rng.uniform(0, 3),
        load_startup_latency_us=rng.choice([0.0, 0.3, 0.77, 2.0, 8.0]),
        compute_startup_latency_us=rng.choice([0.0, 0.05]),
        load_throughput_elements_per_us=rng.uniform(50, 3000),
        compute_throughput_macs_per_us=rng.uniform(5000, 200_000),
        shared_memory_per_block_bytes=rng.choice([None, 49152, 101376]),
    )
    tiles = tuple(sorted(rng.sample([16, 32, 64, 128], 3)))
    space = SearchSpace(tiles, tiles, tiles, tuple(range(1, rng.randint(3, 7))))
    limits = SmLimits(rng.choice([1, 2, 16, 32]), rng.choice([65536, 102400, 233472]))
    grid = range(32, 2049, 32)
    shape = GemmShape(rng.choice(grid), rng.choice(grid), rng.choice(grid))
    return async_copy_problem(shape, machine, space, limits, rng.choice([2, 4]))


@pytest.mark.slow
def test_z3_optimum_and_shortlist_equal_brute_force() -> None:
    rng = random.Random(17)
    mismatches = []
    solved = 0
    for _ in range(INSTANCES):
        problem = _instance(rng)
        expected = _brute_force(problem)
        if not expected:
            with pytest.raises(InfeasibleSearchSpace):
                optimize_tiling(problem, top_k=3, time_limit_s=30, mode=Z3)
            continue
        result = optimize_tiling(problem, top_k=3, time_limit_s=30, mode=Z3)
        solved += 1
        got = [(s.tiling, s.overall_time_ns, s.total_math_wait_ns) for s in result.candidates]
        want = [(s.tiling, s.overall_time_ns, s.total_math_wait_ns) for s in expected[:3]]
        if result.status != "optimal" or got != want:
            mismatches.append((problem, result.status, got, want))
    assert mismatches == []
    assert solved > INSTANCES // 2


def test_depth_is_chosen_by_latency() -> None:
    # Long latency, fast copies and MATH: the stage is latency-bound at depth 2, so the
    # optimum uses a deeper buffer (the paper model would tie every depth >= 2).
    machine = GemmWsMachine(1, 0.0, 0.0, 5.0, 0.0, 10_000, 1_000_000)
    space = SearchSpace((64,), (64,), (32,), tuple(range(2, 9)))
    problem = async_copy_problem(GemmShape(64, 64, 4096), machine, space, SmLimits(1, 233472))
    result = optimize_tiling(problem, top_k=1)
    assert result.best.tiling == Tiling(64, 64, 32, 8)
    assert result.best.bound.value == "latency"


def test_expired_solve_answers_with_the_presolve_ranking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Z3 gets no time: the answer is the closed-form ranking of the survivors, unproven."""
    import solver.lexicographic as lexicographic_module
    from solver.lexicographic import LexResult

    monkeypatch.setattr(
        lexicographic_module,
        "lexicographic_optimum",
        lambda *args, **kwargs: LexResult(None, False, 1),
    )
    problem = _instance(random.Random(3))
    while not _brute_force(problem):
        problem = _instance(random.Random(problem.shape.m))
    result = optimize_tiling(problem, top_k=3, mode=SolverMode.Z3_SEARCH)
    assert result.status == "timeout"
    want = [s.tiling for s in _brute_force(problem)[:3]]
    assert [s.tiling for s in result.candidates] == want
