"""What every solver path shares: the problem, the result, the optimizer's order (§3.2
objectives, then the tie-break) and the certificate's claim, for any pipeline model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import z3

from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import ELEMENT_BYTES, GemmShape, GemmWsMachine, Tiling, WaveTimeModel
from perfmodel.pipeline import GemmOnMachine, PipelineModel, Prediction
from perfmodel.pipelines.paper import PaperPipeline
from solver.deadline import Deadline
from solver.errors import InvalidSearchSpace, SolverTimeout
from solver.factory import z3_version
from solver.search_space import MAX_BUFFER_DEPTH, SearchSpace, SearchSummary, shared_memory_fits

_T = TypeVar("_T", int, z3.ArithRef)

#: largest space (tile triples) the pure Z3 search takes: it encodes every triple, and at the
#: 110,592-triple limit its encoding alone outgrows a worker's memory and time
MAX_Z3_SEARCH_TILE_TRIPLES = 4096

#: raise CertificateMismatch instead of answering from Z3's model (set by the test suite: a
#: disagreement between the scorer and the encoding must fail loudly there)
STRICT_CERTIFICATE = False

#: what the certificate's one check refutes
CERTIFICATE_CLAIM = (
    "some configuration has a smaller overall time, or the same time and a smaller total MATH "
    "wait, or both equal and a better tie-break"
)


class SolverMode(StrEnum):
    #: exact scorer over the whole space, then one Z3 certificate check of its best
    CERTIFIED = "certified"
    #: lexicographic Z3 search per rank
    Z3_SEARCH = "z3-search"


@dataclass(frozen=True, slots=True)
class CertificateCheck:
    """One Z3 check of the certificate: what it asked and what Z3 answered."""

    #: the claim refuted by "unsat", e.g. "lexicographically better than the incumbent"
    claim: str
    #: "unsat" (proven), "sat" (Z3 found a better configuration), "unknown" (out of time)
    outcome: str


class GemmProblem(GemmOnMachine):
    """What a search-space problem and a candidate-list problem share: a GEMM on a machine
    (:class:`GemmOnMachine`), solved under ``pipeline`` (None: the paper's model with
    ``wave_model``). The dataclasses below declare the fields."""

    __slots__ = ()
    wave_model: WaveTimeModel
    pipeline: PipelineModel | None

    def __post_init__(self) -> None:
        if self.element_bytes not in ELEMENT_BYTES.values():
            raise ValueError(f"element_bytes must be one of {sorted(ELEMENT_BYTES.values())}")

    @property
    def model(self) -> PipelineModel:
        """The model the problem is solved under."""
        if self.pipeline is not None:
            return self.pipeline
        paper: PipelineModel = PaperPipeline(self.wave_model)
        return paper


@dataclass(frozen=True, slots=True)
class TilingProblem(GemmProblem):
    """A GEMM on a machine over a search space (:class:`GemmProblem`)."""

    shape: GemmShape
    machine: GemmWsMachine
    space: SearchSpace
    element_bytes: int = 2
    wave_model: WaveTimeModel = WaveTimeModel.PAPER
    pipeline: PipelineModel | None = None


@dataclass(frozen=True, slots=True)
class SolverStatistics:
    elapsed_ms: float
    z3_version: str
    checks: int
    #: configurations given to Z3 after the bound-based presolve, and those it left out
    encoded_configurations: int
    pruned_configurations: int
    mode: SolverMode = SolverMode.Z3_SEARCH
    #: configurations the exact scorer evaluated (certified mode)
    configurations_scored: int = 0
    certificate: tuple[CertificateCheck, ...] = ()
    #: 1 when Z3 refuted the scorer's incumbent and the answer came from the Z3 search
    certificate_mismatches: int = 0


@dataclass(frozen=True, slots=True)
class TilingResult:
    """``status`` is "optimal" when Z3 proved every ranked entry, else "timeout"; ``best``
    and ``candidates`` are the model's predictions (rank 1 with its per-stage events)."""

    status: str
    best: Any
    candidates: tuple[Any, ...]
    summary: SearchSummary
    statistics: SolverStatistics


@dataclass(frozen=True, slots=True)
class Certificate:
    checks: tuple[CertificateCheck, ...]
    #: a configuration Z3 found lexicographically better than the incumbent (a bug), or None
    better: Tiling | None
    #: configurations encoded (bounds able to beat the incumbent) and left out
    encoded_configurations: int
    pruned_configurations: int


def result_of(
    status: str,
    ranked: Sequence[Prediction],
    summary: SearchSummary,
    deadline: Deadline,
    **statistics: Any,
) -> TilingResult:
    """The answer in rank order; SolverTimeout when nothing was found in time."""
    if not ranked:
        raise SolverTimeout(deadline.time_limit_s)
    return TilingResult(
        status=status,
        best=ranked[0],
        candidates=tuple(ranked),
        summary=summary,
        statistics=SolverStatistics(
            elapsed_ms=deadline.elapsed_ms(), z3_version=z3_version(), **statistics
        ),
    )


def certified_result_of(
    status: str,
    ranked: Sequence[Prediction],
    summary: SearchSummary,
    deadline: Deadline,
    certificate: Certificate | None,
    configurations_scored: int,
) -> TilingResult:
    """:func:`result_of` for the certified mode: the certificate's checks and encoding counts
    (none when no certificate ran) beside the scorer's count."""
    checks = certificate.checks if certificate is not None else ()
    return result_of(
        status,
        ranked,
        summary,
        deadline,
        checks=len(checks),
        encoded_configurations=certificate.encoded_configurations if certificate else 0,
        pruned_configurations=certificate.pruned_configurations if certificate else 0,
        mode=SolverMode.CERTIFIED,
        configurations_scored=configurations_scored,
        certificate=checks,
    )


_KEY_BASE = 1 << 17  # > MAX_TILE and > MAX_BUFFER_DEPTH, so the digits never overlap


def tie_break_key(tile_m: _T, tile_n: _T, tile_k: _T, buffer_depth: _T) -> _T:
    """One integer ordering larger tile_m, then larger tile_n, larger tile_k, smaller depth.

    Mixed-radix digits with a base above every allowed value, so maximising the key is the
    four-level lexicographic tie-break in one objective (fewer solver checks).
    """
    return ((tile_m * _KEY_BASE + tile_n) * _KEY_BASE + tile_k) * _KEY_BASE + (
        MAX_BUFFER_DEPTH - buffer_depth
    )


def objective_key(prediction: Prediction) -> tuple[int, int, int]:
    """The solver's lexicographic order, for ordering predicted configurations."""
    t = prediction.tiling
    tie_break = tie_break_key(t.tile_m, t.tile_n, t.tile_k, t.buffer_depth)
    return (prediction.overall_time_ns, prediction.total_math_wait_ns, -tie_break)


def check_mode(space: SearchSpace, mode: SolverMode) -> None:
    """Refuse a space the mode cannot solve within a worker's means (InvalidSearchSpace)."""
    triples = len(space.tile_m) * len(space.tile_n) * len(space.tile_k)
    if SolverMode(mode) is SolverMode.Z3_SEARCH and triples > MAX_Z3_SEARCH_TILE_TRIPLES:
        raise InvalidSearchSpace(
            "search_space",
            f"{triples} (tile_m, tile_n, tile_k) combinations exceed the z3-search limit of "
            f"{MAX_Z3_SEARCH_TILE_TRIPLES}; use solver 'certified' or coarser ranges",
        )


def check_arguments(top_k: int | None, time_limit_s: float) -> None:
    """ValueError for a programming error in a solve call (the HTTP layer validates both)."""
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be at least 1")
    if not time_limit_s > 0:
        raise ValueError("time_limit_s must be positive")


def better_than(enc: Any, incumbent: Prediction) -> z3.BoolRef:
    """The encoded configuration (solver.encoding.Encoding) beats ``incumbent`` in the
    optimizer's lexicographic order."""
    t = incumbent.tiling
    time_ns, wait_ns = incumbent.overall_time_ns, incumbent.total_math_wait_ns
    key = tie_break_key(t.tile_m, t.tile_n, t.tile_k, t.buffer_depth)
    enc_key = tie_break_key(enc.tile_m, enc.tile_n, enc.tile_k, enc.buffer_depth)
    # One check for the whole lexicographic order: strictly faster, or as fast with less MATH
    # wait (§3.2's second objective), or equal on both with a better tie-break key.
    return z3.Or(
        enc.overall_time_ns < time_ns,
        z3.And(enc.overall_time_ns == time_ns, enc.total_math_wait_ns < wait_ns),
        z3.And(
            enc.overall_time_ns == time_ns,
            enc.total_math_wait_ns == wait_ns,
            enc_key > key,
        ),
    )


def better_than_smtlib(incumbent: Prediction) -> str:
    """:func:`better_than` as an SMT-LIB assertion over the names every encoding declares (the
    same formula, tests/solver/test_z3_session.py proves them equivalent): parsed with the
    encoding, it builds no Python-side Z3 object."""
    t = incumbent.tiling
    time_ns, wait_ns = incumbent.overall_time_ns, incumbent.total_math_wait_ns
    key = tie_break_key(t.tile_m, t.tile_n, t.tile_k, t.buffer_depth)
    b = _KEY_BASE
    enc_key = (
        f"(+ (* (+ (* (+ (* tile_m {b}) tile_n) {b}) tile_k) {b}) "
        f"(- {MAX_BUFFER_DEPTH} buffer_depth))"
    )
    return (
        f"(assert (or (< overall_time {time_ns}) "
        f"(and (= overall_time {time_ns}) (< total_math_wait {wait_ns})) "
        f"(and (= overall_time {time_ns}) (= total_math_wait {wait_ns}) (> {enc_key} {key}))))"
    )


#: the constraint name the space path uses in ``search.rejected``
SHARED_MEMORY_CONSTRAINT = "shared_memory_per_block"

#: the constraint of a candidate whose buffer fits a CTA's share but no SM (per-SM shared
#: memory below per-block: e.g. a profile with an opt-in per-block maximum)
SHARED_MEMORY_PER_SM_CONSTRAINT = "shared_memory_per_sm"


@dataclass(frozen=True, slots=True)
class CandidateProblem(GemmProblem):
    """A GEMM on a machine with an explicit list of tilings (request order, repeats allowed;
    :class:`GemmProblem`)."""

    shape: GemmShape
    machine: GemmWsMachine
    tilings: tuple[Tiling, ...]
    element_bytes: int = 2
    wave_model: WaveTimeModel = WaveTimeModel.PAPER
    enforce_shared_memory: bool = True
    pipeline: PipelineModel | None = None

    def __post_init__(self) -> None:
        if not self.tilings:
            raise ModelInputError("candidates", "the list of candidates is empty")
        GemmProblem.__post_init__(self)


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
    positions, and the rejected entries, in request order. The checks are the space path's
    (``shared_memory_fits``: buffer_depth x (TM TK + TK TN) x element_bytes <= the device's
    shared memory per CTA), then the model's residency on an SM."""
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
    model = problem.model
    for tiling in list(members):
        reason = model.residency_rejection(tiling, problem.element_bytes)
        if reason is not None:
            rejected += [
                Rejection(i, SHARED_MEMORY_PER_SM_CONSTRAINT, reason) for i in members.pop(tiling)
            ]
    rejected.sort(key=lambda r: r.input_index)
    return {t: tuple(i) for t, i in members.items()}, rejected
