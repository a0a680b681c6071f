"""The L2-reuse memory term over any pipeline model: per configuration, its loads' throughput
and latency from perfmodel/gemm_ws_traffic.py, split-K's shorter reduction and larger grid.

Model-agnostic by construction: a configuration (tile, ``group_m``, ``split_k``) is the base
model's configuration on an *effective* problem, and the base model's closed form, simulator,
scorer, bounds and Z3 encoding run unchanged on it:

- effective machine: load throughput = the waves' per-SM throughput and load latency = the
  hit-rate-weighted L2/DRAM latency (``Traffic``); T_INIT + split-K's reduction
  (``split_k_reduction_us``: partial sums at DRAM bandwidth plus a fixed cost);
- effective shape: k = ceil(k / split_k) (each CTA reduces one slice) and
  m = ceil(m / TM) x TM x split_k, so the base model counts tiles_m x tiles_n x split_k CTAs.

Configurations that share (TM, TN, TK, group_m, split_k) share the effective problem (the
waves are counted at one CTA per SM, eq. (1)-(3)'s residency, for every base model), so the
scorer, bounds and encoding run once per such group; the certificate asks Z3 once per group
(solver/per_configuration.py). Derivation: docs/model-notes.md, "L2 reuse in the optimizer".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import z3

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling
from perfmodel.gemm_ws_scoring import Configurations, Figures, IntArray, Scores
from perfmodel.gemm_ws_traffic import Grid, MemoryFigures, gemm_traffic, split_k_reduction_us
from perfmodel.pipeline import FigureInfo, PipelineModel, PipelineResiduals

#: the request's memory-term switch: "dram-stream" (every load at the machine's DRAM share,
#: no memory term) or "l2-reuse" (this module)
MEMORY_MODELS = ("dram-stream", "l2-reuse")


@dataclass(frozen=True, slots=True)
class Effective:
    """One group's effective problem and what its candidates report."""

    shape: GemmShape
    machine: GemmWsMachine
    dram_bytes: float
    l2_hit_rate: float


@dataclass(frozen=True, slots=True)
class MemoryPrediction:
    """A base model's prediction on the effective problem, with the group's traffic."""

    base: Any
    dram_bytes: float
    l2_hit_rate: float

    @property
    def tiling(self) -> Tiling:
        t: Tiling = self.base.tiling
        return t

    @property
    def overall_time_ns(self) -> int:
        return int(self.base.overall_time_ns)

    @property
    def total_math_wait_ns(self) -> int:
        return int(self.base.total_math_wait_ns)

    @property
    def waves(self) -> int:
        return int(self.base.waves)

    @property
    def stages(self) -> int:
        return int(self.base.stages)


class GroupEncoding:
    """A base model's encoding of one group, read back with the group's group_m and split_k."""

    def __init__(self, base: Any, group_m: int, split_k: int) -> None:
        self.base, self.group_m, self.split_k = base, group_m, split_k

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def tiling_of(self, model: z3.ModelRef) -> Tiling:
        tiling: Tiling = self.base.tiling_of(model)
        return dataclasses.replace(tiling, group_m=self.group_m, split_k=self.split_k)


def _key_columns(configs: Configurations) -> npt.NDArray[np.int64]:
    return np.stack(
        [configs.tile_m, configs.tile_n, configs.tile_k, configs.group_m, configs.split_k], axis=1
    )


@dataclass(frozen=True)
class L2ReuseModel:
    """``base`` with the L2-reuse memory term (module docstring); ``memory`` the device's
    hierarchy, ``reduction_overhead_us`` split-K's fixed reduction cost."""

    base: PipelineModel
    memory: MemoryFigures
    reduction_overhead_us: float

    # --- the effective problem ---------------------------------------------------------------

    def effective(
        self, shape: GemmShape, machine: GemmWsMachine, element_bytes: int, configs: Configurations
    ) -> Iterator[tuple[npt.NDArray[np.intp], Effective, int, int]]:
        """Per group of ``configs``: its rows, its effective problem, its group_m and split_k."""
        if not configs.count:
            return
        keys = _key_columns(configs)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        memory = dataclasses.replace(self.memory, sm_count=machine.sm_count)
        grid = Grid.of(*(unique[:, i] for i in range(5)))
        traffic = gemm_traffic(shape.m, shape.n, shape.k, element_bytes, grid, memory)
        reduction = split_k_reduction_us(traffic, memory, self.reduction_overhead_us)
        for g, (tm, _tn, _tk, gm, sk) in enumerate(unique.tolist()):
            eff_machine = dataclasses.replace(
                machine,
                t_init_us=machine.t_init_us + float(reduction[g]),
                load_startup_latency_us=float(traffic.load_latency_us[g]),
                load_throughput_elements_per_us=float(traffic.load_throughput_elements_per_us[g]),
            )
            eff_shape = GemmShape(-(-shape.m // tm) * tm * sk, shape.n, -(-shape.k // sk))
            eff = Effective(
                eff_shape,
                eff_machine,
                float(traffic.dram_bytes[g]),
                float(traffic.l2_hit_rate[g]),
            )
            yield np.flatnonzero(inverse == g), eff, gm, sk

    def _one(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> Effective:
        configs = Configurations.of_tilings([tiling])
        return next(self.effective(shape, machine, element_bytes, configs))[1]

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
        return self.base.residency_constraint

    def closed_form(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> MemoryPrediction:
        e = self._one(shape, tiling, machine, element_bytes)
        base = self.base.closed_form(e.shape, tiling, e.machine, element_bytes)
        return MemoryPrediction(base, e.dram_bytes, e.l2_hit_rate)

    def simulate(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> MemoryPrediction:
        e = self._one(shape, tiling, machine, element_bytes)
        base = self.base.simulate(e.shape, tiling, e.machine, element_bytes)
        return MemoryPrediction(base, e.dram_bytes, e.l2_hit_rate)

    def resident(self, configs: Configurations, element_bytes: int) -> Any:
        return self.base.resident(configs, element_bytes)

    def residency_rejection(self, tiling: Tiling, element_bytes: int) -> str | None:
        return self.base.residency_rejection(tiling, element_bytes)

    def score(
        self, shape: GemmShape, configs: Configurations, figures: Figures, element_bytes: int
    ) -> Scores:
        """The base scorer per group on its effective machine (``figures``' draws are the
        base machine's: only the first, the optimizer's, is scored)."""
        times = np.zeros((1, configs.count), dtype=np.int64)
        waits = np.zeros((1, configs.count), dtype=np.int64)
        for rows, e, _, _ in self.effective(shape, _machine(figures), element_bytes, configs):
            s = self.base.score(
                e.shape, configs.take(rows), Figures.of_machine(e.machine), element_bytes
            )
            times[0, rows], waits[0, rows] = s.overall_time_ns[0], s.total_math_wait_ns[0]
        return Scores(times, waits)

    def bounds(
        self,
        shape: GemmShape,
        machine: GemmWsMachine,
        element_bytes: int,
        configs: Configurations,
    ) -> tuple[IntArray, IntArray]:
        time_floor = np.zeros(configs.count, dtype=np.int64)
        wait_floor = np.zeros(configs.count, dtype=np.int64)
        for rows, e, _, _ in self.effective(shape, machine, element_bytes, configs):
            t, w = self.base.bounds(e.shape, e.machine, element_bytes, configs.take(rows))
            time_floor[rows], wait_floor[rows] = t, w
        return time_floor, wait_floor

    def encode(
        self,
        shape: GemmShape,
        machine: GemmWsMachine,
        element_bytes: int,
        configs: Configurations,
    ) -> Any:
        """One group's encoding (the certificate encodes group by group: :meth:`encode_groups`);
        ValueError for configurations of several groups."""
        groups = self.encode_groups(shape, machine, element_bytes, configs)
        if len(groups) != 1:
            raise ValueError("the L2-reuse term encodes one (tile, group_m, split_k) at a time")
        return groups[0]

    def encode_groups(
        self,
        shape: GemmShape,
        machine: GemmWsMachine,
        element_bytes: int,
        configs: Configurations,
    ) -> list[GroupEncoding]:
        """The base model's encoding of each group on its effective problem."""
        return [
            GroupEncoding(
                self.base.encode(e.shape, e.machine, element_bytes, configs.take(rows)), gm, sk
            )
            for rows, e, gm, sk in self.effective(shape, machine, element_bytes, configs)
        ]

    def residual_model(
        self,
        base: GemmWsMachine,
        runs: Sequence[Any],
        names: Sequence[str],
        ratios: Mapping[str, tuple[float, float]],
    ) -> PipelineResiduals:
        return self.base.residual_model(base, runs, names, ratios)

    def run_time_ns(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, run: Any
    ) -> int:
        return self.base.run_time_ns(shape, tiling, machine, run)

    def answer_fields(self, prediction: Any, element_bytes: int) -> dict[str, object]:
        out = self.base.answer_fields(prediction.base, element_bytes)
        t = prediction.tiling
        out.update(
            group_m=t.group_m,
            split_k=t.split_k,
            dram_bytes=prediction.dram_bytes,
            l2_hit_rate=prediction.l2_hit_rate,
        )
        return out

    def timeline_rows(self, prediction: Any) -> list[dict[str, float | int | None]]:
        return self.base.timeline_rows(prediction.base)

    def timeline_svg(self, prediction: Any, machine: GemmWsMachine, **labels: Any) -> bytes:
        return self.base.timeline_svg(prediction.base, machine, **labels)


def _machine(figures: Figures) -> GemmWsMachine:
    """The machine of the first draw of ``figures``."""
    first: dict[str, Any] = {name: float(v[0]) for name, v in figures.columns().items()}
    return GemmWsMachine(sm_count=figures.sm_count, **first)
