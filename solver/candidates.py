"""Explicit candidate lists (issue 18): rank exactly the tilings a tuner gives, prove the best.

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
import time
from collections.abc import Sequence
from dataclasses import dataclass

from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import (
    ELEMENT_BYTES,
    DurationTable,
    GemmShape,
    GemmWsMachine,
    Simulation,
    Tiling,
    WaveTimeModel,
    simulate,
    simulate_closed_form,
)
from solver.bounds import TripleBound, triple_bounds
from solver.encoding import Encoding, encode, encode_text
from solver.errors import CertificateMismatch, InfeasibleSearchSpace, SolverTimeout
from solver.factory import make_solver
from solver.lexicographic import rank_by_blocking
from solver.optimize import (
    CERTIFICATE_CLAIM,
    CertificateCheck,
    SolverMode,
    TilingResult,
    _objective_key,
    _objectives,
    _tiling_result,
    better_than_smtlib,
)
from solver.search_space import SearchSpace, SearchSummary, shared_memory_fits
from solver.z3_session import CheckOutcome, session

#: the constraint name the space path uses in ``search.rejected`` (solver/bounds.py summarize)
SHARED_MEMORY_CONSTRAINT = "shared_memory_per_block"

_log = logging.getLogger(__name__)

_Triple = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class CandidateProblem:
    """A GEMM on a machine with an explicit list of tilings (request order, repeats allowed)."""

    shape: GemmShape
    machine: GemmWsMachine
    tilings: tuple[Tiling, ...]
    element_bytes: int = 2
    wave_model: WaveTimeModel = WaveTimeModel.PAPER
    enforce_shared_memory: bool = True

    def __post_init__(self) -> None:
        if not self.tilings:
            raise ModelInputError("candidates", "the list of candidates is empty")
        if self.element_bytes not in ELEMENT_BYTES.values():
            raise ValueError(f"element_bytes must be one of {sorted(ELEMENT_BYTES.values())}")


@dataclass(frozen=True, slots=True)
class Rejection:
    """A candidate a hardware constraint rejects: its position, the constraint, why."""

    input_index: int
    constraint: str
    reason: str


@dataclass(frozen=True, slots=True)
class CandidateRanking:
    """``result.candidates``: the ranked groups (one Simulation per distinct tiling); only
    ``result.best`` carries per-stage events. ``members``: per distinct feasible tiling, the
    request positions holding it, ascending."""

    result: TilingResult
    members: dict[Tiling, tuple[int, ...]]
    infeasible: tuple[Rejection, ...]


def reject(problem: CandidateProblem) -> tuple[dict[Tiling, tuple[int, ...]], list[Rejection]]:
    """Split the list: feasible distinct tilings (first appearance order) with their request
    positions, and the rejected entries. The check is the space path's
    (``shared_memory_fits``: buffer_depth x (TM TK + TK TN) x element_bytes <= the device's
    shared memory per CTA)."""
    limit = problem.machine.shared_memory_per_block_bytes
    if not problem.enforce_shared_memory:
        limit = None
    members: dict[Tiling, list[int]] = {}
    rejected: list[Rejection] = []
    for index, tiling in enumerate(problem.tilings):
        if shared_memory_fits(tiling, problem.element_bytes, limit):
            members.setdefault(tiling, []).append(index)
            continue
        t = tiling
        rejected.append(
            Rejection(
                index,
                SHARED_MEMORY_CONSTRAINT,
                f"circular buffer {t.buffer_depth} x ({t.tile_m}x{t.tile_k} + "
                f"{t.tile_k}x{t.tile_n}) x {problem.element_bytes} bytes = "
                f"{t.shared_memory_bytes(problem.element_bytes)} bytes exceeds the device's "
                f"{limit} bytes of shared memory per CTA",
            )
        )
    return {t: tuple(i) for t, i in members.items()}, rejected


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


def check_ranking_arguments(top_k: int | None, time_limit_s: float) -> None:
    """ValueError for a programming error in a ranking call (the HTTP layer validates both)."""
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be at least 1")
    if not time_limit_s > 0:
        raise ValueError("time_limit_s must be positive")


def rank_candidates(
    problem: CandidateProblem,
    *,
    top_k: int | None = None,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> CandidateRanking:
    """Rank the feasible candidates (the first ``top_k`` groups; None: all) and prove the best
    among them; InfeasibleSearchSpace (field ``candidates``) when every one is rejected."""
    check_ranking_arguments(top_k, time_limit_s)
    started = time.perf_counter()
    members, rejected = reject(problem)
    counts: dict[str, int] = {SHARED_MEMORY_CONSTRAINT: len(rejected)}
    if not members:
        raise InfeasibleSearchSpace(
            f"all {len(problem.tilings)} candidates need more shared memory per CTA than the "
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
    depths = _depths_by_triple(feasible)
    space = _depth_space(problem, feasible)
    bounds = _bounds(problem, depths)
    if SolverMode(mode) is SolverMode.Z3_SEARCH:
        result = _z3_search(problem, bounds, space, depths, ranks, started, time_limit_s)
    else:
        result = _certified(problem, feasible, bounds, space, depths, ranks, time_limit_s, started)
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
    time_limit_s: float,
    started: float,
) -> TilingResult:
    from perfmodel.gemm_ws_scoring import ScoreOverflow

    try:
        order = _score(problem, feasible)
    except ScoreOverflow:
        _log.info("scorer overflow; answering with the Z3 search")
        return _z3_search(problem, bounds, space, depths, ranks, started, time_limit_s)
    ranked = _ranked(problem, order[:ranks])
    incumbent = ranked[0]
    # only triples whose sound lower bound does not exceed the incumbent's time can beat it
    hopeful = [b for b in bounds if b.overall_time_floor_ns <= incumbent.overall_time_ns]
    text = encode_text(hopeful, space, problem.machine, problem.wave_model)
    deadline = started + time_limit_s
    answer = CheckOutcome("unknown")
    if time.perf_counter() < deadline:
        # this thread's Z3 session (solver/z3_session.py): the same text, the shared part kept
        claim = better_than_smtlib(incumbent)
        answer = session().check(
            text.shared,
            "\n".join((text.specific, _only_listed(hopeful, depths), claim)),
            timeout_ms=max(1, int((deadline - time.perf_counter()) * 1000)),
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
        from solver import optimize

        if optimize.STRICT_CERTIFICATE:
            raise CertificateMismatch(message)
        _log.error("%s; answering with the Z3 search", message)
        found = _z3_search(problem, bounds, space, depths, ranks, started, time_limit_s)
        ranked, status, mismatches = list(found.candidates), found.status, 1
    return _tiling_result(
        status,
        ranked,
        _placeholder_summary(),
        started,
        time_limit_s,
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
    started: float,
    time_limit_s: float,
) -> TilingResult:
    """Rank by rank, each Z3's lexicographic optimum of the candidate set with earlier ranks
    blocked; cut short by the deadline, the proven ranks are followed by the best of the
    candidates by the closed form."""
    deadline = started + time_limit_s
    enc = _encode_candidates(problem, bounds, space, depths)
    solver = make_solver(timeout_ms=max(1, int((deadline - time.perf_counter()) * 1000)))
    solver.from_string(enc.smtlib)
    ranking = rank_by_blocking(
        solver, _objectives(enc, space, bounds), deadline, ranks, enc.tiling_of, enc.is_tiling
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
        rest = sorted((s for s in rest if s.tiling not in found), key=_objective_key)
        ranked += rest[: max(0, ranks - len(ranked))]
    if not ranked:
        raise SolverTimeout(time_limit_s)
    ranked = _ranked(problem, [s.tiling for s in ranked])
    return _tiling_result(
        "optimal" if ranking.proven else "timeout",
        ranked,
        _placeholder_summary(),
        started,
        time_limit_s,
        checks=ranking.checks,
        encoded_tile_triples=len(bounds),
        pruned_tile_triples=0,
        mode=SolverMode.Z3_SEARCH,
    )
