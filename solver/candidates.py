"""Explicit candidate lists: rank exactly the tilings a tuner gives, prove the best.

An autotuner (Triton, Kernel Tuner) brings its own list of configurations rather than a product
space. The list is ranked by the same means as a space (solver/optimize.py):

* each candidate is checked against the hardware constraints the space path counts in
  ``search.rejected`` (today the circular buffer in shared memory per CTA); a rejected one is
  reported with the constraint's name and the figures compared, and is not ranked;
* the feasible ones are scored by the exact vectorised scorer (the closed form of eq. (1)-(3),
  equal to the stage-by-stage simulator) and ordered by §3.2's objectives, then the tie-break;
* in ``certified`` mode Z3 proves the scorer's best over an encoding of exactly the candidate
  set: the encoding of eq. (1)-(3) over the candidates' tile triples, each triple's buffer depth
  restricted to the depths the list gives it (one UNSAT check); ``z3-search`` ranks by blocking
  over the same encoding.

Entries equal in (tile_m, tile_n, tile_k, buffer_depth) are one configuration (a "group"): the
model cannot tell them apart, so they share a rank and a prediction.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from perfmodel.gemm_ws import (
    DurationTable,
    GemmShape,
    GemmWsMachine,
    Simulation,
    Tiling,
    WaveTimeModel,
    simulate,
    simulate_closed_form,
)
from perfmodel.pipelines.paper import PaperPipeline
from solver import problem as _problem
from solver.bounds import TripleBound, triple_bounds
from solver.deadline import Deadline
from solver.encoding import Encoding, encode, encode_text
from solver.errors import CertificateMismatch, InfeasibleSearchSpace, SolverTimeout
from solver.factory import make_solver
from solver.lexicographic import rank_by_blocking
from solver.optimize import _objectives, better_than_smtlib
from solver.problem import (
    CERTIFICATE_CLAIM,
    SHARED_MEMORY_CONSTRAINT,
    SHARED_MEMORY_PER_SM_CONSTRAINT,
    CandidateProblem,
    CandidateRanking,
    CertificateCheck,
    Rejection,
    SolverMode,
    TilingResult,
    check_arguments,
    objective_key,
    reject,
    result_of,
)
from solver.search_space import SearchSpace, SearchSummary
from solver.z3_session import CheckOutcome, session

_log = logging.getLogger(__name__)

_Triple = tuple[int, int, int]

__all__ = [
    "SHARED_MEMORY_CONSTRAINT",
    "SHARED_MEMORY_PER_SM_CONSTRAINT",
    "CandidateProblem",
    "CandidateRanking",
    "Rejection",
    "encode_listed",
    "rank_candidates",
    "reject",
]


def _depth_space(problem: CandidateProblem, tilings: Sequence[Tiling]) -> SearchSpace:
    """The buffer depths of ``tilings`` as a space of one tile triple: what encode() and
    triple_bounds() read of a space besides its triples (the depths, the shared-memory switch)."""
    first = tilings[0]
    return SearchSpace(
        tile_m=(first.tile_m,),
        tile_n=(first.tile_n,),
        tile_k=(first.tile_k,),
        buffer_depth=tuple(sorted({t.buffer_depth for t in tilings})),
        enforce_shared_memory=problem.enforce_shared_memory,
    )


def _depths_by_triple(tilings: Sequence[Tiling]) -> dict[_Triple, tuple[int, ...]]:
    depths: dict[_Triple, set[int]] = {}
    for t in tilings:
        depths.setdefault((t.tile_m, t.tile_n, t.tile_k), set()).add(t.buffer_depth)
    return {triple: tuple(sorted(d)) for triple, d in depths.items()}


def _bounds(problem: CandidateProblem, depths: dict[_Triple, tuple[int, ...]]) -> list[TripleBound]:
    """solver/bounds.py's per-triple durations and cuts, each triple with its own depths (the
    cuts hold for every depth the triple is encoded with, so they stay sound)."""
    bounds = []
    for (tm, tn, tk), triple_depths in depths.items():
        space = SearchSpace(
            (tm,), (tn,), (tk,), triple_depths, enforce_shared_memory=problem.enforce_shared_memory
        )
        bounds += triple_bounds(
            problem.shape, problem.machine, space, problem.element_bytes, problem.wave_model
        )
    return bounds


def _encode_candidates(
    problem: CandidateProblem,
    bounds: Sequence[TripleBound],
    space: SearchSpace,
    depths: dict[_Triple, tuple[int, ...]],
) -> Encoding:
    """eq. (1)-(3) over ``bounds``' triples (solver/encoding.py), each triple's buffer depth
    restricted to the candidate list's depths for it: the encoding holds exactly the listed
    configurations of those triples."""
    enc = encode(bounds, space, problem.machine, problem.wave_model)
    return dataclasses.replace(enc, smtlib=enc.smtlib + "\n" + _only_listed(bounds, depths))


def _only_listed(bounds: Sequence[TripleBound], depths: dict[_Triple, tuple[int, ...]]) -> str:
    """Each triple's buffer depth restricted to the depths the list gives it (SMT-LIB)."""
    only = []
    for b in bounds:
        allowed = " ".join(f"(= buffer_depth {d})" for d in depths[b.tile_m, b.tile_n, b.tile_k])
        triple = f"(and (= tile_m {b.tile_m}) (= tile_n {b.tile_n}) (= tile_k {b.tile_k}))"
        only.append(f"(assert (=> {triple} (or {allowed})))")
    return "\n".join(only)


def _score(problem: CandidateProblem, tilings: Sequence[Tiling]) -> list[Tiling]:
    """``tilings`` in the optimizer's order (§3.2 objectives, then the tie-break) by the exact
    vectorised scorer."""
    from perfmodel import gemm_ws_scoring as scoring  # numpy: worker side only

    configs = scoring.Configurations.of(
        [t.tile_m for t in tilings],
        [t.tile_n for t in tilings],
        [t.tile_k for t in tilings],
        [t.buffer_depth for t in tilings],
    )
    scores = scoring.score_configurations(
        problem.shape, configs, scoring.Figures.of_machine(problem.machine), problem.wave_model
    )
    order = scoring.lexicographic_order(
        scores.overall_time_ns[0], scores.total_math_wait_ns[0], configs
    )
    return [tilings[int(i)] for i in order]


def rank_candidates(
    problem: CandidateProblem,
    *,
    top_k: int | None = None,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> CandidateRanking:
    """Rank the feasible candidates (the first ``top_k`` groups; None: all) and prove the best
    among them; InfeasibleSearchSpace (field ``candidates``) when every one is rejected. The
    paper's model has its own per-triple certificate (below); every other model is ranked
    configuration by configuration (solver/per_configuration.py)."""
    check_arguments(top_k, time_limit_s)
    deadline = Deadline(time_limit_s)
    members, rejected = reject(problem)
    model = problem.model
    names = [SHARED_MEMORY_CONSTRAINT]
    if model.residency_constraint is not None:
        names.append(model.residency_constraint)
    counts = {name: sum(r.constraint == name for r in rejected) for name in names}
    if not members:
        per = " per CTA" if model.residency_constraint is None else ""
        raise InfeasibleSearchSpace(
            f"all {len(problem.tilings)} candidates need more shared memory{per} than the "
            "device allows; list smaller tiles or buffer depths",
            counts,
            field="candidates",
        )
    summary = SearchSummary(
        candidates_considered=len(problem.tilings),
        feasible=len(problem.tilings) - len(rejected),
        rejected=counts,
    )
    feasible = list(members)
    ranks = len(feasible) if top_k is None else min(top_k, len(feasible))
    if not isinstance(model, PaperPipeline):
        from solver.per_configuration import rank_listed  # numpy: worker side only

        result = rank_listed(problem, feasible, ranks, deadline, mode)
    else:
        depths = _depths_by_triple(feasible)
        space = _depth_space(problem, feasible)
        bounds = _bounds(problem, depths)
        if SolverMode(mode) is SolverMode.Z3_SEARCH:
            result = _z3_search(problem, bounds, space, depths, ranks, deadline)
        else:
            result = _certified(problem, feasible, bounds, space, depths, ranks, deadline)
    result = dataclasses.replace(result, summary=summary)
    return CandidateRanking(result, members, tuple(rejected))


def _ranked(problem: CandidateProblem, order: Sequence[Tiling]) -> list[Simulation]:
    """Rank 1 simulated stage by stage (its events feed the timeline), the rest in O(1)."""
    table = DurationTable(problem.machine)
    best = simulate(problem.shape, order[0], problem.machine, problem.wave_model)
    return [best] + [
        simulate_closed_form(problem.shape, t, problem.machine, problem.wave_model, table)
        for t in order[1:]
    ]


def _certified(
    problem: CandidateProblem,
    feasible: list[Tiling],
    bounds: list[TripleBound],
    space: SearchSpace,
    depths: dict[_Triple, tuple[int, ...]],
    ranks: int,
    deadline: Deadline,
) -> TilingResult:
    from perfmodel.gemm_ws_scoring import ScoreOverflow

    try:
        order = _score(problem, feasible)
    except ScoreOverflow:
        _log.info("scorer overflow; answering with the Z3 search")
        return _z3_search(problem, bounds, space, depths, ranks, deadline)
    ranked = _ranked(problem, order[:ranks])
    incumbent = ranked[0]
    # only triples whose sound lower bound does not exceed the incumbent's time can beat it
    hopeful = [b for b in bounds if b.overall_time_floor_ns <= incumbent.overall_time_ns]
    text = encode_text(hopeful, space, problem.machine, problem.wave_model)
    answer = CheckOutcome("unknown")
    if not deadline.passed():
        # this thread's Z3 session (solver/z3_session.py): the same text, the shared part kept
        claim = better_than_smtlib(incumbent)
        answer = session().check(
            text.shared,
            "\n".join((text.specific, _only_listed(hopeful, depths), claim)),
            timeout_ms=deadline.remaining_ms(),
        )
    checks = (CertificateCheck(CERTIFICATE_CLAIM, answer.outcome),)
    mismatches = 0
    status = "optimal" if answer.outcome == "unsat" else "timeout"
    if answer.outcome == "sat":
        better = Tiling(*answer.tiling) if answer.tiling is not None else None
        message = (
            f"Z3 found {better} lexicographically better than the scorer's incumbent "
            f"{incumbent.tiling} among the candidates"
        )
        if _problem.STRICT_CERTIFICATE:
            raise CertificateMismatch(message)
        _log.error("%s; answering with the Z3 search", message)
        found = _z3_search(problem, bounds, space, depths, ranks, deadline)
        ranked, status, mismatches = list(found.candidates), found.status, 1
    return result_of(
        status,
        ranked,
        _placeholder_summary(),
        deadline,
        checks=len(checks),
        encoded_tile_triples=len(hopeful),
        pruned_tile_triples=len(bounds) - len(hopeful),
        mode=SolverMode.CERTIFIED,
        configurations_scored=len(feasible),
        certificate=checks,
        certificate_mismatches=mismatches,
    )


def _placeholder_summary() -> SearchSummary:
    # replaced by rank_candidates, which counts the request's entries
    return SearchSummary(0, 0, {})


def _z3_search(
    problem: CandidateProblem,
    bounds: list[TripleBound],
    space: SearchSpace,
    depths: dict[_Triple, tuple[int, ...]],
    ranks: int,
    deadline: Deadline,
) -> TilingResult:
    """Rank by rank, each Z3's lexicographic optimum of the candidate set with earlier ranks
    blocked; cut short by the deadline, the proven ranks are followed by the best of the
    candidates by the closed form."""
    enc = _encode_candidates(problem, bounds, space, depths)
    solver = make_solver(timeout_ms=deadline.remaining_ms())
    solver.from_string(enc.smtlib)
    ranking = rank_by_blocking(
        solver, _objectives(enc, space, bounds), deadline.at, ranks, enc.tiling_of, enc.is_tiling
    )
    table = DurationTable(problem.machine)
    ranked = [
        simulate_closed_form(problem.shape, t, problem.machine, problem.wave_model, table)
        for t in ranking.found
    ]
    if not ranking.proven:
        found = set(ranking.found)
        rest = [
            simulate_closed_form(
                problem.shape,
                Tiling(b.tile_m, b.tile_n, b.tile_k, d),
                problem.machine,
                problem.wave_model,
                table,
            )
            for b in bounds
            for d in depths[b.tile_m, b.tile_n, b.tile_k]
        ]
        rest = sorted((s for s in rest if s.tiling not in found), key=objective_key)
        ranked += rest[: max(0, ranks - len(ranked))]
    if not ranked:
        raise SolverTimeout(deadline.time_limit_s)
    ranked = _ranked(problem, [s.tiling for s in ranked])
    return result_of(
        "optimal" if ranking.proven else "timeout",
        ranked,
        _placeholder_summary(),
        deadline,
        checks=ranking.checks,
        encoded_tile_triples=len(bounds),
        pruned_tile_triples=0,
        mode=SolverMode.Z3_SEARCH,
    )


def encode_listed(
    shape: GemmShape,
    machine: GemmWsMachine,
    tilings: Sequence[Tiling],
    element_bytes: int,
    wave_model: WaveTimeModel,
) -> Encoding:
    """Eq. (1)-(3) over exactly ``tilings`` (each already checked against the hardware)."""
    problem = CandidateProblem(
        shape, machine, tuple(tilings), element_bytes, wave_model, enforce_shared_memory=False
    )
    depths = _depths_by_triple(tilings)
    return _encode_candidates(
        problem, _bounds(problem, depths), _depth_space(problem, tilings), depths
    )
