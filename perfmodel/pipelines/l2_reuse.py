"""The L2-reuse memory term in the optimizer: the L2-aware GeMM-WS model of
perfmodel/gemm_ws_memory_model.py (the one bench/bench_real.py measures against real GPUs),
as a pipeline model the certified optimizer searches and Z3 certifies.

One model, one place: the scorer is :meth:`ShapeModel.times_ns`, vectorised over every
configuration of a chunk (traffic per distinct (tile, group_m, split_k, CTAs per SM), then
the closed forms element-wise); the figures are the device's ``MemoryModelFigures`` and
``SmLimits`` (device_profiles/memory.py), so the service's time of a configuration is the
bench's uncalibrated prediction in integer ticks (1 ps), rounded to ns at the end.

Three more views of the same model, each written apart from the scorer:

- simulate: (A1)-(A3) stage by stage (perfmodel/pipelines/async_copy/recurrences.py) on the
  configuration's stage quantities, then its waves one after another, each wave's C store
  draining during the next (the reference the scorer is checked against);
- bounds: per configuration, floors that hold for every solution of (A1)-(A3): M(S) >= S d +
  lambda (the copy engine issues S stages) and M(S) >= d + lambda + (S - 1) T (S MATHs in
  turn), each wave at least its main part;
- the Z3 encoding (solver/encodings/l2_reuse.py, from :meth:`L2ReuseModel.stage_times`):
  (A1)-(A3) per configuration with its quantities written in as numbers, unrolled over 2 D
  stages and extrapolated by the period (async-copy encoding), and the waves' composition in
  linear integer arithmetic; the configuration variables include group_m and split_k, so one
  Z3 check covers every (tile, depth, group_m, split_k) the bounds leave.

Derivation: docs/model-notes.md, "Memory hierarchy, L2 reuse, split-K and tf32" 3 and 3b.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import astuple, dataclass, field
from typing import Any

import numpy as np

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling
from perfmodel.gemm_ws_memory_model import (
    FigureScale,
    MemoryModelFigures,
    Recurrences,
    ShapeModel,
    Space,
    StageTimes,
    ctas_per_sm,
    kernel_times,
    ticks_to_ns,
)
from perfmodel.gemm_ws_scoring import Configurations, Figures, IntArray, Scores
from perfmodel.gemm_ws_traffic import Traffic
from perfmodel.pipeline import (
    FigureInfo,
    GemmOnMachine,
    PipelineModel,
    PipelineResiduals,
    RunsToFit,
)
from perfmodel.pipelines.async_copy import AsyncCopyPipeline
from perfmodel.pipelines.async_copy.recurrences import (
    AsyncDurations,
    AsyncSimulation,
    AsyncStageEvents,
    run_stages,
    steady_state,
)

#: the request's memory-term switch: "dram-stream" (every load at the machine's DRAM share,
#: no memory term) or "l2-reuse" (this module)
MEMORY_MODELS = ("dram-stream", "l2-reuse")


@dataclass(frozen=True, slots=True)
class MemoryPrediction(AsyncSimulation):
    """One configuration under the L2-aware model, as the async-copy model reports one (times
    in ns; ``durations`` and, when simulated, ``events`` of a stage of the first wave, full
    else the partial one; ``wave_time_ns`` to its last MATH's end), and its traffic."""

    dram_bytes: float
    l2_hit_rate: float


@dataclass(frozen=True, slots=True)
class _Evaluated:
    """The model on a set of configurations: ns times and the tick stage quantities."""

    overall_time_ns: IntArray
    total_math_wait_ns: IntArray
    ticks: StageTimes
    traffic: Traffic
    model: ShapeModel
    figures: MemoryModelFigures


def _columns(configs: Configurations) -> tuple[IntArray, ...]:
    """The configurations' columns in the order of :class:`Space`'s fields."""
    return (
        configs.tile_m,
        configs.tile_n,
        configs.tile_k,
        configs.buffer_depth,
        configs.group_m,
        configs.split_k,
    )


def _space(configs: Configurations) -> Space:
    return Space(*_columns(configs))


#: evaluations an L2ReuseModel keeps of spaces, and of single tilings, each
_EVALUATIONS_KEPT = 4


def _digest(configs: Configurations) -> bytes:
    """The configurations' contents, hashed (a few hundred us for 10^5 configurations)."""
    h = hashlib.blake2b(digest_size=16)
    for column in _columns(configs):
        h.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    return h.digest()


@dataclass(frozen=True)
class L2ReuseModel:
    """The L2-aware model (module docstring) for the pipeline ``pipeline`` on the device's
    ``model_figures`` and ``limits``; ``base`` (the same pipeline model without the term)
    answers what the term leaves alone: its name, its calibration, its figures' list."""

    base: PipelineModel
    model_figures: MemoryModelFigures
    limits: SmLimits
    pipeline: Recurrences
    #: the latest evaluations, newest first, by problem and configurations' contents: a
    #: chunk is scored, then bounded, and the explore shortlist scores the same
    #: configurations again, so each is evaluated once per request
    _last: list[tuple[tuple[Any, ...], _Evaluated]] = field(
        default_factory=list, compare=False, repr=False
    )

    # --- the model ---------------------------------------------------------------------------

    def _evaluate(
        self, shape: GemmShape, sm_count: int, element_bytes: int, configs: Configurations
    ) -> _Evaluated:
        key = (shape, sm_count, element_bytes, _digest(configs))
        for seen, evaluated in self._last:
            if seen == key:
                return evaluated
        figures = dataclasses.replace(
            self.model_figures,
            memory=dataclasses.replace(self.model_figures.memory, sm_count=sm_count),
        )
        model = ShapeModel(
            shape.m,
            shape.n,
            shape.k,
            element_bytes,
            _space(configs),
            sm_count,
            self.limits,
            self.pipeline,
        )
        time_ns, wait_ns, ticks, traffic = model.times_ns(figures)
        out = _Evaluated(time_ns, wait_ns, ticks, traffic, model, figures)
        # the single tilings a shortlist simulates do not push a space's evaluation out
        many = configs.count > 1
        same = [e for e in self._last if (e[1].overall_time_ns.shape[0] > 1) == many]
        other = [e for e in self._last if (e[1].overall_time_ns.shape[0] > 1) != many]
        self._last[:] = [(key, out), *same[: _EVALUATIONS_KEPT - 1], *other]
        return out

    def _prediction(
        self,
        shape: GemmShape,
        e: _Evaluated,
        tiling: Tiling,
        time_ns: int,
        wait_ns: int,
        events: bool,
    ) -> MemoryPrediction:
        s = e.ticks
        per_sm, full, partial = (int(v[0]) for v in s.wave_shares())
        share = per_sm if full else partial
        ticks = _durations(s, share)
        shown = AsyncDurations(
            share, *(int(ticks_to_ns(v)) for v in (ticks.issue_ns, ticks.latency_ns, ticks.math_ns))
        )
        stage_events: tuple[AsyncStageEvents, ...] = ()
        if events:
            # the stage's events in ticks, each time (every field but the stage) in ns
            stage_events = tuple(
                AsyncStageEvents(ev.stage, *(int(ticks_to_ns(v)) for v in astuple(ev)[1:]))
                for ev in run_stages(ticks, int(s.stages[0]), int(s.depth[0]))
            )
        bound, in_flight = steady_state(shown, tiling.buffer_depth)
        return MemoryPrediction(
            shape=shape,
            tiling=tiling,
            ctas_per_sm=per_sm,
            durations=shown,
            stages=int(s.stages[0]),
            full_waves=full,
            partial_wave_ctas=partial,
            wave_time_ns=stage_events[-1].math_start_ns + shown.math_ns if stage_events else 0,
            overall_time_ns=time_ns,
            total_math_wait_ns=wait_ns,
            stages_in_flight=in_flight,
            bound=bound,
            events=stage_events,
            dram_bytes=float(e.traffic.dram_bytes[0]),
            l2_hit_rate=float(e.traffic.l2_hit_rate[0]),
        )

    def _one(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> _Evaluated:
        configs = Configurations.of_tilings([tiling])
        return self._evaluate(shape, machine.sm_count, element_bytes, configs)

    # --- PipelineModel -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def calibration_method(self) -> str:
        return self.base.calibration_method

    @property
    def figures(self) -> tuple[FigureInfo, ...]:
        return self.base.figures

    @property
    def regime_runs(self) -> str:
        return self.base.regime_runs

    @property
    def residency_constraint(self) -> str | None:
        return "shared_memory_per_sm"

    def closed_form(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> MemoryPrediction:
        e = self._one(shape, tiling, machine, element_bytes)
        time_ns, wait_ns = int(e.overall_time_ns[0]), int(e.total_math_wait_ns[0])
        return self._prediction(shape, e, tiling, time_ns, wait_ns, events=False)

    def simulate(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> MemoryPrediction:
        """(A1)-(A3) stage by stage, then the waves in turn (module docstring)."""
        e = self._one(shape, tiling, machine, element_bytes)
        time_ticks, wait_ticks = _simulate_waves(e.ticks)
        time_ns, wait_ns = int(ticks_to_ns(time_ticks)), int(ticks_to_ns(wait_ticks))
        return self._prediction(shape, e, tiling, time_ns, wait_ns, events=True)

    def resident(self, configs: Configurations, element_bytes: int) -> Any:
        return ctas_per_sm(_space(configs), element_bytes, self.limits) >= 1

    def residency_rejection(self, tiling: Tiling, element_bytes: int) -> str | None:
        if self.resident(Configurations.of_tilings([tiling]), element_bytes)[0]:
            return None
        return (
            f"a CTA's circular buffer ({tiling.shared_memory_bytes(element_bytes)} bytes) or "
            f"its {tiling.tile_m * tiling.tile_n} fp32 accumulators exceed one SM's shared "
            "memory or register file: no CTA fits"
        )

    def score(
        self, shape: GemmShape, configs: Configurations, figures: Figures, element_bytes: int
    ) -> Scores:
        """Every configuration by the model's closed forms (``figures``' SM count; the other
        figures are the device's memory-model figures). With draws (``figures`` rows 1..,
        solver/explore.py), row 0 is the point estimate and each further row a draw, read as
        multiples of row 0 (:func:`_draw_scale`) and scored on the DRAWN_CONFIGURATIONS
        fastest under the point estimate; the others take a time no draw's best reaches."""
        e = self._evaluate(shape, figures.sm_count, element_bytes, configs)
        point_time, point_wait = e.overall_time_ns, e.total_math_wait_ns
        scale = _draw_scale(figures)
        if scale is None:
            return Scores(point_time[None, :], point_wait[None, :])
        top = np.argsort(point_time, kind="stable")[:DRAWN_CONFIGURATIONS]
        stage, _ = e.model.subset(top).stage_times_us(e.figures, scale)
        drawn_us, drawn_wait_us = kernel_times(stage)
        drawn = np.rint(np.asarray(drawn_us) * 1000).astype(np.int64)
        slowest = 2 * max(int(drawn.max()), int(point_time.max())) + 1
        times = np.full((drawn.shape[0] + 1, configs.count), slowest, dtype=np.int64)
        waits = np.zeros_like(times)
        times[0], waits[0] = point_time, point_wait
        times[1:, top] = drawn
        waits[1:, top] = np.rint(np.asarray(drawn_wait_us) * 1000).astype(np.int64)
        return Scores(times, waits)

    def bounds(self, gemm: GemmOnMachine, configs: Configurations) -> tuple[IntArray, IntArray]:
        """Floors of the overall time (module docstring); the MATH wait's floor is 0."""
        s = self._evaluate(gemm.shape, gemm.machine.sm_count, gemm.element_bytes, configs).ticks
        per_sm, full, partial = s.wave_shares()

        def main_floor(share: IntArray) -> IntArray:
            d, lam, t = s.wave(share)
            last = np.maximum(s.stages * d + lam, d + lam + (s.stages - 1) * t)
            floor: IntArray = s.wave_end(last, t, share)
            return floor

        ticks = s.fixed + full * main_floor(per_sm) + (partial > 0) * main_floor(partial)
        floor_ns: IntArray = ticks_to_ns(ticks)
        return floor_ns, np.zeros(configs.count, dtype=np.int64)

    def stage_times(self, gemm: GemmOnMachine, configs: Configurations) -> StageTimes:
        """The stage quantities of every configuration of ``configs`` in ticks (what the Z3
        encoding, solver/encodings/l2_reuse.py, writes in as numbers)."""
        return self._evaluate(gemm.shape, gemm.machine.sm_count, gemm.element_bytes, configs).ticks

    def residual_model(self, fit: RunsToFit) -> PipelineResiduals:
        return self.base.residual_model(fit)

    def run_time_ns(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, run: Any
    ) -> int:
        return self.base.run_time_ns(shape, tiling, machine, run)

    def answer_fields(self, prediction: Any, element_bytes: int) -> dict[str, object]:
        p: MemoryPrediction = prediction
        out = AsyncCopyPipeline().answer_fields(p, element_bytes)
        out.update(
            group_m=p.tiling.group_m,
            split_k=p.tiling.split_k,
            dram_bytes=p.dram_bytes,
            l2_hit_rate=p.l2_hit_rate,
        )
        return out

    def timeline_rows(self, prediction: Any) -> list[dict[str, float | int | None]]:
        return AsyncCopyPipeline().timeline_rows(prediction)


#: configurations the explore shortlist's draws score under the term: the point estimate's
#: fastest, several times MAX_TOP_K (50), so every rank a shortlist shows has its draws; a
#: draw scales each figure by at most a few times its point value, which does not lift the
#: 257th configuration of thousands above all of them
DRAWN_CONFIGURATIONS = 256
#: the GeMM-WS figures a draw moves, and the memory-model figures each one scales
_SCALED_BY = {
    "t_init_us": "launch",
    "t_epilogue_us": "epilogue",
    "load_startup_latency_us": "latency",
    "compute_startup_latency_us": "math_startup",
    "load_throughput_elements_per_us": "bandwidth",
    "compute_throughput_macs_per_us": "compute",
}


def _draw_scale(figures: Figures) -> FigureScale | None:
    """Rows 1.. of ``figures`` as multiples of row 0 ((D, 1) arrays; 1 where row 0 is 0), or
    None without draws. The belief draws the GeMM-WS figures (the calibrated posterior where
    there is one); on this model a draw of the load throughput moves both bandwidths, of the
    load startup both latencies."""
    columns = figures.columns()
    if max(len(c) for c in columns.values()) < 2:
        return None
    ratios = {}
    for name, scaled in _SCALED_BY.items():
        column = columns[name]
        point = column[0]
        drawn = column[1:] if len(column) > 1 else column[:1]
        ratios[scaled] = (drawn / point if point > 0 else np.ones_like(drawn)).reshape(-1, 1)
    return FigureScale(**ratios)


def _durations(s: StageTimes, share: int) -> AsyncDurations:
    """The stage of the one configuration of ``s`` when ``share`` CTAs share the SM, ticks."""
    d, lam, t = s.wave(np.asarray([share], dtype=np.int64))
    return AsyncDurations(share, int(d[0]), int(lam[0]), int(t[0]))


def _simulate_waves(s: StageTimes) -> tuple[int, int]:
    """(overall time, total MATH wait) in ticks of the one configuration of ``s``: each wave
    (A1)-(A3) stage by stage; wave i + 1 runs while wave i's C store drains, so it takes the
    longer of its main part and that store; the kernel ends when the last store lands."""
    per_sm, full, partial = (int(v[0]) for v in s.wave_shares())
    stages, depth = int(s.stages[0]), int(s.depth[0])
    plan = [per_sm] * full + ([partial] if partial else [])
    kinds: dict[int, tuple[int, int, int]] = {}
    for share in set(plan):
        durations = _durations(s, share)
        events = run_stages(durations, stages, depth)
        main = events[-1].math_start_ns + int(s.after_last_math(durations.math_ns, share, 0))
        store = min(share * s.sm_count, int(s.ctas[0])) * int(s.store_per_cta[0])
        kinds[share] = (main, store, share * sum(e.math_wait_ns for e in events))
    elapsed, wait, draining = 0, 0, None
    for share in plan:
        main, store, waits = kinds[share]
        elapsed += main if draining is None else max(main, draining)
        draining, wait = store, wait + waits
    return int(s.fixed[0]) + elapsed + (draining or 0), wait
