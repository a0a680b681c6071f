"""Explicit candidate lists (solver/candidates.py) against independent oracles: the
stage-by-stage simulator over exactly the listed tilings, the space path's own rejection of the
same configuration, and the pure Z3 search over the same list."""

from __future__ import annotations

import dataclasses
import random

import pytest

import solver.problem
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Simulation, Tiling, WaveTimeModel, simulate
from perfmodel.gemm_ws_scoring import enumerate_configurations
from solver import InfeasibleSearchSpace, SearchSpace, TilingProblem, optimize_tiling
from solver.candidates import (
    SHARED_MEMORY_CONSTRAINT,
    CandidateProblem,
    rank_candidates,
)
from solver.errors import CertificateMismatch
from solver.problem import SolverMode
from tests.gemm_ws_cases import A6000, TABLE_1, brute_force_order
from tests.solver.test_certified import _wrong_scorer

_TILES = (8, 16, 24, 32, 48, 64, 96, 128, 256)


def _random_case(rng: random.Random) -> tuple[CandidateProblem, int | None]:
    """A random problem and machine, and a list of 1..40 random tilings (repeats included:
    a tuner may list one tiling with several other params), shared-memory limits that bind."""
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
    distinct = [
        Tiling(rng.choice(_TILES), rng.choice(_TILES), rng.choice(_TILES), rng.randint(1, 6))
        for _ in range(rng.randint(1, 25))
    ]
    tilings = tuple(rng.choice(distinct) for _ in range(rng.randint(1, 40)))
    shape = GemmShape(rng.randint(1, 2048), rng.randint(1, 2048), rng.randint(1, 1024))
    problem = CandidateProblem(
        shape,
        machine,
        tilings,
        element_bytes=rng.choice([1, 2, 4]),
        wave_model=rng.choice(list(WaveTimeModel)),
        enforce_shared_memory=rng.random() < 0.8,
    )
    return problem, rng.choice([None, None, 1, 3])


def _key(sim: Simulation) -> tuple[object, int, int]:
    return sim.tiling, sim.overall_time_ns, sim.total_math_wait_ns


def _space_rejects(problem: CandidateProblem, tiling: Tiling) -> dict[str, int]:
    """What the search-space path counts against a space of this one configuration (the
    configurations its enumeration leaves out for the shared memory per CTA)."""
    t = tiling
    limit = problem.machine.shared_memory_per_block_bytes
    fitting = enumerate_configurations(
        (t.tile_m,),
        (t.tile_n,),
        (t.tile_k,),
        (t.buffer_depth,),
        problem.element_bytes,
        limit if problem.enforce_shared_memory else None,
    )
    return {SHARED_MEMORY_CONSTRAINT: 1 - sum(c.count for c in fitting)}


def _brute_force(problem: CandidateProblem) -> list[Simulation]:
    """Every distinct listed tiling the space path accepts, simulated stage by stage, sorted
    by the documented order."""
    feasible = {t for t in problem.tilings if not any(_space_rejects(problem, t).values())}
    sims = [simulate(problem.shape, t, problem.machine, problem.wave_model) for t in feasible]
    return sorted(sims, key=brute_force_order)


def test_ranking_equals_brute_force_and_rejections_equal_the_space_path() -> None:
    rng = random.Random(18)
    checked = all_rejected = rejected_some = 0
    for _ in range(700):
        problem, top_k = _random_case(rng)
        expected = _brute_force(problem)
        if not expected:
            all_rejected += 1
            with pytest.raises(InfeasibleSearchSpace) as refused:
                rank_candidates(problem, top_k=top_k, time_limit_s=30)
            assert refused.value.field == "candidates"
            continue
        ranking = rank_candidates(problem, top_k=top_k, time_limit_s=30)
        result = ranking.result
        assert result.status == "optimal", problem
        assert [c.outcome for c in result.statistics.certificate] == ["unsat"]
        wanted = expected if top_k is None else expected[:top_k]
        assert [_key(s) for s in result.candidates] == [_key(s) for s in wanted]
        # every rank's reported quantities are the simulator's (rank 1 keeps its events)
        for got, sim in zip(result.candidates, wanted, strict=True):
            assert dataclasses.replace(got, events=()) == dataclasses.replace(sim, events=())
        assert result.best.events == wanted[0].events
        # every entry is either ranked (with its group) or rejected, by the space path's rule
        rejected = {r.input_index: r for r in ranking.infeasible}
        for index, tiling in enumerate(problem.tilings):
            counts = _space_rejects(problem, tiling)
            if index in rejected:
                assert counts == {rejected[index].constraint: 1}
                assert rejected[index].constraint == SHARED_MEMORY_CONSTRAINT
            else:
                assert counts == {SHARED_MEMORY_CONSTRAINT: 0}
                assert index in ranking.members[tiling]
        grouped = sorted(i for members in ranking.members.values() for i in members)
        assert sorted([*grouped, *rejected]) == list(range(len(problem.tilings)))
        assert result.summary.candidates_considered == len(problem.tilings)
        assert result.summary.rejected == {SHARED_MEMORY_CONSTRAINT: len(rejected)}
        rejected_some += bool(rejected)
        checked += 1
    assert checked > 400 and all_rejected > 0 and rejected_some > 50


def test_certified_ranking_equals_the_pure_z3_search() -> None:
    rng = random.Random(81)
    compared = 0
    for _ in range(120):
        problem, top_k = _random_case(rng)
        if not _brute_force(problem):
            continue
        top_k = min(top_k or 3, 3)  # z3-search pays a solve per rank
        certified = rank_candidates(problem, top_k=top_k, time_limit_s=30)
        searched = rank_candidates(problem, top_k=top_k, time_limit_s=30, mode=SolverMode.Z3_SEARCH)
        assert searched.result.status == "optimal"
        assert searched.result.statistics.mode is SolverMode.Z3_SEARCH
        assert [_key(s) for s in certified.result.candidates] == [
            _key(s) for s in searched.result.candidates
        ]
        compared += 1
    assert compared > 60


def test_a_list_of_a_whole_space_answers_as_the_space() -> None:
    """The candidate-set encoding restricted to every configuration is the space's."""
    for (m, n, k), _ in TABLE_1:
        space = SearchSpace((32, 64, 128), (32, 64, 128), (32, 64, 128), (2, 3, 4, 8))
        shape = GemmShape(m, n, k)
        problem = CandidateProblem(shape, A6000, tuple(space.tilings()))
        listed = rank_candidates(problem, top_k=5).result
        solved = optimize_tiling(TilingProblem(shape, A6000, space), top_k=5)
        assert [_key(s) for s in listed.candidates] == [_key(s) for s in solved.candidates]
        assert listed.summary == solved.summary


def test_only_the_listed_depths_are_candidates() -> None:
    """A deeper buffer is never slower (docs/model-notes.md): listing only a shallow one must
    not let Z3 answer with a deeper depth of the same tile triple."""
    shape = GemmShape(1024, 1024, 1024)
    listed = (Tiling(128, 128, 128, 1), Tiling(64, 64, 64, 2))
    ranking = rank_candidates(CandidateProblem(shape, A6000, listed, enforce_shared_memory=False))
    assert {s.tiling for s in ranking.result.candidates} == set(listed)
    assert [c.outcome for c in ranking.result.statistics.certificate] == ["unsat"]


_LISTED = tuple(
    Tiling(tm, tn, tk, d) for tm in (64, 128) for tn in (64, 128) for tk in (32, 64) for d in (2, 4)
)


def test_a_wrong_incumbent_fails_loudly_in_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    _wrong_scorer(monkeypatch)
    problem = CandidateProblem(GemmShape(1024, 1024, 1024), A6000, _LISTED)
    with pytest.raises(CertificateMismatch, match="better than the scorer's incumbent"):
        rank_candidates(problem, top_k=1)


def test_a_wrong_incumbent_is_answered_from_z3_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _wrong_scorer(monkeypatch)
    monkeypatch.setattr(solver.problem, "STRICT_CERTIFICATE", False)
    problem = CandidateProblem(GemmShape(1024, 1024, 1024), A6000, _LISTED)
    result = rank_candidates(problem, top_k=3).result
    assert result.statistics.certificate_mismatches == 1
    assert [c.outcome for c in result.statistics.certificate] == ["sat"]
    assert result.status == "optimal"
    assert [_key(s) for s in result.candidates] == [_key(s) for s in _brute_force(problem)[:3]]
