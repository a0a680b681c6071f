"""Explicit candidate lists: rank exactly the tilings a tuner gives, prove the best.

An autotuner (Triton, Kernel Tuner) brings its own list of configurations rather than a product
space. The list is ranked by the same means as a space (solver/per_configuration.py):

* each candidate is checked against the hardware constraints the space path counts in
  ``search.rejected`` (the circular buffer in shared memory per CTA, then the model's residency
  on an SM); a rejected one is reported with the constraint's name and the figures compared,
  and is not ranked;
* the feasible ones are scored by the model's exact vectorised scorer (equal to the
  stage-by-stage simulator) and ordered by §3.2's objectives, then the tie-break;
* in ``certified`` mode Z3 proves the scorer's best over the model's encoding of exactly the
  candidate set (one UNSAT check); ``z3-search`` ranks by blocking over the same encoding.

Entries equal in (tile_m, tile_n, tile_k, buffer_depth) are one configuration (a "group"): the
model cannot tell them apart, so they share a rank and a prediction.
"""

from __future__ import annotations

import dataclasses

from solver.deadline import Deadline
from solver.errors import InfeasibleSearchSpace
from solver.problem import (
    SHARED_MEMORY_CONSTRAINT,
    SHARED_MEMORY_PER_SM_CONSTRAINT,
    CandidateProblem,
    CandidateRanking,
    Rejection,
    SolverMode,
    check_arguments,
    reject,
)
from solver.search_space import SearchSummary

__all__ = [
    "SHARED_MEMORY_CONSTRAINT",
    "SHARED_MEMORY_PER_SM_CONSTRAINT",
    "CandidateProblem",
    "CandidateRanking",
    "Rejection",
    "rank_candidates",
    "reject",
]


def rank_candidates(
    problem: CandidateProblem,
    *,
    top_k: int | None = None,
    time_limit_s: float = 10.0,
    mode: SolverMode = SolverMode.CERTIFIED,
) -> CandidateRanking:
    """Rank the feasible candidates (the first ``top_k`` groups; None: all) and prove the best
    among them; InfeasibleSearchSpace (field ``candidates``) when every one is rejected."""
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
    from solver.per_configuration import rank_listed  # numpy: worker side only

    result = rank_listed(problem, feasible, ranks, deadline, mode)
    result = dataclasses.replace(result, summary=summary)
    return CandidateRanking(result, members, tuple(rejected))
