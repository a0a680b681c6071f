"""The certified path (exact scorer + one Z3 certificate) against independent oracles: the
stage-by-stage brute force over the whole space, and the pure Z3 search."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest

import solver.problem
from perfmodel import gemm_ws_scoring as scoring
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Simulation, WaveTimeModel
from perfmodel.gemm_ws_scoring import Configurations, Scores
from solver import InfeasibleSearchSpace, SearchSpace, TilingProblem, optimize_tiling
from solver.errors import CertificateMismatch
from solver.per_configuration import Instance, certify
from solver.problem import SolverMode
from tests.gemm_ws_cases import A6000, TABLE_1, TABLE_1_SPACE, brute_force_ranking

_TILES = (8, 16, 24, 32, 48, 64, 96, 128, 256)


def _random_case(rng: random.Random) -> tuple[TilingProblem, int]:
    """A random problem, machine and small space: depth 1 included, shared-memory limits
    that bind, both wave models, half-nanosecond-prone figures."""
    machine = GemmWsMachine(
        sm_count=rng.choice([1, 7, 84, 132]),
        t_init_us=rng.choice([0.0, 1.68, rng.uniform(0, 5)]),
        t_epilogue_us=rng.choice([0.0, 1.543, rng.uniform(0, 5)]),
        load_startup_latency_us=rng.choice([0.0, 0.77, rng.uniform(0, 2)]),
        compute_startup_latency_us=rng.choice([0.0, rng.uniform(0, 2)]),
        load_throughput_elements_per_us=rng.choice([152.96, 2000.0, rng.uniform(10, 1e5)]),
        compute_throughput_macs_per_us=rng.choice([24610.0, 2000.0, rng.uniform(1e3, 1e6)]),
        shared_memory_per_block_bytes=rng.choice([None, 16384, 49152, 101376]),
    )
    space = SearchSpace(
        tile_m=tuple(rng.sample(_TILES, rng.randint(1, 3))),
        tile_n=tuple(rng.sample(_TILES, rng.randint(1, 3))),
        tile_k=tuple(rng.sample(_TILES, rng.randint(1, 3))),
        buffer_depth=tuple(rng.sample(range(1, 7), rng.randint(1, 3))),
        enforce_shared_memory=rng.random() < 0.7,
    )
    shape = GemmShape(rng.randint(1, 2048), rng.randint(1, 2048), rng.randint(1, 1024))
    wave_model = rng.choice(list(WaveTimeModel))
    problem = TilingProblem(shape, machine, space, rng.choice([1, 2, 4]), wave_model)
    return problem, rng.choice([1, 1, 3, 5])


def _key(sim: Simulation) -> tuple[object, int, int]:
    return sim.tiling, sim.overall_time_ns, sim.total_math_wait_ns


def _brute_force(problem: TilingProblem) -> list[Simulation]:
    return brute_force_ranking(
        problem.shape, problem.machine, problem.space, problem.element_bytes, problem.wave_model
    )


def test_certified_shortlist_equals_brute_force_on_thousands_of_random_problems() -> None:
    rng = random.Random(19)
    checked = infeasible = 0
    for _ in range(2500):
        problem, top_k = _random_case(rng)
        expected = _brute_force(problem)
        if not expected:
            infeasible += 1
            with pytest.raises(InfeasibleSearchSpace):
                optimize_tiling(problem, top_k=top_k, time_limit_s=30)
            continue
        result = optimize_tiling(problem, top_k=top_k, time_limit_s=30)
        assert result.status == "optimal", problem
        assert result.statistics.mode is SolverMode.CERTIFIED
        assert [c.outcome for c in result.statistics.certificate] == ["unsat"]
        assert [_key(s) for s in result.candidates] == [_key(s) for s in expected[:top_k]]
        assert result.summary.feasible == len(expected)
        checked += 1
    assert checked > 2000 and infeasible > 0


def test_certified_optimum_equals_the_pure_z3_search() -> None:
    rng = random.Random(20)
    for _ in range(250):
        problem, top_k = _random_case(rng)
        if not _brute_force(problem):
            continue
        certified = optimize_tiling(problem, top_k=top_k, time_limit_s=30)
        searched = optimize_tiling(problem, top_k=top_k, time_limit_s=30, mode=SolverMode.Z3_SEARCH)
        assert searched.status == "optimal" and searched.statistics.mode is SolverMode.Z3_SEARCH
        assert [_key(s) for s in certified.candidates] == [_key(s) for s in searched.candidates]


@pytest.mark.parametrize(("problem", "tiling"), TABLE_1)
def test_table_1_is_certified(problem: tuple[int, int, int], tiling: tuple[int, int, int]) -> None:
    result = optimize_tiling(TilingProblem(GemmShape(*problem), A6000, TABLE_1_SPACE), top_k=1)
    best = result.best.tiling
    assert result.status == "optimal" and (best.tile_m, best.tile_n, best.tile_k) == tiling


@pytest.mark.parametrize("rank", [1, 2, 5, 40])
def test_a_wrong_incumbent_is_refuted_by_the_certificate(rank: int) -> None:
    """Any configuration but the true optimum, handed to Z3 as the incumbent, is beaten."""
    problem = TilingProblem(GemmShape(1024, 512, 1024), A6000, TABLE_1_SPACE)
    ranking = _brute_force(problem)
    configs = Configurations.of_tilings([s.tiling for s in ranking])
    instance = Instance(problem.model, problem)
    certificate = certify(instance, ranking[rank - 1], configs, time.perf_counter() + 30)
    if rank == 1:
        assert certificate.better is None
        assert [c.outcome for c in certificate.checks] == ["unsat"]
    else:
        assert certificate.better is not None
        assert [c.outcome for c in certificate.checks] == ["sat"]
        # what Z3 found beats the incumbent in the optimizer's order
        index = [s.tiling for s in ranking].index(certificate.better)
        assert index < rank - 1


def _wrong_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scorer that ranks the true optimum last (its times made huge, consistently with
    nothing): the simulator check is bypassed by lying in both places the ranking is read."""
    real = scoring.score_configurations

    def wrong(*args: object, **kwargs: object) -> Scores:
        scores = real(*args, **kwargs)  # type: ignore[arg-type]
        best = int(np.argmin(scores.overall_time_ns[0]))
        time_ns = scores.overall_time_ns.copy()
        time_ns[:, best] = np.iinfo(np.int64).max // 4
        return Scores(time_ns, scores.total_math_wait_ns)

    monkeypatch.setattr(scoring, "score_configurations", wrong)


def test_a_scorer_bug_fails_loudly_in_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    _wrong_scorer(monkeypatch)
    problem = TilingProblem(GemmShape(1024, 1024, 1024), A6000, TABLE_1_SPACE)
    with pytest.raises(CertificateMismatch, match="better than the scorer's incumbent"):
        optimize_tiling(problem, top_k=1)


def test_a_scorer_bug_is_answered_from_z3_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    _wrong_scorer(monkeypatch)
    monkeypatch.setattr(solver.problem, "STRICT_CERTIFICATE", False)
    problem = TilingProblem(GemmShape(1024, 1024, 1024), A6000, TABLE_1_SPACE)
    result = optimize_tiling(problem, top_k=3)
    assert result.statistics.certificate_mismatches == 1
    assert [c.outcome for c in result.statistics.certificate] == ["sat"]
    assert result.status == "optimal"
    assert [_key(s) for s in result.candidates] == [_key(s) for s in _brute_force(problem)[:3]]


def test_a_scorer_that_disagrees_with_the_simulator_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Times too small by 1 ns: no Z3 check could see it (nothing beats a fictitious time),
    the stage-by-stage re-simulation of the ranked configurations does."""
    real = scoring.score_configurations

    def low(*args: object, **kwargs: object) -> Scores:
        scores = real(*args, **kwargs)  # type: ignore[arg-type]
        return Scores(scores.overall_time_ns - 1, scores.total_math_wait_ns)

    monkeypatch.setattr(scoring, "score_configurations", low)
    problem = TilingProblem(GemmShape(512, 512, 512), A6000, TABLE_1_SPACE)
    with pytest.raises(CertificateMismatch, match="the simulator"):
        optimize_tiling(problem, top_k=1)


def test_times_beyond_int64_fall_back_to_the_z3_search() -> None:
    slow = dataclasses.replace(
        A6000,
        load_throughput_elements_per_us=1e-6,
        compute_throughput_macs_per_us=1e-6,
        shared_memory_per_block_bytes=None,
    )
    space = SearchSpace((4096, 8192), (4096,), (4096,), (2,), enforce_shared_memory=False)
    problem = TilingProblem(GemmShape(1 << 20, 1 << 20, 1 << 20), slow, space)
    result = optimize_tiling(problem)
    assert result.statistics.mode is SolverMode.Z3_SEARCH
    assert _key(result.best) == _key(_brute_force(problem)[0])
