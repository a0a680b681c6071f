"""The async-copy pipeline model, eq. (A1)-(A3) (docs/model-notes.md, "GeMM-WS async-copy"),
behind :class:`perfmodel.pipeline.PipelineModel`, in one package: the recurrences and closed
form (recurrences.py, no numpy: the service process imports it), the vectorised scorer
(scoring.py), the sound bounds and per-configuration constants (bounds.py), the calibration's
closed form (calibration.py). Its Z3 encoding is the solver's (solver/encodings/async_copy.py),
its timeline picture render's (render/pipeline.py). numpy is imported where a member runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling, ns_to_us
from perfmodel.pipeline import (
    FigureInfo,
    GemmOnMachine,
    RunsToFit,
    answer_fields,
    timeline_row,
)
from perfmodel.pipelines.async_copy.recurrences import (
    AsyncDurationTable,
    AsyncSimulation,
    simulate_async,
)
from perfmodel.pipelines.paper import GEMM_WS_FIGURE_INFO

if TYPE_CHECKING:
    from perfmodel.gemm_ws_scoring import Configurations, Figures, IntArray, Scores
    from perfmodel.pipelines.async_copy.calibration import AsyncResidualModel

#: the name requests and profiles give this model
ASYNC_COPY = "async-copy"


@dataclass(frozen=True, slots=True)
class AsyncCopyPipeline:
    """Eq. (A1)-(A3) on SMs of ``limits`` (CTAs sharing an SM share its throughputs)."""

    limits: SmLimits = field(default_factory=SmLimits)
    name: str = ASYNC_COPY
    calibration_method: str = (
        "async-copy closed form M(S) = d + lambda + max((S-1) max(d, T), K (d + lambda + T) "
        "+ (S-1-K D) max(d, T)) with the CTAs per SM of each run, exact Jacobian per regime"
    )
    figures: tuple[FigureInfo, ...] = GEMM_WS_FIGURE_INFO
    residency_constraint: str | None = "shared_memory_per_sm"
    regime_runs: str = "runs"

    def closed_form(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> AsyncSimulation:
        table = async_table(machine)
        return simulate_async(
            shape, tiling, machine, self.limits, element_bytes, table, events=False
        )

    def simulate(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> AsyncSimulation:
        return simulate_async(
            shape, tiling, machine, self.limits, element_bytes, async_table(machine)
        )

    def resident(self, configs: Configurations, element_bytes: int) -> Any:
        from perfmodel.pipelines.async_copy.scoring import ctas_per_sm_array

        return ctas_per_sm_array(self.limits, element_bytes, configs) >= 1

    def residency_rejection(self, tiling: Tiling, element_bytes: int) -> str | None:
        smem = tiling.shared_memory_bytes(element_bytes)
        if self.limits.ctas_per_sm(smem) >= 1:
            return None
        return (
            f"circular buffer of {smem} bytes exceeds the "
            f"{self.limits.shared_memory_per_sm_bytes} bytes of shared memory of one SM: "
            "no CTA fits"
        )

    def score(
        self, shape: GemmShape, configs: Configurations, figures: Figures, element_bytes: int
    ) -> Scores:
        from perfmodel.pipelines.async_copy.scoring import score_async_configurations

        return score_async_configurations(shape, configs, figures, self.limits, element_bytes)

    def bounds(self, gemm: GemmOnMachine, configs: Configurations) -> tuple[IntArray, IntArray]:
        from perfmodel.pipelines.async_copy.bounds import async_plan

        plan = async_plan(gemm.shape, gemm.machine, self.limits, gemm.element_bytes, configs)
        return plan.overall_time_floor_ns, plan.total_math_wait_floor_ns

    def residual_model(self, fit: RunsToFit) -> AsyncResidualModel:
        from perfmodel.pipelines.async_copy.calibration import async_closed_form_model

        return async_closed_form_model(fit.base, fit.runs, fit.names, self.limits, fit.ratios)

    def run_time_ns(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, run: Any
    ) -> int:
        from perfmodel.gemm_ws import ELEMENT_BYTES
        from perfmodel.pipelines.async_copy.calibration import run_limits

        limits, element_bytes = run_limits(self.limits, run), ELEMENT_BYTES[run.dtype]
        table = async_table(machine)
        sim = simulate_async(shape, tiling, machine, limits, element_bytes, table, events=False)
        return sim.overall_time_ns

    def answer_fields(self, prediction: Any, element_bytes: int) -> dict[str, object]:
        sim: AsyncSimulation = prediction
        d = sim.durations
        load_a_ns = a_share_ns(sim.tiling, d.issue_ns)
        return answer_fields(
            (load_a_ns, d.issue_ns - load_a_ns),
            d.math_ns,
            sim.total_math_wait_ns,
            sim.bound.value,
            (sim.ctas_per_sm, sim.stages_in_flight),
            d.latency_ns,
        )

    def timeline_rows(self, prediction: Any) -> list[dict[str, float | int | None]]:
        sim: AsyncSimulation = prediction
        a_share = a_share_ns(sim.tiling, sim.durations.issue_ns)
        return [
            timeline_row(
                e.stage,
                (e.issue_start_ns, e.issue_start_ns + a_share),
                e.math_start_ns,
                e.math_wait_ns,
            )
            | {"arrival_us": ns_to_us(e.arrival_ns)}
            for e in sim.events
        ]


#: one machine's duration table, built once (exact rationals)
async_table = functools.lru_cache(maxsize=64)(AsyncDurationTable)


def a_share_ns(tiling: Tiling, issue_ns: int) -> int:
    """The A tile's share of one stage's issue time, by element count (rounded half up)."""
    a = tiling.tile_m * tiling.tile_k
    total = a + tiling.tile_k * tiling.tile_n
    return (2 * issue_ns * a + total) // (2 * total)
