"""The certified optimizer of the async-copy variant (numpy; worker side only).

The same two steps as solver/optimize.py's ``certified`` mode, for eq. (A1)-(A3)
(docs/model-notes.md, "GeMM-WS async-copy"):

1. the exact vectorised scorer (perfmodel/gemm_ws_async_array.py: the closed form, equal to the
   stage-by-stage simulator) evaluates every configuration of the space that fits an SM, in
   chunks with the deadline checked between them, and keeps the ``top_k`` best in the
   optimizer's lexicographic order; the best is the incumbent, re-simulated stage by stage;
2. ONE Z3 check over the encoding of (A1)-(A3) (solver/encoding_async.py) asks whether any
   configuration is lexicographically better than the incumbent; "unsat" proves it optimal.
   Only configurations whose lower bound (solver/bounds_async.py, sound paths of the event
   graph, independent of the scorer) does not exceed the incumbent's time are encoded.

A "sat" (Z3 found a better configuration) is a bug in the scorer or the encoding: it raises
:class:`solver.errors.CertificateMismatch` when ``solver.optimize.STRICT_CERTIFICATE`` is set
(tests), else the answer comes from the pure Z3 search and the mismatch is counted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import z3

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling
from perfmodel.gemm_ws_async import (
    AsyncDurations,
    AsyncDurationTable,
    AsyncSimulation,
    SmLimits,
    simulate_async,
    simulate_async_closed_form,
)
from perfmodel.gemm_ws_async_array import ctas_per_sm_array, score_async_configurations
from perfmodel.gemm_ws_scoring import (
    Configurations,
    Figures,
    IntArray,
    enumerate_configurations,
    lexicographic_order,
)
from solver import optimize
from solver.bounds_async import async_plan, may_beat
from solver.encoding_async import AsyncConfig, encode_async
from solver.errors import CertificateMismatch, InfeasibleSearchSpace, SolverTimeout
from solver.factory import make_solver
from solver.optimize import (
    CERTIFICATE_CLAIM,
    Certificate,
    CertificateCheck,
    SolverMode,
    better_than,
)
from solver.optimize_async import (
    AsyncTilingProblem,
    AsyncTilingResult,
    async_result,
    effective_limits,
    z3_search_async,
)
from solver.search_space import SearchSummary

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AsyncRanking:
    """The scorer's ``top_k`` best of a set of configurations, in the optimizer's order, and
    every configuration that may beat its best (a superset of those the certificate needs)."""

    configs: Configurations
    overall_time_ns: IntArray
    total_math_wait_ns: IntArray
    hopeful: Configurations
    scored: int
    #: False when the deadline stopped the enumeration
    complete: bool
    #: configurations the per-SM limits reject (one CTA does not fit an SM)
    not_resident: int


def _concat(parts: Sequence[Configurations]) -> Configurations:
    if not parts:
        return Configurations.of([], [], [], [])
    return Configurations(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in Configurations.__slots__)
    )


def rank_async(
    shape: GemmShape,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    chunks: Iterable[Configurations],
    top_k: int,
    deadline: float,
) -> AsyncRanking:
    """Score ``chunks`` and keep the ``top_k`` best; the deadline is checked between chunks
    (the first always runs). Configurations that do not fit an SM are left out and counted."""
    figures = Figures.of_machine(machine)
    kept = Configurations.of([], [], [], [])
    kept_time = kept_wait = np.zeros(0, dtype=np.int64)
    hopeful: list[tuple[Configurations, IntArray]] = []
    scored, not_resident, complete = 0, 0, True
    for chunk in chunks:
        if scored and time.perf_counter() > deadline:
            complete = False
            break
        resident = np.flatnonzero(ctas_per_sm_array(limits, element_bytes, chunk) >= 1)
        not_resident += chunk.count - resident.shape[0]
        chunk = chunk.take(resident)
        if not chunk.count:
            continue
        scores = score_async_configurations(shape, chunk, figures, limits, element_bytes)
        times, waits = scores.overall_time_ns[0], scores.total_math_wait_ns[0]
        scored += chunk.count
        merged = _concat([kept, chunk])
        all_times = np.concatenate([kept_time, times])
        all_waits = np.concatenate([kept_wait, waits])
        order = lexicographic_order(all_times, all_waits, merged)[:top_k]
        kept, kept_time, kept_wait = merged.take(order), all_times[order], all_waits[order]
        # the best so far bounds the final incumbent's time from above: a configuration whose
        # floor exceeds it is never encoded
        best = int(kept_time[0])
        floors = async_plan(shape, machine, limits, element_bytes, chunk).overall_time_floor_ns
        hopeful.append((chunk, floors))
        hopeful = [
            (c.take(index), f[index])
            for c, f in hopeful
            if (index := np.flatnonzero(f <= best)).shape[0]
        ]
    return AsyncRanking(
        kept,
        kept_time,
        kept_wait,
        _concat([c for c, _ in hopeful]),
        scored,
        complete,
        not_resident,
    )


def configs_of(tilings: Sequence[Tiling]) -> Configurations:
    return Configurations.of(*([getattr(t, f) for t in tilings] for f in Configurations.__slots__))


def tilings_of(configs: Configurations) -> list[Tiling]:
    columns = [getattr(configs, f).tolist() for f in Configurations.__slots__]
    return [Tiling(*values) for values in zip(*columns, strict=True)]


def encoded_configs(
    shape: GemmShape,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    configs: Configurations,
) -> list[AsyncConfig]:
    """The encoding's per-configuration constants (solver/encoding_async.py)."""
    plan = async_plan(shape, machine, limits, element_bytes, configs)
    out = []
    for i, tiling in enumerate(tilings_of(configs)):
        c, r = int(plan.ctas_per_sm[i]), int(plan.partial_wave_ctas[i])
        issue, math = int(plan.issue_work_ns[i]), int(plan.math_work_ns[i])

        def durations(share: int, issue: int = issue, math: int = math) -> AsyncDurations:
            return AsyncDurations(
                share, share * issue, plan.latency_ns, share * math + plan.math_startup_ns
            )

        out.append(
            AsyncConfig(
                tiling=tiling,
                stages=int(plan.stages[i]),
                full_waves=int(plan.full_waves[i]),
                ctas_per_sm=c,
                partial_wave_ctas=r,
                full=durations(c),
                partial=durations(max(r, 1)),
            )
        )
    return out


def certify_async(
    shape: GemmShape,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    incumbent: AsyncSimulation,
    configs: Configurations,
    deadline: float,
) -> Certificate:
    """Ask Z3 whether any of ``configs`` (each fitting an SM) beats ``incumbent``
    lexicographically (§3.2 objectives, then the tie-break) over the encoding of (A1)-(A3);
    "unsat" proves the incumbent optimal among them. Only configurations the lower bounds on
    time and wait (solver/bounds_async.py, :func:`may_beat`) leave able to beat it are encoded;
    the incumbent itself always is (an encoding is never empty)."""
    plan = async_plan(shape, machine, limits, element_bytes, configs)
    hopeful = configs.take(
        np.flatnonzero(
            may_beat(
                plan,
                configs,
                incumbent.overall_time_ns,
                incumbent.total_math_wait_ns,
                incumbent.tiling,
            )
        )
    )
    tilings = tilings_of(hopeful)
    if incumbent.tiling not in tilings:
        hopeful = _concat([hopeful, configs_of([incumbent.tiling])])
    encoded = encoded_configs(shape, machine, limits, element_bytes, hopeful)
    table = AsyncDurationTable(machine)
    enc = encode_async(encoded, table.epilogue_ns, table.init_ns, per_configuration=True)
    solver = make_solver(timeout_ms=max(1, int((deadline - time.perf_counter()) * 1000)))
    solver.from_string(enc.smtlib)
    solver.add(better_than(enc, incumbent))
    outcome = solver.check() if time.perf_counter() < deadline else z3.unknown
    check = CertificateCheck(CERTIFICATE_CLAIM, str(outcome))
    better = enc.tiling_of(solver.model()) if outcome == z3.sat else None
    return Certificate((check,), better, len(encoded), configs.count - len(encoded))


def optimize_tiling_async_certified(
    problem: AsyncTilingProblem, *, top_k: int = 5, time_limit_s: float = 10.0
) -> AsyncTilingResult:
    """The scorer's ranking of the whole space, its best certified by Z3 (module docstring)."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    space, machine = problem.space, problem.machine
    limits = effective_limits(problem)
    per_block = machine.shared_memory_per_block_bytes if space.enforce_shared_memory else None
    fitting = 0

    def chunks() -> Iterator[Configurations]:
        nonlocal fitting
        for chunk in enumerate_configurations(
            space.tile_m,
            space.tile_n,
            space.tile_k,
            space.buffer_depth,
            problem.element_bytes,
            per_block,
        ):
            fitting += chunk.count
            yield chunk

    ranking = rank_async(
        problem.shape, machine, limits, problem.element_bytes, chunks(), top_k, deadline
    )
    if ranking.complete:
        over_block = space.size - fitting
        summary = SearchSummary(
            candidates_considered=space.size,
            feasible=ranking.scored,
            rejected={
                "shared_memory_per_block": over_block,
                "shared_memory_per_sm": ranking.not_resident,
            },
        )
        if not ranking.scored:
            raise InfeasibleSearchSpace(
                f"all {space.size} candidates need more shared memory per CTA than the device "
                "allows; allow smaller tiles or buffer depths, or set "
                "search_space.enforce_shared_memory to false",
                summary.rejected,
            )
    else:
        # cut short: count what the scorer enumerated
        summary = SearchSummary(space.size, space.size, {})
    return _certified(problem, limits, ranking, summary, top_k, time_limit_s, started)


def simulate_ranked_with(
    shape: GemmShape,
    machine: GemmWsMachine,
    limits: SmLimits,
    element_bytes: int,
    tilings: Sequence[Tiling],
) -> list[AsyncSimulation]:
    """The first tiling simulated stage by stage (the reference the scorer's best is checked
    against; its events feed the timeline), the others by the O(1) closed form."""
    table = AsyncDurationTable(machine)
    return [
        (simulate_async if i == 0 else simulate_async_closed_form)(
            shape, t, machine, limits, element_bytes, table
        )
        for i, t in enumerate(tilings)
    ]


def check_scores(ranked: Sequence[AsyncSimulation], times: IntArray, waits: IntArray) -> None:
    """The stage-by-stage simulator is the reference: a scorer that disagrees is a bug."""
    for sim, time_ns, wait_ns in zip(ranked, times, waits, strict=True):
        if (sim.overall_time_ns, sim.total_math_wait_ns) != (int(time_ns), int(wait_ns)):
            raise CertificateMismatch(
                f"scorer gives {int(time_ns)} ns / {int(wait_ns)} ns for {sim.tiling}, the "
                f"simulator {sim.overall_time_ns} ns / {sim.total_math_wait_ns} ns"
            )


def _certified(
    problem: AsyncTilingProblem,
    limits: SmLimits,
    ranking: AsyncRanking,
    summary: SearchSummary,
    top_k: int,
    time_limit_s: float,
    started: float,
) -> AsyncTilingResult:
    deadline = started + time_limit_s
    ranked = simulate_ranked_with(
        problem.shape, problem.machine, limits, problem.element_bytes, tilings_of(ranking.configs)
    )
    if not ranked:
        raise SolverTimeout(time_limit_s)
    check_scores(ranked, ranking.overall_time_ns, ranking.total_math_wait_ns)
    certificate = None
    if ranking.complete:
        certificate = certify_async(
            problem.shape,
            problem.machine,
            limits,
            problem.element_bytes,
            ranked[0],
            ranking.hopeful,
            deadline,
        )
        if certificate.better is not None:
            return mismatch_answer(
                certificate,
                ranked[0],
                ranking.scored,
                lambda: z3_search_async(problem, top_k=top_k, time_limit_s=time_limit_s),
            )
    checks = certificate.checks if certificate is not None else ()
    proven = bool(checks) and all(c.outcome == "unsat" for c in checks)
    return async_result(
        "optimal" if proven else "timeout",
        ranked,
        summary,
        started,
        checks=len(checks),
        encoded_tile_triples=certificate.encoded_tile_triples if certificate else 0,
        pruned_tile_triples=certificate.pruned_tile_triples if certificate else 0,
        mode=SolverMode.CERTIFIED,
        configurations_scored=ranking.scored,
        certificate=checks,
    )


def mismatch_answer(
    certificate: Certificate,
    incumbent: AsyncSimulation,
    scored: int,
    z3_search: Callable[[], AsyncTilingResult],
) -> AsyncTilingResult:
    """Z3 refuted the scorer's incumbent: raise in strict mode, else answer from the pure Z3
    search and count the mismatch."""
    message = (
        f"Z3 found {certificate.better} lexicographically better than the scorer's incumbent "
        f"{incumbent.tiling} ({incumbent.overall_time_ns} ns) under async-copy"
    )
    if optimize.STRICT_CERTIFICATE:
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
