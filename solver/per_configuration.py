"""The optimizer over any pipeline model, configuration by configuration (numpy and Z3: worker
side only).

Same objectives and tie-break as solver/optimize.py (§3.2, lexicographic: overall time, total
MATH wait, then larger tile_m, tile_n, tile_k, smaller depth), written once over
:class:`perfmodel.pipeline.PipelineModel`:

* ``certified``: the model's exact vectorised scorer evaluates every configuration of the space
  (or of a candidate list) that fits a CTA and an SM, in chunks with the deadline checked
  between them, and keeps the ``top_k`` best; the best (the incumbent) is simulated stage by
  stage and checked against the scorer; then ONE Z3 check over the model's encoding asks
  whether any configuration is lexicographically better; "unsat" proves it optimal. Only
  configurations whose sound lower bounds (the model's ``bounds``, independent of the scorer)
  leave them able to beat the incumbent are encoded.
* ``z3-search``: rank by rank, each Z3's lexicographic optimum over the encoding with earlier
  ranks blocked; a presolve by the closed form encodes only configurations no slower than the
  ``top_k``-th.

A "sat" certificate (Z3 found a better configuration) is a bug in the scorer or the encoding:
it raises :class:`solver.errors.CertificateMismatch` when ``solver.problem.STRICT_CERTIFICATE``
is set (tests), else the answer comes from the pure Z3 search and the mismatch is counted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ParamSpec

import numpy as np
import numpy.typing as npt
import z3

from perfmodel.gemm_ws import Tiling
from perfmodel.gemm_ws_scoring import (
    Configurations,
    Figures,
    IntArray,
    ScoreOverflow,
    enumerate_configurations,
    lexicographic_order,
)
from perfmodel.pipeline import PipelineModel, Prediction
from solver import encodings
from solver import problem as _problem
from solver.deadline import Deadline, ms_until
from solver.encoding import Encoding
from solver.errors import CertificateMismatch, InfeasibleSearchSpace, SolverTimeout
from solver.factory import make_solver
from solver.lexicographic import Objective, Ranking, rank_by_blocking
from solver.problem import (
    CERTIFICATE_CLAIM,
    SHARED_MEMORY_CONSTRAINT,
    CandidateProblem,
    Certificate,
    CertificateCheck,
    SolverMode,
    TilingProblem,
    TilingResult,
    better_than,
    better_than_smtlib,
    certified_result_of,
    objective_key,
    result_of,
    tie_break_key,
)
from solver.search_space import SearchSpace, SearchSummary, shared_memory_fits
from solver.z3_session import CheckOutcome, session

_log = logging.getLogger(__name__)
_P = ParamSpec("_P")

#: the constraint of a configuration whose split_k exceeds its k tiles, ceil(k / tile_k)
SPLIT_K_CONSTRAINT = "split_k_per_k_tiles"

#: tie_break_key is below this (four digits of base 2^17), so it is the last digit
_KEY_SPAN = 1 << 68


@dataclass(frozen=True, slots=True)
class Instance:
    """What every step reads of a problem: the model, the GEMM, the machine, the dtype."""

    model: PipelineModel
    problem: TilingProblem | CandidateProblem

    def simulate(self, tiling: Tiling) -> Prediction:
        p = self.problem
        return self.model.simulate(p.shape, tiling, p.machine, p.element_bytes)

    def closed_form(self, tiling: Tiling) -> Prediction:
        p = self.problem
        return self.model.closed_form(p.shape, tiling, p.machine, p.element_bytes)

    def bounds(self, configs: Configurations) -> tuple[IntArray, IntArray]:
        return self.model.bounds(self.problem, configs)

    def encode(self, configs: Configurations) -> Encoding:
        return encodings.encode(self.model, self.problem, configs)

    def resident(self, configs: Configurations) -> npt.NDArray[np.intp]:
        """Indices of the configurations that fit an SM."""
        return np.flatnonzero(self.model.resident(configs, self.problem.element_bytes))

    def ranked(self, tilings: Sequence[Tiling]) -> list[Prediction]:
        """Rank 1 simulated stage by stage (the reference the scorer is checked against; its
        events feed the timeline), the others by the O(1) closed form."""
        return [(self.simulate if i == 0 else self.closed_form)(t) for i, t in enumerate(tilings)]


@dataclass(frozen=True, slots=True)
class ScoredRanking:
    """The scorer's ``top_k`` best of a set of configurations, in the optimizer's order, and
    every configuration that may beat its best (a superset of those the certificate needs)."""

    configs: Configurations
    overall_time_ns: IntArray
    total_math_wait_ns: IntArray
    hopeful: Configurations
    #: the model's bounds of ``hopeful`` (overall time, total MATH wait); None: not computed
    hopeful_floors: tuple[IntArray, IntArray] | None
    scored: int
    #: False when the deadline stopped the enumeration
    complete: bool
    #: configurations that do not fit an SM
    not_resident: int


def rank_scored(
    instance: Instance, chunks: Iterable[Configurations], top_k: int, deadline: float
) -> ScoredRanking:
    """Score ``chunks`` and keep the ``top_k`` best; the deadline is checked between chunks
    (the first always runs). Configurations that do not fit an SM are left out and counted."""
    p = instance.problem
    figures = Figures.of_machine(p.machine)
    kept = Configurations.concat([])
    kept_time = kept_wait = np.zeros(0, dtype=np.int64)
    hopeful: list[tuple[Configurations, IntArray, IntArray]] = []
    scored, not_resident, complete = 0, 0, True
    for chunk in chunks:
        if scored and time.perf_counter() > deadline:
            complete = False
            break
        resident = instance.resident(chunk)
        if resident.shape[0] < chunk.count:
            not_resident += chunk.count - resident.shape[0]
            chunk = chunk.take(resident)
        if not chunk.count:
            continue
        scores = instance.model.score(p.shape, chunk, figures, p.element_bytes)
        times, waits = scores.overall_time_ns[0], scores.total_math_wait_ns[0]
        scored += chunk.count
        hopeful.append((chunk, *instance.bounds(chunk)))
        top = chunk
        if chunk.count > top_k:
            # only configurations no slower than the chunk's k-th best can be in the top k
            kth = np.partition(times, top_k - 1)[top_k - 1]
            index = np.flatnonzero(times <= kth)
            top, times, waits = chunk.take(index), times[index], waits[index]
        if kept.count:
            top = Configurations.concat([kept, top])
            times, waits = np.concatenate([kept_time, times]), np.concatenate([kept_wait, waits])
        order = lexicographic_order(times, waits, top)[:top_k]
        kept, kept_time, kept_wait = top.take(order), times[order], waits[order]
        # the best so far bounds the final incumbent's time from above: a configuration whose
        # floor exceeds it is never encoded
        best = int(kept_time[0])
        hopeful = [
            (c.take(index), f[index], w[index])
            for c, f, w in hopeful
            if (index := np.flatnonzero(f <= best)).shape[0]
        ]
    return ScoredRanking(
        kept,
        kept_time,
        kept_wait,
        Configurations.concat([c for c, _, _ in hopeful]),
        (
            np.concatenate([f for _, f, _ in hopeful], dtype=np.int64),
            np.concatenate([w for _, _, w in hopeful], dtype=np.int64),
        )
        if hopeful
        else None,
        scored,
        complete,
        not_resident,
    )


def may_beat(
    time_floor: IntArray,
    wait_floor: IntArray,
    configs: Configurations,
    incumbent: Prediction,
) -> npt.NDArray[np.bool_]:
    """Which configurations the lower bounds leave able to beat ``incumbent`` in the
    optimizer's order. With t >= time floor and w >= wait floor: a floor above its time rules
    a configuration out; at a time floor >= its time it can only tie the time, so a wait floor
    above its wait rules it out, and at a wait floor >= its wait it can only tie the wait
    too, so a tie-break no better than the incumbent's rules it out."""
    tiling = incumbent.tiling
    time_ns, wait_ns = incumbent.overall_time_ns, incumbent.total_math_wait_ns
    key = (configs.tile_m, configs.tile_n, configs.tile_k, -configs.buffer_depth)
    mine = (tiling.tile_m, tiling.tile_n, tiling.tile_k, -tiling.buffer_depth)
    # lexicographic "key > incumbent's key", digit by digit
    better_key = np.zeros(configs.count, dtype=bool)
    equal = np.ones(configs.count, dtype=bool)
    for column, value in zip(key, mine, strict=True):
        better_key |= equal & (column > value)
        equal &= column == value
    can_tie_time = time_floor >= time_ns
    can_tie_wait = wait_floor >= wait_ns
    ruled_out = (time_floor > time_ns) | (can_tie_time & (wait_floor > wait_ns))
    ruled_out |= can_tie_time & can_tie_wait & ~better_key
    result: npt.NDArray[np.bool_] = ~ruled_out
    return result


def certify(
    instance: Instance,
    incumbent: Prediction,
    configs: Configurations,
    deadline: float,
    floors: tuple[IntArray, IntArray] | None = None,
) -> Certificate:
    """Ask Z3 whether any of ``configs`` (each fitting an SM) beats ``incumbent``
    lexicographically over the model's encoding; "unsat" proves the incumbent optimal among
    them. Only configurations the model's bounds leave able to beat it are encoded; the
    incumbent itself always is (an encoding is never empty). Each check runs in this thread's
    Z3 session (solver/z3_session.py): the encoding's shared part stays asserted between
    requests, its own facts and the claim are checked in a scope of their own. ``floors``:
    the model's bounds of ``configs`` when the caller has them."""
    time_floor, wait_floor = floors if floors is not None else instance.bounds(configs)
    hopeful = configs.take(np.flatnonzero(may_beat(time_floor, wait_floor, configs, incumbent)))
    if incumbent.tiling not in hopeful.tilings():
        hopeful = Configurations.concat([hopeful, Configurations.of_tilings([incumbent.tiling])])
    enc = instance.encode(hopeful)
    answer = CheckOutcome("unknown")
    if time.perf_counter() < deadline:
        claim = better_than_smtlib(incumbent)
        answer = session().check(
            enc.shared, enc.specific + "\n" + claim, timeout_ms=ms_until(deadline)
        )
    better = _witness(enc, incumbent, deadline) if answer.outcome == "sat" else None
    checks = (CertificateCheck(CERTIFICATE_CLAIM, answer.outcome),)
    return Certificate(checks, better, hopeful.count, configs.count - hopeful.count)


def _witness(enc: Encoding, incumbent: Prediction, deadline: float) -> Tiling | None:
    """The configuration Z3 found better than ``incumbent`` (a bug), read by the encoding
    itself (it knows the dimensions it does not encode): the claim checked once more, in a
    solver of Z3's main context, where the encoding's variables live."""
    solver = make_solver(timeout_ms=ms_until(deadline))
    solver.from_string(enc.smtlib)
    solver.add(better_than(enc, incumbent))
    return enc.tiling_of(solver.model()) if solver.check() == z3.sat else None


def check_scores(ranked: Sequence[Prediction], times: IntArray, waits: IntArray) -> None:
    """The stage-by-stage simulator is the reference: a scorer that disagrees is a bug."""
    for sim, time_ns, wait_ns in zip(ranked, times, waits, strict=True):
        if (sim.overall_time_ns, sim.total_math_wait_ns) != (int(time_ns), int(wait_ns)):
            raise CertificateMismatch(
                f"scorer gives {int(time_ns)} ns / {int(wait_ns)} ns for {sim.tiling}, the "
                f"simulator {sim.overall_time_ns} ns / {sim.total_math_wait_ns} ns"
            )


def mismatch_answer(
    certificate: Certificate,
    incumbent: Prediction,
    scored: int,
    z3_search: Callable[[], TilingResult],
) -> TilingResult:
    """Z3 refuted the scorer's incumbent: raise in strict mode, else answer from the pure Z3
    search and count the mismatch."""
    message = (
        f"Z3 found {certificate.better} lexicographically better than the scorer's incumbent "
        f"{incumbent.tiling} ({incumbent.overall_time_ns} ns)"
    )
    if _problem.STRICT_CERTIFICATE:
        raise CertificateMismatch(message)
    _log.error("%s; answering with the Z3 search", message)
    result = z3_search()
    stats = result.statistics
    return dataclasses.replace(
        result,
        statistics=dataclasses.replace(
            stats,
            checks=stats.checks + len(certificate.checks),
            mode=SolverMode.CERTIFIED,
            configurations_scored=scored,
            certificate=certificate.checks,
            certificate_mismatches=1,
        ),
    )


def rank_encoded(
    instance: Instance,
    configs: Configurations,
    predictions: dict[Tiling, Prediction],
    deadline: float,
    ranks: int,
) -> Ranking[Tiling]:
    """Up to ``ranks`` lexicographic optima among ``configs`` (predicted in ``predictions``),
    each found by Z3 over the model's encoding with the earlier ones blocked."""
    enc = instance.encode(configs)
    solver = make_solver(timeout_ms=ms_until(deadline))
    solver.from_string(enc.smtlib)
    blocked: set[Tiling] = set()

    def read(model: z3.ModelRef) -> Tiling:
        tiling = enc.tiling_of(model)
        blocked.add(tiling)
        return tiling

    objectives = _objectives(enc, predictions, blocked)
    return rank_by_blocking(solver, objectives, deadline, ranks, read, enc.is_tiling)


def _objectives(
    enc: Encoding, predictions: dict[Tiling, Prediction], blocked: set[Tiling]
) -> list[Objective]:
    """§3.2's overall time, then total MATH wait, then the tie-break, as ONE integer:
    (time x WAIT_BASE + wait) x 2^68 + (2^68 - 1 - tie_break_key), with WAIT_BASE above every
    encoded configuration's wait. Minimising it is the lexicographic order exactly (each digit
    stays below its base over the encoded configurations), and proving one objective takes a
    third of the checks of three.

    The probe is the best configuration not yet ranked (earlier ranks are blocked in the
    solver): a first guess only; Z3 still proves "strictly better" unsat.
    """
    wait_base = max(s.total_math_wait_ns for s in predictions.values()) + 1

    def rank_value(key: tuple[int, int, int]) -> int:
        overall, wait, negated_tie_break = key
        return (overall * wait_base + wait) * _KEY_SPAN + _KEY_SPAN - 1 + negated_tie_break

    values = {t: rank_value(objective_key(s)) for t, s in predictions.items()}

    def probe(_: tuple[int, ...]) -> int | None:
        return min((v for t, v in values.items() if t not in blocked), default=None)

    tie_break = tie_break_key(enc.tile_m, enc.tile_n, enc.tile_k, enc.buffer_depth)
    term = (enc.overall_time_ns * wait_base + enc.total_math_wait_ns) * _KEY_SPAN + (
        _KEY_SPAN - 1 - tie_break
    )
    return [Objective(term, minimize=True, probe=probe)]


def _z3_result(
    instance: Instance,
    candidates: Sequence[Tiling],
    predictions: dict[Tiling, Prediction],
    ranks: int,
    deadline: Deadline,
    summary: SearchSummary,
    feasible: int,
) -> TilingResult:
    """Z3's ranks among ``candidates`` (the ``feasible`` configurations the presolve left);
    cut short by the deadline, the proven ranks followed by the best of the rest by the closed
    form; rank 1 simulated stage by stage."""
    ranking = rank_encoded(
        instance, Configurations.of_tilings(candidates), predictions, deadline.at, ranks
    )
    ranked = [predictions[t] for t in ranking.found]
    if not ranking.proven:
        done = set(ranking.found)
        rest = sorted((s for t, s in predictions.items() if t not in done), key=objective_key)
        ranked += rest[: max(0, ranks - len(ranked))]
    return result_of(
        "optimal" if ranking.proven else "timeout",
        instance.ranked([s.tiling for s in ranked]),
        summary,
        deadline,
        checks=ranking.checks,
        encoded_configurations=len(candidates),
        pruned_configurations=feasible - len(candidates),
        mode=SolverMode.Z3_SEARCH,
    )


# --- a search space --------------------------------------------------------------------------


def optimize_per_configuration(
    problem: TilingProblem, *, top_k: int, deadline: Deadline, mode: SolverMode
) -> TilingResult:
    """:func:`solver.optimize.optimize_tiling` under ``problem.model`` (module docstring)."""
    instance = Instance(problem.model, problem)
    return _answer(mode, _certified_space, z3_search_space, instance, problem, top_k, deadline)


def _answer(
    mode: SolverMode,
    certified: Callable[_P, TilingResult],
    z3_search: Callable[_P, TilingResult],
    *args: _P.args,
    **kwargs: _P.kwargs,
) -> TilingResult:
    """The answer of ``mode`` (both solves take ``args``); the Z3 search also when the scorer
    overflows (times beyond int64 ns: only the Python-int path represents them)."""
    if SolverMode(mode) is SolverMode.CERTIFIED:
        try:
            return certified(*args, **kwargs)
        except ScoreOverflow:
            _log.info("scorer overflow; answering with the Z3 search")
    return z3_search(*args, **kwargs)


def _infeasible(total: int, rejected: dict[str, int]) -> InfeasibleSearchSpace:
    return InfeasibleSearchSpace(
        f"all {total} candidates need more shared memory per CTA than the device "
        "allows; allow smaller tiles or buffer depths, or set "
        "search_space.enforce_shared_memory to false",
        rejected,
    )


def _rejected(instance: Instance, per_block: int, per_sm: int) -> dict[str, int]:
    """What each hardware constraint rejects: the shared memory per CTA, then the model's
    residency on an SM (only for a model that has one)."""
    rejected = {SHARED_MEMORY_CONSTRAINT: per_block}
    if instance.model.residency_constraint is not None:
        rejected[instance.model.residency_constraint] = per_sm
    return rejected


def space_configurations(problem: TilingProblem) -> Iterator[Configurations]:
    """The configurations of ``problem.space`` (tile sizes and depths) whose circular buffer
    fits the shared memory per CTA when the space enforces it, in chunks."""
    space = problem.space
    return enumerate_configurations(
        space.tile_m,
        space.tile_n,
        space.tile_k,
        space.buffer_depth,
        problem.element_bytes,
        _per_block(problem),
    )


def _per_block(problem: TilingProblem) -> int | None:
    space = problem.space
    return problem.machine.shared_memory_per_block_bytes if space.enforce_shared_memory else None


def z3_search_space(
    instance: Instance, problem: TilingProblem, top_k: int, deadline: Deadline
) -> TilingResult:
    """The pure Z3 search over the space: the closed form's presolve, then rank by rank."""
    tilings = list(problem.space.tilings())
    per_block = _per_block(problem)
    fits = [t for t in tilings if shared_memory_fits(t, problem.element_bytes, per_block)]
    feasible = [fits[int(i)] for i in instance.resident(Configurations.of_tilings(fits))]
    rejected = _rejected(instance, len(tilings) - len(fits), len(fits) - len(feasible))
    summary = SearchSummary(len(tilings), len(feasible), rejected)
    if not feasible:
        raise _infeasible(len(tilings), rejected)
    closed = {t: instance.closed_form(t) for t in feasible}
    # Presolve: the top_k-th smallest time bounds every rank; ties at it are kept.
    kth = sorted(s.overall_time_ns for s in closed.values())[min(top_k, len(closed)) - 1]
    survivors = [t for t in feasible if closed[t].overall_time_ns <= kth]
    predictions = {t: closed[t] for t in survivors}
    ranks = min(top_k, len(feasible))
    return _z3_result(instance, survivors, predictions, ranks, deadline, summary, len(feasible))


def _certified_space(
    instance: Instance, problem: TilingProblem, top_k: int, deadline: Deadline
) -> TilingResult:
    space = problem.space
    fitting = kept = 0
    raster = len(space.group_m) * len(space.split_k)

    def chunks() -> Iterator[Configurations]:
        nonlocal fitting, kept
        for chunk in space_configurations(problem):
            fitting += chunk.count * raster
            for part in with_raster(chunk, space, problem.shape.k):
                kept += part.count
                yield part

    ranking = rank_scored(instance, chunks(), top_k, deadline.at)
    if ranking.complete:
        rejected = _rejected(instance, space.size - fitting, ranking.not_resident)
        if fitting > kept:
            rejected[SPLIT_K_CONSTRAINT] = fitting - kept
        summary = SearchSummary(space.size, ranking.scored, rejected)
        if not ranking.scored:
            raise _infeasible(space.size, rejected)
    else:
        # cut short: count what the scorer enumerated
        summary = SearchSummary(space.size, space.size, {})
    return _certified(
        instance,
        ranking,
        summary,
        deadline,
        lambda: z3_search_space(instance, problem, top_k, deadline),
    )


def with_raster(chunk: Configurations, space: SearchSpace, k: int) -> Iterator[Configurations]:
    """``chunk`` under every (group_m, split_k) of ``space`` (the defaults: ``chunk`` itself),
    leaving out split_k above the k tiles, ceil(k / tile_k) (a slice without a stage). The
    raster variants come in one chunk: a scorer's cost is mostly per call (the L2 term's
    traffic of the space's distinct tiles), so one call for every variant is the cheap one."""
    if space.group_m == (1,) and space.split_k == (1,):
        yield chunk
        return
    k_tiles = -(-k // chunk.tile_k)
    parts = []
    for group_m in space.group_m:
        for split_k in space.split_k:
            rows = np.flatnonzero(split_k <= k_tiles)
            if rows.shape[0]:
                part = chunk.take(rows)
                parts.append(
                    dataclasses.replace(
                        part,
                        group_m=np.full(part.count, group_m, dtype=np.int64),
                        split_k=np.full(part.count, split_k, dtype=np.int64),
                    )
                )
    if parts:
        yield Configurations.concat(parts)


def _certified(
    instance: Instance,
    ranking: ScoredRanking,
    summary: SearchSummary,
    deadline: Deadline,
    z3_search: Callable[[], TilingResult],
) -> TilingResult:
    """The scorer's ranking, rank 1 checked against the simulator and certified by Z3."""
    ranked = instance.ranked(ranking.configs.tilings())
    if not ranked:
        raise SolverTimeout(deadline.time_limit_s)
    check_scores(ranked, ranking.overall_time_ns, ranking.total_math_wait_ns)
    certificate = None
    if ranking.complete:
        certificate = certify(
            instance, ranked[0], ranking.hopeful, deadline.at, ranking.hopeful_floors
        )
        if certificate.better is not None:
            return mismatch_answer(certificate, ranked[0], ranking.scored, z3_search)
    checks = certificate.checks if certificate is not None else ()
    proven = bool(checks) and all(c.outcome == "unsat" for c in checks)
    status = "optimal" if proven else "timeout"
    return certified_result_of(status, ranked, summary, deadline, certificate, ranking.scored)


# --- an explicit candidate list --------------------------------------------------------------


def rank_listed(
    problem: CandidateProblem,
    feasible: list[Tiling],
    ranks: int,
    deadline: Deadline,
    mode: SolverMode,
) -> TilingResult:
    """Rank ``feasible`` (distinct, each fitting a CTA and an SM) under ``problem.model`` and
    prove the best among them; the caller sets the summary."""
    instance = Instance(problem.model, problem)
    return _answer(mode, _certified_listed, _z3_listed, instance, feasible, ranks, deadline)


def _certified_listed(
    instance: Instance, feasible: list[Tiling], ranks: int, deadline: Deadline
) -> TilingResult:
    configs = Configurations.of_tilings(feasible)
    ranking = rank_scored(instance, [configs], ranks, deadline.at)
    placeholder = SearchSummary(0, 0, {})
    # every candidate is certified against, not only the hopeful of the space's enumeration
    ranking = dataclasses.replace(ranking, hopeful=configs, hopeful_floors=None, complete=True)
    return _certified(
        instance,
        ranking,
        placeholder,
        deadline,
        lambda: _z3_listed(instance, feasible, ranks, deadline),
    )


def _z3_listed(
    instance: Instance, feasible: list[Tiling], ranks: int, deadline: Deadline
) -> TilingResult:
    predictions = dict(zip(feasible, instance.ranked(feasible), strict=True))
    placeholder = SearchSummary(0, 0, {})
    return _z3_result(instance, feasible, predictions, ranks, deadline, placeholder, len(feasible))
