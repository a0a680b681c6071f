"""The certified optimizer with the L2-reuse memory term (perfmodel/pipelines/l2_reuse.py),
split_k and group_m searched: its answer equals a brute force that simulates every
configuration one by one, stage by stage (the model's simulator, which shares no code with
its vectorised scorer, bounds or encoding), and each simulated time is the memory model's
float prediction (perfmodel/gemm_ws_memory_model.py, the bench's) to the ns; Z3 refutes a
seeded wrong incumbent."""

from __future__ import annotations

import random
import time

import numpy as np
import numpy.typing as npt
import pytest
import z3

import solver.per_configuration as per_configuration
from perfmodel.gemm_ws import GemmShape, GemmWsMachine, SmLimits, Tiling, WaveTimeModel
from perfmodel.gemm_ws_memory_model import MemoryModelFigures, ShapeModel, Space
from perfmodel.gemm_ws_scoring import Configurations, Figures
from perfmodel.gemm_ws_traffic import MemoryFigures
from perfmodel.pipeline import PipelineModel, Prediction
from perfmodel.pipelines.async_copy import AsyncCopyPipeline
from perfmodel.pipelines.l2_reuse import L2ReuseModel
from perfmodel.pipelines.paper import PaperPipeline
from solver import InfeasibleSearchSpace, SearchSpace, TilingProblem, encodings, optimize_tiling

INSTANCES = 300


def _float_us(
    model: L2ReuseModel, problem: TilingProblem, tilings: list[Tiling]
) -> npt.NDArray[np.float64]:
    """The memory model's float predictions of ``tilings`` (us), the bench's function."""
    space = Space(
        *(
            np.array([getattr(t, name) for t in tilings], dtype=np.int64)
            for name in ("tile_m", "tile_n", "tile_k", "buffer_depth", "group_m", "split_k")
        )
    )
    shape = problem.shape
    shape_model = ShapeModel(
        shape.m,
        shape.n,
        shape.k,
        problem.element_bytes,
        space,
        problem.machine.sm_count,
        model.limits,
        model.pipeline,
    )
    return shape_model.times_us(model.model_figures)[0]


def _order(p: Prediction) -> tuple[int, ...]:
    t = p.tiling
    return (
        p.overall_time_ns,
        p.total_math_wait_ns,
        -t.tile_m,
        -t.tile_n,
        -t.tile_k,
        t.buffer_depth,
        t.split_k,
        t.group_m,
    )


def _brute_force(model: L2ReuseModel, problem: TilingProblem) -> list[Prediction]:
    per_block = problem.machine.shared_memory_per_block_bytes
    out = []
    for t in problem.space.tilings():
        if t.split_k > -(-problem.shape.k // t.tile_k):
            continue
        if per_block is not None and t.shared_memory_bytes(problem.element_bytes) > per_block:
            continue
        if model.residency_rejection(t, problem.element_bytes) is not None:
            continue
        out.append(model.simulate(problem.shape, t, problem.machine, problem.element_bytes))
    if out:
        # the integer model is the float one to its ps ticks (summed over waves x stages) and ns
        expected_ns = 1000 * _float_us(model, problem, [p.tiling for p in out])
        got_ns = np.array([p.overall_time_ns for p in out], dtype=np.float64)
        np.testing.assert_allclose(got_ns, expected_ns, rtol=1e-5, atol=1.0)
    return sorted(out, key=_order)


def _instance(rng: random.Random) -> tuple[L2ReuseModel, TilingProblem]:
    sm_count = rng.choice([2, 8, 28, 108])
    machine = GemmWsMachine(
        sm_count=sm_count,
        t_init_us=0.0,
        t_epilogue_us=0.0,
        load_startup_latency_us=0.0,
        compute_startup_latency_us=0.0,
        load_throughput_elements_per_us=1.0,
        compute_throughput_macs_per_us=1.0,
        shared_memory_per_block_bytes=rng.choice([None, 49152]),
    )
    figures = MemoryModelFigures(
        t_init_us=rng.uniform(0, 3),
        t_epilogue_us=rng.uniform(0, 3),
        compute_startup_latency_us=rng.choice([0.0, 0.05]),
        compute_throughput_macs_per_us=rng.uniform(5000, 500_000),
        memory=MemoryFigures(
            sm_count=sm_count,
            dram_bandwidth_gb_per_s=rng.uniform(100, 3000),
            l2_bandwidth_gb_per_s=rng.uniform(1000, 8000),
            l2_size_bytes=rng.choice([0.0, 1 << 18, 40 << 20]),
            dram_latency_us=rng.uniform(0.3, 1.5),
            l2_latency_us=rng.uniform(0.1, 0.3),
        ),
        reduction_overhead_us=rng.uniform(0, 5),
        shared_memory_bytes_per_us=rng.choice([float("inf"), rng.uniform(1e4, 3e5)]),
    )
    limits = SmLimits(
        max_blocks_per_sm=rng.choice([1, 4, 16]),
        shared_memory_per_sm_bytes=rng.choice([None, 102400]),
        registers_per_sm=rng.choice([None, 65536, 16384]),
    )
    base: PipelineModel
    if rng.random() < 0.5:
        base, pipeline = PaperPipeline(rng.choice(list(WaveTimeModel))), "paper"
    else:
        base, pipeline = AsyncCopyPipeline(limits), "async-copy"
    space = SearchSpace(
        tile_m=tuple(sorted(rng.sample([16, 32, 64, 128], rng.randint(1, 2)))),
        tile_n=tuple(sorted(rng.sample([16, 32, 64, 128], rng.randint(1, 2)))),
        tile_k=tuple(sorted(rng.sample([16, 32, 64], rng.randint(1, 2)))),
        buffer_depth=tuple(sorted(rng.sample(range(1, 5), rng.randint(1, 2)))),
        group_m=tuple(sorted(rng.sample([1, 2, 4, 8], rng.randint(1, 2)))),
        split_k=tuple(sorted(rng.sample([1, 2, 3, 4, 8], rng.randint(1, 3)))),
    )
    shape = GemmShape(rng.randint(16, 1500), rng.randint(16, 1500), rng.randint(16, 2048))
    model = L2ReuseModel(base, figures, limits, pipeline)  # type: ignore[arg-type]
    problem = TilingProblem(shape, machine, space, rng.choice([2, 4]), pipeline=model)
    return model, problem


def test_certified_equals_brute_force_with_split_k_and_group_m() -> None:
    rng = random.Random(2405)
    failures: list[object] = []
    for _ in range(INSTANCES):
        model, problem = _instance(rng)
        expected = _brute_force(model, problem)
        if not expected:
            with pytest.raises(InfeasibleSearchSpace):
                optimize_tiling(problem, top_k=1, time_limit_s=30)
            continue
        result = optimize_tiling(problem, top_k=1, time_limit_s=30)
        got = result.best
        assert result.status == "optimal"
        if _order(got) != _order(expected[0]):
            failures.append((problem, got.tiling, expected[0].tiling))
    assert not failures, failures[:3]


def test_a_wrong_incumbent_is_refuted_by_the_certificate() -> None:
    """Seeded error: the certificate is handed a strictly slower configuration as the
    incumbent; Z3 must answer "sat" with one the brute force ranks better."""
    rng = random.Random(11)
    refuted = 0
    while refuted < 30:
        model, problem = _instance(rng)
        expected = _brute_force(model, problem)
        if len(expected) < 2 or expected[-1].overall_time_ns == expected[0].overall_time_ns:
            continue
        wrong = rng.choice([p for p in expected if p.overall_time_ns > expected[0].overall_time_ns])
        instance = per_configuration.Instance(model, problem)
        everything = Configurations.of_tilings([p.tiling for p in expected])
        certificate = per_configuration.certify(
            instance, wrong, everything, time.perf_counter() + 30
        )
        assert certificate.checks[-1].outcome == "sat"
        assert certificate.better is not None
        better = next(p for p in expected if p.tiling == certificate.better)
        assert _order(better) < _order(wrong)
        right = per_configuration.certify(
            instance, expected[0], everything, time.perf_counter() + 30
        )
        assert all(c.outcome == "unsat" for c in right.checks) and right.better is None
        refuted += 1


def test_bounds_hold_and_the_encoding_evaluates_the_scorer() -> None:
    """Per configuration: the floors are at most the scorer's time, and Z3, with the
    configuration fixed, evaluates the encoding to the scorer's time and MATH wait."""
    rng = random.Random(7)
    checked = 0
    while checked < 40:
        model, problem = _instance(rng)
        tilings = [p.tiling for p in _brute_force(model, problem)]
        if not tilings:
            continue
        configs = Configurations.of_tilings(tilings)
        shape, machine, eb = problem.shape, problem.machine, problem.element_bytes
        scores = model.score(shape, configs, Figures.of_machine(machine), eb)
        times, waits = scores.overall_time_ns[0], scores.total_math_wait_ns[0]
        time_floor, wait_floor = model.bounds(problem, configs)
        assert (time_floor <= times).all() and (wait_floor <= waits).all()
        enc = encodings.encode(model, problem, configs)
        solver = z3.Solver()
        solver.from_string(enc.smtlib)
        for i in rng.sample(range(configs.count), min(5, configs.count)):
            solver.push()
            solver.add(enc.is_tiling(tilings[i]))
            assert solver.check() == z3.sat
            z3_model = solver.model()
            assert z3_model.eval(enc.overall_time_ns).as_long() == times[i]
            assert z3_model.eval(enc.total_math_wait_ns).as_long() == waits[i]
            assert enc.tiling_of(z3_model) == tilings[i]
            solver.pop()
        checked += 1
