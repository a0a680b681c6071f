"""A third pipeline model, defined here and nowhere else, served end to end through the
registry: a certified /optimize-tiling with its explore shortlist, a timeline SVG and a
calibration, with no product file knowing it.

The toy model is "serial": a CTA loads a stage (A then B) and only then multiplies it, with no
overlap and no buffering (the buffer depth changes nothing but the shared memory it takes).
Per wave: S (L + T) + T_EPILOGUE, with L = T_LOAD-A + T_LOAD-B and T = T_MATH as §2.2 rounds
them; overall W x wave + T_INIT; each MATH waits L for its stage's load, so the total MATH
wait is W S L. Its oracle here is a brute force over its own stage-by-stage simulator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from perfmodel import pipelines
from perfmodel.calibration import GemmWsMeasurement, fit_gemm_ws
from perfmodel.calibration.gemm_ws_model import THROUGHPUTS, internal_values, shape_and_tiling
from perfmodel.calibration.records import GEMM_WS_FIGURES
from perfmodel.gemm_ws import DurationTable, GemmShape, GemmWsMachine, Tiling, ns_to_us, us_to_ns
from perfmodel.gemm_ws_scoring import Configurations, Figures, Scores
from perfmodel.pipeline import GemmOnMachine, RunsToFit, stage_work
from perfmodel.pipelines.paper import GEMM_WS_FIGURE_INFO
from render import pipeline as render_pipeline
from solver import encodings
from solver.encoding import Encoding
from tests.gemm_ws_cases import A6000

SERIAL = "serial-toy"


@dataclass(frozen=True, slots=True)
class SerialEvent:
    stage: int
    load_start_ns: int
    math_start_ns: int
    math_wait_ns: int


@dataclass(frozen=True, slots=True)
class SerialPrediction:
    tiling: Tiling
    overall_time_ns: int
    total_math_wait_ns: int
    waves: int
    stages: int
    load_a_ns: int
    load_b_ns: int
    math_ns: int
    events: tuple[SerialEvent, ...]


def _parts(
    shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, table: DurationTable | None = None
) -> tuple[int, int, int, int, int]:
    """(T_LOAD-A, T_LOAD-B, T_MATH, stages, waves) through the model-agnostic seam."""
    work = stage_work(shape, tiling)
    table = table or DurationTable(machine)
    return (
        table.load_ns(work.load_a_elements),
        table.load_ns(work.load_b_elements),
        table.math_ns(work.macs),
        work.stages,
        work.busiest_sm_ctas(machine.sm_count),
    )


class SerialResiduals:
    """Predictions in us of runs, linear in the internal figures (1/throughput, latencies)."""

    def __init__(self, rows: np.ndarray, base: np.ndarray, fitted: np.ndarray) -> None:
        # per run: S x elements, S x MACs, S, S, W (for init: 1), waves
        self._rows, self._base, self._fitted = rows, base, fitted

    def _design(self) -> np.ndarray:
        elements, macs, stages, waves = (self._rows[:, i] for i in range(4))
        # columns in GEMM_WS_FIGURES order: 1/load, 1/compute, l_load, l_math, init, epilogue
        return np.column_stack(
            # two load startups a stage (A, then B), one MATH startup
            [
                waves * elements,
                waves * macs,
                2 * waves * stages,
                waves * stages,
                1 + 0 * waves,
                waves,
            ]
        )

    def predict(self, x: np.ndarray) -> np.ndarray:
        full = self._base.copy()
        full[self._fitted] = x
        result: np.ndarray = self._design() @ full
        return result

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = self._design()[:, self._fitted]
        return result

    def subset(self, rows: np.ndarray) -> SerialResiduals:
        return SerialResiduals(self._rows[rows], self._base, self._fitted)

    def overlapped_runs(self) -> int:
        return 0  # nothing overlaps: no regime to warn about

    def load_bound_runs(self, x: np.ndarray) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class SerialPipeline:
    name: str = SERIAL
    calibration_method: str = "toy serial closed form W (S (L + T) + T_EPILOGUE) + T_INIT"
    figures: tuple[Any, ...] = GEMM_WS_FIGURE_INFO
    regime_runs: str = "runs"
    residency_constraint: str | None = None

    def closed_form(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> SerialPrediction:
        a, b, t, stages, waves = _parts(shape, tiling, machine)
        wave = stages * (a + b + t) + us_to_ns(machine.t_epilogue_us)
        overall = waves * wave + us_to_ns(machine.t_init_us)
        return SerialPrediction(
            tiling, overall, waves * stages * (a + b), waves, stages, a, b, t, ()
        )

    def simulate(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, element_bytes: int
    ) -> SerialPrediction:
        a, b, t, stages, waves = _parts(shape, tiling, machine)
        events, clock = [], 0
        for i in range(1, stages + 1):
            events.append(SerialEvent(i, clock, clock + a + b, a + b))
            clock += a + b + t
        wave = clock + us_to_ns(machine.t_epilogue_us)
        overall = waves * wave + us_to_ns(machine.t_init_us)
        wait = waves * sum(e.math_wait_ns for e in events)
        return SerialPrediction(tiling, overall, wait, waves, stages, a, b, t, tuple(events))

    def resident(self, configs: Configurations, element_bytes: int) -> Any:
        return np.ones(configs.count, dtype=bool)

    def residency_rejection(self, tiling: Tiling, element_bytes: int) -> str | None:
        return None

    def score(
        self, shape: GemmShape, configs: Configurations, figures: Figures, element_bytes: int
    ) -> Scores:
        rows = [
            [
                (p.overall_time_ns, p.total_math_wait_ns)
                for p in (
                    self.closed_form(shape, t, machine, element_bytes) for t in configs.tilings()
                )
            ]
            for machine in figures.draws()
        ]
        array = np.array(rows, dtype=np.int64).reshape(len(rows), configs.count, 2)
        return Scores(array[:, :, 0], array[:, :, 1])

    def bounds(self, gemm: GemmOnMachine, configs: Configurations) -> tuple[np.ndarray, np.ndarray]:
        # the closed form is exact, so it is a sound (tight) lower bound
        figures = Figures.of_machine(gemm.machine)
        scores = self.score(gemm.shape, configs, figures, gemm.element_bytes)
        return scores.overall_time_ns[0], scores.total_math_wait_ns[0]

    def residual_model(self, fit: RunsToFit) -> SerialResiduals:
        base, ratios = fit.base, fit.ratios
        rows = []
        for run in fit.runs:
            shape, tiling = shape_and_tiling(run)
            work = stage_work(shape, tiling)
            load_ratio, compute_ratio = ratios.get(run.dtype, (1.0, 1.0))
            rows.append(
                [
                    work.stages * (work.load_a_elements + work.load_b_elements) / load_ratio,
                    work.stages * work.macs / compute_ratio,
                    work.stages,
                    work.busiest_sm_ctas(base.sm_count),
                ]
            )
        return SerialResiduals(
            np.array(rows, dtype=np.float64),
            internal_values(base, GEMM_WS_FIGURES),
            np.array([GEMM_WS_FIGURES.index(n) for n in fit.names], dtype=np.intp),
        )

    def run_time_ns(
        self, shape: GemmShape, tiling: Tiling, machine: GemmWsMachine, run: Any
    ) -> int:
        return self.closed_form(shape, tiling, machine, 2).overall_time_ns

    def answer_fields(self, prediction: Any, element_bytes: int) -> dict[str, object]:
        p: SerialPrediction = prediction
        return {
            "t_load_a_us": ns_to_us(p.load_a_ns),
            "t_load_b_us": ns_to_us(p.load_b_ns),
            "t_math_us": ns_to_us(p.math_ns),
            "math_wait_us": ns_to_us(p.total_math_wait_ns),
            "bound": "load" if p.load_a_ns + p.load_b_ns > p.math_ns else "math",
            "ctas_per_sm": 1,
            "stages_in_flight": 1,
            "load_latency_us": None,
        }

    def timeline_rows(self, prediction: Any) -> list[dict[str, float | int | None]]:
        p: SerialPrediction = prediction
        return [
            {
                "stage": e.stage,
                "load_a_start_us": ns_to_us(e.load_start_ns),
                "load_b_start_us": ns_to_us(e.load_start_ns + p.load_a_ns),
                "math_start_us": ns_to_us(e.math_start_ns),
                "math_wait_us": ns_to_us(e.math_wait_ns),
            }
            for e in p.events
        ]


def _serial(_: pipelines.PipelineSettings) -> SerialPipeline:
    return SerialPipeline()


def _encode(model: SerialPipeline, gemm: GemmOnMachine, configs: Configurations) -> Encoding:
    """The toy's Z3 encoding: its closed form per listed configuration."""
    shape, machine = gemm.shape, gemm.machine
    lines = [
        "(declare-const tile_m Int) (declare-const tile_n Int) (declare-const tile_k Int)",
        "(declare-const buffer_depth Int)",
        "(declare-const overall_time Int) (declare-const total_math_wait Int)",
    ]
    epilogue, init = us_to_ns(machine.t_epilogue_us), us_to_ns(machine.t_init_us)
    choices = []
    for t in configs.tilings():
        a, b, m, stages, waves = _parts(shape, t, machine)
        chosen = (
            f"(and (= tile_m {t.tile_m}) (= tile_n {t.tile_n}) (= tile_k {t.tile_k}) "
            f"(= buffer_depth {t.buffer_depth}))"
        )
        choices.append(chosen)
        # Z3 does the arithmetic of the recurrence's closed form
        overall = f"(+ (* {waves} (+ (* {stages} (+ {a} {b} {m})) {epilogue})) {init})"
        wait = f"(* {waves} {stages} (+ {a} {b}))"
        lines.append(
            f"(assert (=> {chosen} (and (= overall_time {overall}) (= total_math_wait {wait}))))"
        )
    lines.append(f"(assert (or {' '.join(choices)}))")
    return Encoding.parse("\n".join(lines), overall_time_floor_ns=0)


def _timeline_svg(prediction: SerialPrediction, machine: GemmWsMachine, **labels: Any) -> bytes:
    """The toy's own timeline picture."""
    from render._figure import figure, svg_bytes

    p = prediction
    with figure(6.0, 2.5) as fig:
        ax = fig.add_subplot()
        for e in p.events[:16]:
            ax.barh(1, p.load_a_ns + p.load_b_ns, left=e.load_start_ns, gid=f"load-{e.stage}")
            ax.barh(0, p.math_ns, left=e.math_start_ns, gid=f"math-{e.stage}")
        ax.set_title(f"serial toy timeline, rank {labels.get('rank')}")
        return svg_bytes(fig)


# at import: a pool worker that unpickles a request under this model imports this module, and
# validates the request's pipeline_model against its own registry; the model's Z3 encoding and
# its picture plug into the solver's and render's registries the same way, by type
if not pipelines.is_registered(SERIAL):
    pipelines.register(SERIAL, _serial)
encodings.register(SerialPipeline, _encode)
render_pipeline.register(SerialPrediction, _timeline_svg)

SPACE = {
    "tile_m": [32, 64, 128],
    "tile_n": [32, 64, 128],
    "tile_k": [32, 64],
    "buffer_depth": [1, 2, 3],
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, log_level="WARNING", cache_path=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _brute_force(shape: GemmShape) -> list[SerialPrediction]:
    model = SerialPipeline()
    tilings = [
        Tiling(m, n, k, d)
        for m in SPACE["tile_m"]
        for n in SPACE["tile_n"]
        for k in SPACE["tile_k"]
        for d in SPACE["buffer_depth"]
        if d * (m * k + k * n) * 2 <= 99 * 1024  # the A6000's shared memory per block
    ]
    sims = [model.simulate(shape, t, A6000, 2) for t in tilings]
    return sorted(
        sims,
        key=lambda s: (
            s.overall_time_ns,
            s.total_math_wait_ns,
            -s.tiling.tile_m,
            -s.tiling.tile_n,
            -s.tiling.tile_k,
            s.tiling.buffer_depth,
        ),
    )


def test_the_registry_lists_the_toy_and_refuses_an_unknown_name() -> None:
    assert pipelines.names()[:2] == ("paper", "async-copy") and SERIAL in pipelines.names()
    with pytest.raises(pipelines.UnknownPipelineModel, match="choose one of: paper, async-copy"):
        pipelines.resolve("no-such-model")


@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (3000, 500, 2048)])
def test_a_certified_answer_and_its_shortlist_under_the_toy(
    client: TestClient, shape: tuple[int, int, int]
) -> None:
    body = {
        "m": shape[0],
        "n": shape[1],
        "k": shape[2],
        "device_params": dataclasses.asdict(A6000),
        "pipeline_model": SERIAL,
        "search_space": SPACE,
        "top_k": 3,
        "shortlist": "exploit",
    }
    response = client.post("/optimize-tiling", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] == "optimal" and answer["pipeline_model"] == SERIAL
    assert [c["outcome"] for c in answer["solver"]["certificate"]] == ["unsat"]
    expected = _brute_force(GemmShape(*shape))[:3]
    got = [
        (c["tile_m"], c["tile_n"], c["tile_k"], c["buffer_depth"], c["predicted_time_us"])
        for c in answer["candidates"]
    ]
    want = [
        (
            s.tiling.tile_m,
            s.tiling.tile_n,
            s.tiling.tile_k,
            s.tiling.buffer_depth,
            ns_to_us(s.overall_time_ns),
        )
        for s in expected
    ]
    assert got == want
    # the shortlist was drawn under the device's priors through the toy's own scorer
    assert answer["shortlist"]["draws"] > 0
    assert all(0.0 <= c["probability_best"] <= 1.0 for c in answer["candidates"])
    # the serial model never overlaps: a deeper buffer is never faster, so depth 1 wins ties
    assert answer["best"]["buffer_depth"] == 1


def test_explore_shortlist_and_timeline_svg_under_the_toy(client: TestClient) -> None:
    body = {
        "m": 2048,
        "n": 2048,
        "k": 1024,
        "device_params": dataclasses.asdict(A6000),
        "pipeline_model": SERIAL,
        "search_space": SPACE,
        "top_k": 4,
        "include_timeline": True,
    }
    answer = client.post("/optimize-tiling", json=body).json()
    assert answer["shortlist"]["mode"] == "explore"
    best = _brute_force(GemmShape(2048, 2048, 1024))[0]
    assert (answer["best"]["tile_m"], answer["best"]["tile_n"]) == (
        best.tiling.tile_m,
        best.tiling.tile_n,
    )
    assert len(answer["timeline"]) == best.stages
    svg = client.post("/optimize-tiling", json=body, headers={"accept": "image/svg+xml"})
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert b"serial toy timeline, rank 1" in svg.content and b'id="math-1"' in svg.content


def test_a_calibration_under_the_toy_recovers_its_figures() -> None:
    """Runs timed by the toy's own simulator on a hidden device; the fit, through the toy's
    residuals and Jacobian, recovers the throughputs the runs determine."""
    hidden = dataclasses.replace(
        A6000,
        load_throughput_elements_per_us=A6000.load_throughput_elements_per_us * 1.3,
        compute_throughput_macs_per_us=A6000.compute_throughput_macs_per_us * 0.8,
    )
    model = SerialPipeline()
    runs = []
    for m, tm, tk in [
        (1024, 64, 32),
        (2048, 128, 64),
        (4096, 64, 64),
        (512, 32, 32),
        (8192, 128, 32),
    ]:
        tiling = Tiling(tm, tm, tk, 2)
        shape = GemmShape(m, m, 1024)
        time_ns = model.simulate(shape, tiling, hidden, 2).overall_time_ns
        runs.append(GemmWsMeasurement(m, m, 1024, "fp16", tm, tm, tk, 2, time_ns / 1000))
    result = fit_gemm_ws(A6000, runs, folds=0, pipeline=model, fit=list(THROUGHPUTS))
    assert result.method.endswith(model.calibration_method)
    fitted = {f.name: f.value for f in result.fitted}
    for name in THROUGHPUTS:
        assert fitted[name] == pytest.approx(getattr(hidden, name), rel=0.03)


@pytest.mark.parametrize("accept", ["application/json", "image/svg+xml"])
def test_the_model_is_resolved_once_per_request(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, accept: str
) -> None:
    """The route resolves the request once; the cache key, the inline check, the worker and
    the picture read what it resolved."""
    calls: list[str] = []
    real = pipelines.resolve

    def counted(name: str, settings: pipelines.PipelineSettings | None = None) -> Any:
        calls.append(name)
        return real(name, settings)

    monkeypatch.setattr(pipelines, "resolve", counted)
    body = {
        "m": 1536 if accept == "application/json" else 1280,  # a cache miss each
        "n": 1024,
        "k": 512,
        "device": "rtx-a6000",
        "pipeline_model": "async-copy",
        "search_space": SPACE,
    }
    response = client.post("/optimize-tiling", json=body, headers={"accept": accept})
    assert response.status_code == 200, response.text
    assert calls == ["async-copy"]
