"""The contract every GeMM-WS pipeline model meets (docs/model-notes.md, "GeMM-WS").

A pipeline model is one set of recurrences for the stages of one CTA's output tile: the
paper's eq. (1)-(3) (perfmodel/pipelines/paper.py) or the async-copy eq. (A1)-(A3)
(perfmodel/pipelines/async_copy/). Everything that reads a model (the solver's ranking and
certificate, explore shortlists, calibration, the HTTP conversion) goes through
:class:`PipelineModel`; the registry (perfmodel/pipelines/__init__.py) maps the name a
request or a profile gives to one implementation, once per request.

What a model needs from the layers above is registered there, by type, never imported here:
its Z3 encoding in ``solver.encodings`` (keyed by the model's type) and its timeline picture
in ``render.pipeline`` (keyed by its prediction's type). A new model registers both where it
is defined (tests/test_third_pipeline_model.py does) and edits neither package.

The configuration record
------------------------
A configuration is a :class:`perfmodel.gemm_ws.Tiling` (scalar) or a
:class:`perfmodel.gemm_ws_scoring.Configurations` (int64 columns, one per dimension). The
scorer, the encoders and the certificate iterate ``Configurations.__slots__`` and
``dataclasses.fields(Tiling)`` generically, so a new search dimension (``group_m``,
``split_k``) is a new column there and a new range in ``solver.search_space.SearchSpace``.

:func:`stage_work` gives the §2.1-§2.2 quantities of one scalar configuration (elements
loaded and MACs per stage, stages, output tiles) for a model written outside this package;
the built-in models compute the same quantities in their own vectorised and exact forms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, ns_to_us

if TYPE_CHECKING:
    from perfmodel.calibration.engine import FloatArray, IntArray
    from perfmodel.calibration.records import GemmWsMeasurement
    from perfmodel.gemm_ws_scoring import Configurations, Figures, Scores


@dataclass(frozen=True, slots=True)
class StageWork:
    """The model-agnostic per-stage quantities of one configuration (§2.1-§2.2)."""

    #: matrix elements of one stage's A tile (TM x TK) and B tile (TK x TN)
    load_a_elements: int
    load_b_elements: int
    #: multiply-accumulates of one stage's MATH (TM x TN x TK)
    macs: int
    #: S = ceil(K / TK) (§2.1.2)
    stages: int
    #: output tiles = CTAs of the grid, ceil(M / TM) x ceil(N / TN) (§2.1.1)
    output_tiles: int

    def busiest_sm_ctas(self, sm_count: int) -> int:
        """q = ceil(tiles / SMs): the CTAs the busiest SM runs, §2.1.1's W at one CTA per SM."""
        return -(-self.output_tiles // sm_count)


def stage_work(shape: GemmShape, tiling: Tiling) -> StageWork:
    """The per-stage quantities of ``tiling`` on ``shape`` (§2.1-§2.2)."""
    tm, tn, tk = tiling.tile_m, tiling.tile_n, tiling.tile_k
    return StageWork(
        load_a_elements=tm * tk,
        load_b_elements=tk * tn,
        macs=tm * tn * tk,
        stages=-(-shape.k // tk),
        output_tiles=-(-shape.m // tm) * -(-shape.n // tn),
    )


def answer_fields(
    load_ns: tuple[int, int],
    math_ns: int,
    math_wait_ns: int,
    bound: str,
    occupancy: tuple[int, int],
    load_latency_ns: int | None,
) -> dict[str, object]:
    """What an answer reports of one candidate beside its time, in the answer's units:
    ``load_ns`` (A tile, B tile) and ``math_ns`` per stage, the total MATH wait, what bounds
    the stage, ``occupancy`` (CTAs per SM, stages in flight), the load latency (None: not a
    figure of the model)."""
    return {
        "t_load_a_us": ns_to_us(load_ns[0]),
        "t_load_b_us": ns_to_us(load_ns[1]),
        "t_math_us": ns_to_us(math_ns),
        "math_wait_us": ns_to_us(math_wait_ns),
        "bound": bound,
        "ctas_per_sm": occupancy[0],
        "stages_in_flight": occupancy[1],
        "load_latency_us": None if load_latency_ns is None else ns_to_us(load_latency_ns),
    }


def timeline_row(
    stage: int, load_starts_ns: tuple[int, int], math_start_ns: int, math_wait_ns: int
) -> dict[str, float | int | None]:
    """One stage of an answer's timeline: when its A and B loads start, when its MATH starts
    and how long MATH waited for it (us)."""
    return {
        "stage": stage,
        "load_a_start_us": ns_to_us(load_starts_ns[0]),
        "load_b_start_us": ns_to_us(load_starts_ns[1]),
        "math_start_us": ns_to_us(math_start_ns),
        "math_wait_us": ns_to_us(math_wait_ns),
    }


@dataclass(frozen=True, slots=True)
class FigureInfo:
    """One device figure a model reads: its name, its unit and the key of its prior."""

    name: str
    unit: str
    prior_key: str


class GemmOnMachine:
    """The GEMM a model bounds or encodes: its shape, the machine, the operands' size. The
    solver's problems (solver/problem.py) are the dataclasses that declare these fields."""

    __slots__ = ()
    shape: GemmShape
    machine: GemmWsMachine
    element_bytes: int


@dataclass(frozen=True, slots=True)
class RunsToFit:
    """What a calibration fits: ``runs`` with the figures ``names`` free (in that order), the
    others at ``base``'s values; ``ratios``: per dtype, (load, compute) throughput over the
    reference figures (absent dtypes: 1)."""

    base: GemmWsMachine
    runs: Sequence[GemmWsMeasurement]
    names: Sequence[str]
    ratios: Mapping[str, tuple[float, float]]


@runtime_checkable
class Prediction(Protocol):
    """What every model predicts for one configuration (the optimizer's objectives, §3.2)."""

    @property
    def tiling(self) -> Tiling: ...
    @property
    def overall_time_ns(self) -> int: ...
    @property
    def total_math_wait_ns(self) -> int: ...
    @property
    def waves(self) -> int: ...
    @property
    def stages(self) -> int: ...


class PipelineResiduals(Protocol):
    """A closed form vectorised over calibration runs, with its Jacobian (calibration engine)."""

    def predict(self, x: FloatArray) -> FloatArray: ...
    def jacobian(self, x: FloatArray) -> FloatArray: ...
    def subset(self, rows: IntArray) -> PipelineResiduals: ...
    def overlapped_runs(self) -> int: ...
    def load_bound_runs(self, x: FloatArray) -> int: ...


class PipelineModel(Protocol):
    """One GeMM-WS pipeline model: one contract line per member."""

    @property
    def name(self) -> str:
        """The name requests, profiles and answers spell (the registry's key)."""

    @property
    def calibration_method(self) -> str:
        """How the calibration fits this model (its closed form, reported with every fit)."""

    @property
    def figures(self) -> tuple[FigureInfo, ...]:
        """The device figures it reads: names, units, prior keys."""

    @property
    def regime_runs(self) -> str:
        """Which runs the calibration's regime warning counts ("runs", "runs with ...")."""

    @property
    def residency_constraint(self) -> str | None:
        """The name under which answers count configurations that fit a CTA's shared memory
        but no SM (None: whatever fits the shared memory per CTA runs)."""

    def closed_form(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> Prediction:
        """The O(1) prediction, equal to :meth:`simulate` but without per-stage events."""

    def simulate(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> Prediction:
        """The event simulator: the recurrences stage by stage, with the events."""

    def resident(
        self, configs: Configurations, element_bytes: int
    ) -> Any:  # numpy bool array; Any keeps numpy out of the service process's annotations
        """Which configurations can run at all beyond the shared memory per CTA (bool array)."""

    def residency_rejection(self, tiling: Tiling, element_bytes: int) -> str | None:
        """Why ``tiling`` cannot run on an SM beyond the shared memory per CTA (None: it can)."""

    def score(
        self, shape: GemmShape, configs: Configurations, figures: Figures, element_bytes: int
    ) -> Scores:
        """The vectorised scorer: overall time and total MATH wait of every configuration
        under every figure draw, bit-equal to :meth:`simulate`."""

    def bounds(self, gemm: GemmOnMachine, configs: Configurations) -> tuple[IntArray, IntArray]:
        """Sound lower bounds (overall time, total MATH wait) of every configuration, from
        paths of the event graph, independent of the scorer (the certificate's cut)."""

    def residual_model(self, fit: RunsToFit) -> PipelineResiduals:
        """The calibration's closed form over ``fit``'s runs, its figures free (residuals and
        the exact Jacobian per regime)."""

    def run_time_ns(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, run: Any
    ) -> int:
        """The service's integer-ns prediction of one calibration run (its dtype's machine)."""

    def answer_fields(self, prediction: Any, element_bytes: int) -> dict[str, object]:
        """The per-candidate durations, bound and occupancy an answer reports."""

    def timeline_rows(self, prediction: Any) -> list[dict[str, float | int | None]]:
        """One row per stage of the best configuration: the events an answer's timeline lists."""
