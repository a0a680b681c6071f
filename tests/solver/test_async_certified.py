"""The certified optimizer under the async-copy model (solver/per_configuration.py): the
scorer's ranking with one Z3 certificate equals an independent brute force (every configuration
simulated stage by stage by perfmodel.pipelines.async_copy.recurrences.simulate_async) and the
pure Z3 search; a wrong incumbent is caught by the certificate."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

import solver.per_configuration as per_configuration
import solver.problem
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.gemm_ws_scoring import Configurations
from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation, simulate_async
from solver import InfeasibleSearchSpace, SearchSpace, SolverMode, TilingProblem, optimize_tiling
from solver.candidates import rank_candidates
from solver.errors import CertificateMismatch
from tests.gemm_ws_cases import (
    async_copy_candidates,
    async_copy_problem,
    brute_force_order,
    limits_of,
)

#: certified vs brute force: thousands of instances (~20 ms each on an idle core)
CERTIFIED_INSTANCES = 2000
#: all three (certified, brute force, pure Z3 search): bounded, the Z3 search is slower
THREE_WAY_INSTANCES = 120
TOP_K = 3


def _brute_force(problem: TilingProblem) -> list[AsyncSimulation]:
    """Every configuration that fits a CTA's and an SM's shared memory (and the SM's
    threads/registers), simulated, in the §3.2 lexicographic order with the tie-break."""
    limits = limits_of(problem)
    per_block = problem.machine.shared_memory_per_block_bytes
    if not problem.space.enforce_shared_memory:
        per_block = None
        limits = dataclasses.replace(limits, shared_memory_per_sm_bytes=None)
    sims = []
    for t in problem.space.tilings():
        smem = t.shared_memory_bytes(problem.element_bytes)
        if (per_block is not None and smem > per_block) or limits.ctas_per_sm(smem) < 1:
            continue
        sims.append(
            simulate_async(problem.shape, t, problem.machine, limits, problem.element_bytes)
        )
    return sorted(sims, key=brute_force_order)


def _instance(rng: random.Random) -> TilingProblem:
    machine = GemmWsMachine(
        sm_count=rng.choice([2, 4, 28, 84, 108]),
        t_init_us=rng.uniform(0, 3),
        t_epilogue_us=rng.uniform(0, 3),
        load_startup_latency_us=rng.choice([0.0, 0.3, 0.77, 2.0, 8.0]),
        compute_startup_latency_us=rng.choice([0.0, 0.05]),
        load_throughput_elements_per_us=rng.uniform(50, 5000),
        compute_throughput_macs_per_us=rng.uniform(5000, 500_000),
        shared_memory_per_block_bytes=rng.choice([None, 16384, 49152, 101376]),
    )
    tiles = tuple(sorted(rng.sample([16, 32, 48, 64, 128], rng.randint(1, 3))))
    tiles_k = tuple(sorted(rng.sample([8, 16, 32, 64], rng.randint(1, 3))))
    first = rng.randint(1, 4)
    depths = tuple(range(first, first + rng.randint(1, 5)))
    space = SearchSpace(tiles, tiles, tiles_k, depths, enforce_shared_memory=rng.random() < 0.85)
    threads = rng.choice([None, None, 128, 256, 512])
    limits = SmLimits(
        max_blocks_per_sm=rng.choice([1, 2, 3, 16, 32]),
        shared_memory_per_sm_bytes=rng.choice([None, 32768, 65536, 102400, 233472]),
        registers_per_sm=65536,
        max_threads_per_sm=rng.choice([1024, 1536, 2048]),
        threads_per_cta=threads,
        registers_per_thread=rng.choice([None, 32, 64, 128]) if threads else None,
    )
    grid = range(16, 1025, 16)
    shape = GemmShape(rng.choice(grid), rng.choice(grid), rng.choice([*grid, 4096]))
    return async_copy_problem(shape, machine, space, limits, rng.choice([1, 2, 4]))


def _key(sims: tuple[AsyncSimulation, ...] | list[AsyncSimulation]) -> list[tuple[object, ...]]:
    return [(s.tiling, s.overall_time_ns, s.total_math_wait_ns, s.ctas_per_sm) for s in sims]


def test_certified_equals_brute_force_on_thousands() -> None:
    rng = random.Random(1917)
    failures, solved, infeasible = [], 0, 0
    for _ in range(CERTIFIED_INSTANCES):
        problem = _instance(rng)
        expected = _brute_force(problem)
        if not expected:
            with pytest.raises(InfeasibleSearchSpace):
                optimize_tiling(problem, top_k=TOP_K, time_limit_s=30)
            infeasible += 1
            continue
        result = optimize_tiling(problem, top_k=TOP_K, time_limit_s=30)
        solved += 1
        checks = [c.outcome for c in result.statistics.certificate]
        if (
            result.status != "optimal"
            or checks != ["unsat"]
            or _key(result.candidates) != _key(expected[:TOP_K])
            or result.summary.feasible != len(expected)
        ):
            failures.append((problem, result.status, _key(result.candidates), _key(expected)))
    assert failures == []
    assert solved > CERTIFIED_INSTANCES * 0.8 and infeasible > 0


@pytest.mark.slow
def test_certified_equals_brute_force_and_z3_search() -> None:
    rng = random.Random(2026)
    failures, solved = [], 0
    while solved < THREE_WAY_INSTANCES:
        problem = _instance(rng)
        expected = _brute_force(problem)
        if not expected:
            continue
        solved += 1
        certified = optimize_tiling(problem, top_k=TOP_K, time_limit_s=30)
        searched = optimize_tiling(problem, top_k=TOP_K, time_limit_s=30, mode=SolverMode.Z3_SEARCH)
        want = _key(expected[:TOP_K])
        if not (
            certified.status == searched.status == "optimal"
            and _key(certified.candidates) == _key(searched.candidates) == want
            and searched.statistics.mode is SolverMode.Z3_SEARCH
            and certified.statistics.mode is SolverMode.CERTIFIED
        ):
            failures.append((problem, _key(certified.candidates), _key(searched.candidates), want))
    assert failures == []


def _second_best_strictly_slower(
    rng: random.Random,
) -> tuple[TilingProblem, list[AsyncSimulation]]:
    while True:
        problem = _instance(rng)
        expected = _brute_force(problem)
        if len(expected) >= 2 and expected[1].overall_time_ns > expected[0].overall_time_ns:
            return problem, expected


def test_a_wrong_incumbent_is_refuted_by_the_certificate() -> None:
    """Seeded error: hand the certificate the true second best (or a random non-optimal
    configuration) as the incumbent; Z3 must answer "sat" with a configuration that really is
    better (by the brute force), never "unsat"."""
    rng = random.Random(7)
    for _ in range(60):
        problem, expected = _second_best_strictly_slower(rng)
        wrong = rng.choice(expected[1:])
        instance = per_configuration.Instance(problem.model, problem)
        everything = Configurations.of_tilings([s.tiling for s in expected])
        certificate = per_configuration.certify(
            instance, wrong, everything, time.perf_counter() + 30
        )
        assert [c.outcome for c in certificate.checks] == ["sat"]
        assert certificate.better is not None
        better = next(s for s in expected if s.tiling == certificate.better)
        assert brute_force_order(better) < brute_force_order(wrong)
        # the true optimum is certified
        right = per_configuration.certify(
            instance, expected[0], everything, time.perf_counter() + 30
        )
        assert [c.outcome for c in right.checks] == ["unsat"] and right.better is None


def _reverse_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed a scorer bug: the ranking keeps the *worst* configurations (simulated faithfully,
    so only the certificate can notice that a better one exists)."""
    original = per_configuration.lexicographic_order
    monkeypatch.setattr(
        per_configuration, "lexicographic_order", lambda t, w, c: original(t, w, c)[::-1]
    )


def test_a_seeded_scorer_bug_fails_loudly_in_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    problem, _ = _second_best_strictly_slower(random.Random(11))
    _reverse_scorer(monkeypatch)
    assert solver.problem.STRICT_CERTIFICATE  # tests/conftest.py
    with pytest.raises(CertificateMismatch, match="better than the scorer's incumbent"):
        optimize_tiling(problem, top_k=TOP_K, time_limit_s=30)


def test_a_seeded_scorer_bug_is_answered_from_z3_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem, expected = _second_best_strictly_slower(random.Random(12))
    _reverse_scorer(monkeypatch)
    monkeypatch.setattr(solver.problem, "STRICT_CERTIFICATE", False)
    result = optimize_tiling(problem, top_k=TOP_K, time_limit_s=30)
    assert result.statistics.certificate_mismatches == 1
    assert [c.outcome for c in result.statistics.certificate] == ["sat"]
    assert result.status == "optimal"
    assert _key(result.candidates) == _key(expected[:TOP_K])


def test_candidate_lists_equal_brute_force_both_modes() -> None:
    """Random candidate lists (repeats included): the ranking is the brute force's order of
    the feasible distinct entries, rejected entries named per constraint."""
    rng = random.Random(18)
    for index in range(150):
        problem = _instance(rng)
        tilings = tuple(
            rng.choice(list(problem.space.tilings())) for _ in range(rng.randint(1, 12))
        )
        listed = async_copy_candidates(problem, tilings)
        space_of_list = dataclasses.replace(problem, space=problem.space)
        feasible = {s.tiling: s for s in _brute_force(space_of_list) if s.tiling in set(tilings)}
        expected = sorted(feasible.values(), key=brute_force_order)
        modes = [SolverMode.CERTIFIED] + ([SolverMode.Z3_SEARCH] if index < 40 else [])
        for mode in modes:
            if not expected:
                with pytest.raises(InfeasibleSearchSpace):
                    rank_candidates(listed, mode=mode)
                continue
            ranking = rank_candidates(listed, mode=mode)
            assert ranking.result.status == "optimal"
            assert _key(ranking.result.candidates) == _key(expected)
            rejected = {r.input_index for r in ranking.infeasible}
            assert rejected == {i for i, t in enumerate(tilings) if t not in feasible}
            assert sum(len(v) for v in ranking.members.values()) + len(rejected) == len(tilings)


def test_certified_depth_hides_latency() -> None:
    # Long latency, fast copies and MATH: latency-bound at depth 2, so the optimum is deeper
    # (the paper model would tie every depth >= 2).
    machine = GemmWsMachine(1, 0.0, 0.0, 5.0, 0.0, 10_000, 1_000_000)
    space = SearchSpace((64,), (64,), (32,), tuple(range(2, 9)))
    problem = async_copy_problem(GemmShape(64, 64, 4096), machine, space, SmLimits(1, 233472))
    result = optimize_tiling(problem, top_k=1)
    assert result.status == "optimal"
    assert result.best.tiling == Tiling(64, 64, 32, 8)
    assert result.best.bound.value == "latency"
