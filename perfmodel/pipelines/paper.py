"""The paper's pipeline model, eq. (1)-(3) (warp-specialization-gemm-model.txt §2), behind
:class:`perfmodel.pipeline.PipelineModel`: the recurrences and the closed form live in
perfmodel/gemm_ws.py, the scorer in perfmodel/gemm_ws_scoring.py; the per-triple cuts and the
Z3 encoding are the solver's (solver/bounds.py, solver/encoding.py, served for this model by
solver/encodings/paper.py), the picture is render's (render/timeline.py, through
render/pipeline.py). Heavy parts (numpy) are imported where a member runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    us_to_ns,
)
from perfmodel.pipeline import (
    FigureInfo,
    GemmOnMachine,
    RunsToFit,
    answer_fields,
    timeline_row,
)

if TYPE_CHECKING:
    from perfmodel.calibration.gemm_ws_model import GemmWsResidualModel
    from perfmodel.gemm_ws_scoring import Configurations, Figures, IntArray, Scores

#: the name requests and profiles give this model
PAPER = "paper"

#: the six §2.2 figures every GeMM-WS model reads (priors: device_profiles/priors.py)
GEMM_WS_FIGURE_INFO = (
    FigureInfo("load_throughput_elements_per_us", "elements/us", "load_throughput_elements_per_us"),
    FigureInfo("compute_throughput_macs_per_us", "MACs/us", "compute_throughput_macs_per_us"),
    FigureInfo("load_startup_latency_us", "us", "load_startup_latency_us"),
    FigureInfo("compute_startup_latency_us", "us", "compute_startup_latency_us"),
    FigureInfo("t_init_us", "us", "t_init_us"),
    FigureInfo("t_epilogue_us", "us", "t_epilogue_us"),
)


@dataclass(frozen=True, slots=True)
class PaperPipeline:
    """Eq. (1)-(3) with the wave time of ``wave_model`` (docs/model-notes.md "wave time")."""

    wave_model: WaveTimeModel = WaveTimeModel.PAPER
    name: str = PAPER
    calibration_method: str = "closed form Sm(S) = L + (S-1) max(L, T), exact Jacobian per regime"
    figures: tuple[FigureInfo, ...] = GEMM_WS_FIGURE_INFO
    residency_constraint: str | None = None
    regime_runs: str = "runs with buffer depth >= 2"

    def closed_form(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> Simulation:
        return simulate_closed_form(
            shape, tiling, machine, self.wave_model, duration_table(machine)
        )

    def simulate(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> Simulation:
        return simulate(shape, tiling, machine, self.wave_model)

    def resident(self, configs: Configurations, element_bytes: int) -> Any:
        import numpy as np

        # one CTA per SM: whatever fits the shared memory per CTA runs
        return np.ones(configs.count, dtype=bool)

    def residency_rejection(self, tiling: Tiling, element_bytes: int) -> str | None:
        return None

    def score(
        self, shape: GemmShape, configs: Configurations, figures: Figures, element_bytes: int
    ) -> Scores:
        from perfmodel.gemm_ws_scoring import score_configurations

        return score_configurations(shape, configs, figures, self.wave_model)

    def bounds(self, gemm: GemmOnMachine, configs: Configurations) -> tuple[IntArray, IntArray]:
        """solver/bounds.py's cuts per configuration: Sm(S) >= max(L + (S-1) T, S L), and
        L + (S-1)(L + T) at depth 1 (eq. 1 serialises load and MATH)."""
        import numpy as np

        from perfmodel.gemm_ws_scoring import rounded_once

        shape, machine = gemm.shape, gemm.machine
        table = duration_table(machine)
        tm, tn, tk, depth = configs.tile_m, configs.tile_n, configs.tile_k, configs.buffer_depth
        load = rounded_once(tm * tk, table.load_ns) + rounded_once(tk * tn, table.load_ns)
        t = rounded_once(tm * tn * tk, table.math_ns)
        stages = -(-shape.k // tk)
        waves = -(-(-(-shape.m // tm) * -(-shape.n // tn)) // machine.sm_count)
        floor = np.where(
            depth == 1,
            load + (stages - 1) * (load + t),
            np.maximum(load + (stages - 1) * t, stages * load),
        )
        tail = t if self.wave_model is WaveTimeModel.INCLUDE_LAST_MATH else 0
        epilogue, init = us_to_ns(machine.t_epilogue_us), us_to_ns(machine.t_init_us)
        time_floor = waves * (floor + tail + epilogue) + init
        wait_floor = waves * (floor - (stages - 1) * t)
        return time_floor.astype(np.int64), wait_floor.astype(np.int64)

    def residual_model(self, fit: RunsToFit) -> GemmWsResidualModel:
        from perfmodel.calibration.gemm_ws_model import closed_form_model

        return closed_form_model(fit.base, fit.runs, fit.names, self.wave_model, fit.ratios)

    def run_time_ns(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, run: Any
    ) -> int:
        return self.closed_form(shape, tiling, machine, ELEMENT_BYTES[run.dtype]).overall_time_ns

    def answer_fields(self, prediction: Any, element_bytes: int) -> dict[str, object]:
        sim: Simulation = prediction
        p, depth = sim.durations, sim.tiling.buffer_depth
        math_bound = not sim.load_bound
        # docs/model-notes.md, async-copy 5: one CTA per SM; the DMA warp runs ahead into
        # every slot only when MATH sets the pace
        in_flight = depth if math_bound else min(depth, 2)
        return answer_fields(
            (p.t_load_a_ns, p.t_load_b_ns),
            p.t_math_ns,
            sim.total_math_wait_ns,
            "math" if math_bound else "load",
            (1, in_flight),
            None,
        )

    def timeline_rows(self, prediction: Any) -> list[dict[str, float | int | None]]:
        sim: Simulation = prediction
        return [
            timeline_row(
                e.stage, (e.load_a_start_ns, e.load_b_start_ns), e.math_start_ns, e.math_wait_ns
            )
            for e in sim.events
        ]


#: one machine's duration table, built once (exact rationals cost ~30 us a figure)
duration_table = functools.lru_cache(maxsize=64)(DurationTable)
