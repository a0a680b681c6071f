"""Conversions for POST /optimize-tiling with an explicit candidate list: request ->
core problem (a search space or a candidate list), and the answer's per-entry view (groups
expanded to every requested entry, each with its ``input_index`` and echoed ``params``, and
the ``infeasible`` list). Used by the routes (early 4xx checks) and by the worker job alike.
"""

from __future__ import annotations

import dataclasses

from pydantic_core import to_json

from app.convert.optimize import (
    AnyProblem,
    PreparedRequest,
    Solved,
    check_timeline,
    memory_model_of,
    memory_term,
    pipeline_name,
    pipeline_settings,
    request_machine,
    to_problem,
    to_response,
)
from app.schemas.optimize import (
    MAX_CANDIDATE_PARAMS_BYTES,
    InfeasibleCandidate,
    OptimizeTilingRequest,
    OptimizeTilingResponse,
)
from device_profiles import DeviceProfile, get_profile
from device_profiles.provenance import Provenance
from perfmodel import pipelines
from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import GemmShape, Tiling, WaveTimeModel
from solver import ELEMENT_BYTES, InvalidSearchSpace, TilingProblem
from solver.problem import CandidateProblem, CandidateRanking


def prepare(
    request: OptimizeTilingRequest, profile: DeviceProfile | None = None
) -> PreparedRequest:
    """The request resolved once: the pipeline model that answers (the request's, else the
    device's default), chosen by the registry (perfmodel/pipelines), and the core problem
    under it: a search space (:func:`app.convert.optimize.to_problem`) or, with
    ``candidates``, the candidate list. ``profile``: what ``request.device`` resolved to
    (None: a shipped id is looked up, or the inline device_params)."""
    if request.device is not None and request.device_params is None and profile is None:
        profile = get_profile(request.device)
    spec = request.search_space
    enforce = request.candidates is not None or spec is None or spec.enforce_shared_memory
    settings = pipeline_settings(request, profile, enforce_shared_memory=enforce)
    model = pipelines.resolve(pipeline_name(request, profile), settings)
    device, problem = _problem_of(request, profile)
    model = memory_term(model, request, profile, settings)
    return PreparedRequest(
        device,
        dataclasses.replace(problem, pipeline=model),
        memory_model_of(request, profile),
    )


def _problem_of(
    request: OptimizeTilingRequest, profile: DeviceProfile | None
) -> tuple[str, TilingProblem | CandidateProblem]:
    if request.candidates is None:
        return to_problem(request, profile)
    if request.search_space is not None:
        raise ModelInputError("candidates", "give either search_space or candidates, not both")
    device, machine = request_machine(request, profile)
    for index, candidate in enumerate(request.candidates):
        # compact UTF-8 JSON, as the answer echoes it
        size = len(to_json(candidate.params)) if candidate.params is not None else 0
        if size > MAX_CANDIDATE_PARAMS_BYTES:
            raise InvalidSearchSpace(
                f"candidates.{index}.params",
                f"{size} bytes of JSON exceed the limit of {MAX_CANDIDATE_PARAMS_BYTES}",
            )
    tilings = tuple(
        Tiling(c.tile_m, c.tile_n, c.tile_k, c.buffer_depth) for c in request.candidates
    )
    check_timeline(request, min(t.tile_k for t in tilings))
    return device, CandidateProblem(
        shape=GemmShape(request.m, request.n, request.k),
        machine=machine,
        tilings=tilings,
        element_bytes=ELEMENT_BYTES[request.dtype],
        wave_model=WaveTimeModel(request.wave_time_model),
    )


def configurations_of(problem: AnyProblem) -> int:
    """Configurations the request asks to consider (the server's max_search_space_candidates
    bounds it)."""
    if isinstance(problem, CandidateProblem):
        return len(problem.tilings)
    return problem.space.size


def to_candidates_response(
    request: OptimizeTilingRequest,
    prepared: PreparedRequest,
    solved: Solved,
    ranking: CandidateRanking,
    origin: Provenance | None = None,
) -> OptimizeTilingResponse:
    """The answer with one entry per requested candidate of each ranked group (same rank and
    prediction, request order within a group), ``best`` the first of rank 1, and the
    rejected entries under ``infeasible``."""
    assert request.candidates is not None
    listed = request.candidates
    answer = to_response(request, prepared, solved, origin)
    entries = []
    for group in answer.candidates:
        tiling = Tiling(group.tile_m, group.tile_n, group.tile_k, group.buffer_depth)
        entries += [
            group.model_copy(update={"input_index": i, "params": listed[i].params})
            for i in ranking.members[tiling]
        ]
    first = entries[0]
    best = answer.best.model_copy(update={"input_index": first.input_index, "params": first.params})
    infeasible = [
        InfeasibleCandidate(
            input_index=r.input_index,
            tile_m=listed[r.input_index].tile_m,
            tile_n=listed[r.input_index].tile_n,
            tile_k=listed[r.input_index].tile_k,
            buffer_depth=listed[r.input_index].buffer_depth,
            params=listed[r.input_index].params,
            constraint=r.constraint,
            reason=r.reason,
        )
        for r in ranking.infeasible
    ]
    return answer.model_copy(update={"best": best, "candidates": entries, "infeasible": infeasible})
