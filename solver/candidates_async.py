"""Explicit candidate lists under the async-copy variant (issues 17 and 18). The async twin of
solver/candidates.py: the same rejection report (plus the per-SM residency limit), the exact
vectorised scorer of (A1)-(A3) over the feasible distinct candidates, and Z3 over exactly the
candidate set (solver/encoding_async.py encodes exactly the configurations it is given): one
certificate check in ``certified`` mode, rank by rank in ``z3-search``. The scorer and the
certificate (numpy) are imported where they run, in the worker.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling
from perfmodel.gemm_ws_async import AsyncDurationTable, AsyncSimulation, SmLimits
from solver.candidates import (
    SHARED_MEMORY_CONSTRAINT,
    CandidateProblem,
    Rejection,
    check_ranking_arguments,
    reject,
)
from solver.errors import InfeasibleSearchSpace, SolverTimeout
from solver.optimize import SolverMode
from solver.optimize_async import AsyncTilingResult, async_result, objective_key, rank_encoded
from solver.search_space import SearchSummary

#: the constraint of a candidate whose buffer fits a CTA's share but no SM (per-SM shared
#: memory below per-block: e.g. a profile with an opt-in per-block maximum)
SHARED_MEMORY_PER_SM_CONSTRAINT = "shared_memory_per_sm"


@dataclass(frozen=True, slots=True)
class AsyncCandidateProblem:
    """A GEMM on a machine with an explicit list of tilings (request order, repeats allowed)
    and the SM's residency limits."""

    shape: GemmShape
    machine: GemmWsMachine
    tilings: tuple[Tiling, ...]
    limits: SmLimits
    element_bytes: int = 2
    enforce_shared_memory: bool = True

    def __post_init__(self) -> None:
        if not self.tilings:
            raise ModelInputError("candidates", "the list of candidates is empty")

    @property
    def effective_limits(self) -> SmLimits:
        if self.enforce_shared_memory:
            return self.limits
        return dataclasses.replace(self.limits, shared_memory_per_sm_bytes=None)


@dataclass(frozen=True, slots=True)
class AsyncCandidateRanking:
    """As :class:`solver.candidates.CandidateRanking`, under async-copy."""

    result: AsyncTilingResult
    members: dict[Tiling, tuple[int, ...]]
    infeasible: tuple[Rejection, ...]


def _reject(
    problem: AsyncCandidateProblem, limits: SmLimits
) -> tuple[dict[Tiling, tuple[int, ...]], list[Rejection]]:
    members, rejected = reject(
        CandidateProblem(
            problem.shape,
            problem.machine,
            problem.tilings,
            problem.element_bytes,
            enforce_shared_memory=problem.enforce_shared_memory,
        )
    )
    for tiling in list(members):
        smem = tiling.shared_memory_bytes(problem.element_bytes)
        if limits.ctas_per_sm(smem) >= 1:
            continue
        reason = (
            f"circular buffer of {smem} bytes exceeds the {limits.shared_memory_per_sm_bytes} "
            "bytes of shared memory of one SM: no CTA fits"
        )
        rejected += [
            Rejection(i, SHARED_MEMORY_PER_SM_CONSTRAINT, reason) for i in members.pop(tiling)
        ]
    return members, sorted(rejected, key=lambda r: r.input_index)


def rank_candidates_async(
    problem: AsyncCandidateProblem,
    *,
    top_k: int | None = None,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> AsyncCandidateRanking:
    """Rank the feasible candidates (the first ``top_k`` groups; None: all) and prove the best
    among them; InfeasibleSearchSpace (field ``candidates``) when every one is rejected."""
    check_ranking_arguments(top_k, time_limit_s)
    started = time.perf_counter()
    limits = problem.effective_limits
    members, rejected = _reject(problem, limits)
    counts = {
        name: sum(r.constraint == name for r in rejected)
        for name in (SHARED_MEMORY_CONSTRAINT, SHARED_MEMORY_PER_SM_CONSTRAINT)
    }
    if not members:
        raise InfeasibleSearchSpace(
            f"all {len(problem.tilings)} candidates need more shared memory than the device "
            "allows; list smaller tiles or buffer depths",
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
    if SolverMode(mode) is SolverMode.Z3_SEARCH:
        result = _z3_search(problem, limits, feasible, ranks, started, time_limit_s)
    else:
        result = _certified(problem, limits, feasible, ranks, started, time_limit_s)
    return AsyncCandidateRanking(
        dataclasses.replace(result, summary=summary), members, tuple(rejected)
    )


def _certified(
    problem: AsyncCandidateProblem,
    limits: SmLimits,
    feasible: list[Tiling],
    ranks: int,
    started: float,
    time_limit_s: float,
) -> AsyncTilingResult:
    from solver.certify_async import (  # numpy: worker side only
        certify_async,
        check_scores,
        configs_of,
        mismatch_answer,
        rank_async,
        simulate_ranked_with,
        tilings_of,
    )

    deadline = started + time_limit_s
    shape, machine, eb = problem.shape, problem.machine, problem.element_bytes
    configs = configs_of(feasible)
    ranking = rank_async(shape, machine, limits, eb, [configs], ranks, deadline)
    ranked = simulate_ranked_with(shape, machine, limits, eb, tilings_of(ranking.configs))
    check_scores(ranked, ranking.overall_time_ns, ranking.total_math_wait_ns)
    certificate = certify_async(shape, machine, limits, eb, ranked[0], configs, deadline)
    if certificate.better is not None:
        return mismatch_answer(
            certificate,
            ranked[0],
            len(feasible),
            lambda: _z3_search(problem, limits, feasible, ranks, started, time_limit_s),
        )
    proven = all(c.outcome == "unsat" for c in certificate.checks)
    return _result(
        "optimal" if proven else "timeout",
        ranked,
        started,
        checks=len(certificate.checks),
        encoded_tile_triples=certificate.encoded_tile_triples,
        pruned_tile_triples=certificate.pruned_tile_triples,
        mode=SolverMode.CERTIFIED,
        configurations_scored=len(feasible),
        certificate=certificate.checks,
    )


def _result(
    status: str, ranked: Sequence[AsyncSimulation], started: float, **stats: Any
) -> AsyncTilingResult:
    # the summary is replaced by rank_candidates_async, which counts the request's entries
    return async_result(status, ranked, SearchSummary(0, 0, {}), started, **stats)


def _z3_search(
    problem: AsyncCandidateProblem,
    limits: SmLimits,
    feasible: list[Tiling],
    ranks: int,
    started: float,
    time_limit_s: float,
) -> AsyncTilingResult:
    """Rank by rank, each Z3's lexicographic optimum of the candidate set with earlier ranks
    blocked; cut short by the deadline, the proven ranks are followed by the best of the rest
    by the simulator."""
    from solver.certify_async import (  # numpy: worker side only
        configs_of,
        encoded_configs,
        simulate_ranked_with,
    )

    deadline = started + time_limit_s
    shape, machine, eb = problem.shape, problem.machine, problem.element_bytes
    sims = dict(
        zip(feasible, simulate_ranked_with(shape, machine, limits, eb, feasible), strict=True)
    )
    table = AsyncDurationTable(machine)
    ranking = rank_encoded(
        encoded_configs(shape, machine, limits, eb, configs_of(feasible)),
        sims,
        (table.epilogue_ns, table.init_ns),
        deadline,
        ranks,
    )
    ranked = [sims[t] for t in ranking.found]
    if not ranking.proven:
        done = set(ranking.found)
        rest = sorted((s for t, s in sims.items() if t not in done), key=objective_key)
        ranked += rest[: max(0, ranks - len(ranked))]
    if not ranked:
        raise SolverTimeout(time_limit_s)
    # rank 1 stage by stage: its events feed the timeline
    ranked = simulate_ranked_with(shape, machine, limits, eb, [s.tiling for s in ranked])
    return _result(
        "optimal" if ranking.proven else "timeout",
        ranked,
        started,
        checks=ranking.checks,
        encoded_tile_triples=len(feasible),
        pruned_tile_triples=0,
        mode=SolverMode.Z3_SEARCH,
    )


__all__ = [
    "AsyncCandidateProblem",
    "AsyncCandidateRanking",
    "rank_candidates_async",
]
