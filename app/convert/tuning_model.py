"""The one place a tuning table asks the GeMM-WS pipeline model anything (worker side).

Two questions, both about a fixed list of distinct tilings of one (N, K) on one device:

* :meth:`TableModel.rank` -- at one M, the certified ranking of the feasible tilings, as
  ``POST /optimize-tiling`` answers a candidate list: the Z3-proven optimum, and for the first
  ``top_k`` their ``probability_best`` and 10-90 % interval under the device's belief;
* :meth:`TableModel.times` -- at many M, the point prediction of every feasible tiling (the
  same exact scorer the certificate checks), for the loss bound between keys;
* :meth:`TableModel.simulate_ns` -- one tiling at one M by the model's event simulator, stage
  by stage (independent of the scorer: what tests compare the bound with).

Everything else about tables (choice per key, max_distinct_configs, loss bound, file formats)
lives in solver/tuning_table and sees only integer nanoseconds by tiling index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from app.convert import explore
from app.convert.candidates import prepare
from app.schemas.optimize import CandidateIn, OptimizeTilingRequest
from device_profiles import DeviceProfile
from device_profiles.schema import PipelineModelName
from perfmodel.errors import ModelInputError
from perfmodel.gemm_ws import GemmShape, Tiling
from perfmodel.gemm_ws_scoring import Configurations, Figures, ScoreOverflow
from perfmodel.pipeline import Prediction
from solver.explore import scorer
from solver.problem import CandidateProblem, Rejection


@dataclass(frozen=True, slots=True)
class KeyRanking:
    """One M's answer, by feasible tiling (the model's ``tilings`` order); the uncertainty
    of the tilings ranked (None for the others)."""

    m: int
    #: index of the Z3-certified optimum
    best: int
    #: the optimum was proven (every certificate check unsat, status optimal)
    certified: bool
    z3_checks: int
    probability_best: tuple[float | None, ...]
    interval_low_us: tuple[float | None, ...]
    interval_high_us: tuple[float | None, ...]


class TableModel:
    """The pipeline model's view of ``tilings`` (distinct) for ``template``'s (N, K), dtype,
    device and pipeline model; ``template.m`` is ignored."""

    def __init__(
        self,
        template: OptimizeTilingRequest,
        profile: DeviceProfile | None,
        tilings: Sequence[Tiling],
    ) -> None:
        listed = [
            CandidateIn(
                tile_m=t.tile_m, tile_n=t.tile_n, tile_k=t.tile_k, buffer_depth=t.buffer_depth
            )
            for t in tilings
        ]
        self._request = template.model_copy(
            update={"candidates": listed, "search_space": None, "top_k": None}
        )
        self._profile = profile
        prepared = prepare(self._request, profile)
        problem = prepared.problem
        assert isinstance(problem, CandidateProblem)
        self.device = prepared.device
        self._problem = problem
        self.pipeline_model: PipelineModelName = problem.model.name
        self.tilings: tuple[Tiling, ...] = ()
        self.rejected: tuple[Rejection, ...] = ()
        self.rejected_counts: dict[str, int] = {}
        self._configs: Configurations | None = None

    def _at(self, m: int) -> CandidateProblem:
        shape = GemmShape(m, self._problem.shape.n, self._problem.shape.k)
        return dataclasses.replace(self._problem, shape=shape)

    def rank(self, m: int, time_limit_s: float, top_k: int | None = None) -> KeyRanking:
        """The certified ranking at ``m``, its first ``top_k`` (None: all) with their
        uncertainty (the first call fixes ``tilings``: the feasible ones; a list with none is
        InfeasibleSearchSpace naming ``candidates``)."""
        request = self._request.model_copy(update={"m": m, "top_k": top_k})
        solved, ranking = explore.solve_candidates(
            request, self._profile, self._at(m), time_limit_s
        )
        if not self.tilings:
            self.tilings = tuple(ranking.members)
            self.rejected = ranking.infeasible
            self.rejected_counts = dict(ranking.result.summary.rejected)
        index = {t: i for i, t in enumerate(self.tilings)}
        result = solved.result
        count = len(self.tilings)
        probability: list[float | None] = [None] * count
        low: list[float | None] = [None] * count
        high: list[float | None] = [None] * count
        ranked: Sequence[Prediction] = result.candidates
        for rank, sim in enumerate(ranked):
            if solved.uncertainty:
                i = index[sim.tiling]
                probability[i], low[i], high[i] = solved.uncertainty[rank]
        certificate = result.statistics.certificate
        return KeyRanking(
            m=m,
            best=index[result.best.tiling],
            certified=result.status == "optimal"
            and bool(certificate)
            and all(c.outcome == "unsat" for c in certificate),
            z3_checks=result.statistics.checks,
            probability_best=tuple(probability),
            interval_low_us=tuple(low),
            interval_high_us=tuple(high),
        )

    def simulate_ns(self, tiling: Tiling, m: int) -> int:
        """The event simulator's overall time of ``tiling`` at ``m``, ns."""
        problem = self._at(m)
        return problem.model.simulate(
            problem.shape, tiling, problem.machine, problem.element_bytes
        ).overall_time_ns

    def times(self, ms: Sequence[int]) -> dict[int, list[int]]:
        """Point predictions (ns) of every feasible tiling at each M of ``ms``."""
        if self._configs is None:
            self._configs = Configurations.of(
                *([getattr(t, f) for t in self.tilings] for f in Configurations.__slots__)
            )
        configs = self._configs
        figures = Figures.of_machine(self._problem.machine)
        out: dict[int, list[int]] = {}
        for m in ms:
            problem = self._at(m)
            score = scorer(problem.model, problem.shape, configs, problem.element_bytes)
            try:
                out[m] = [int(t) for t in score(figures).overall_time_ns[0]]
            except ScoreOverflow:
                raise ModelInputError(
                    "device_params", "predicted times exceed the scorer's range (2^60 ns)"
                ) from None
        return out
