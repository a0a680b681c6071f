"""Z3 encoding of the GeMM-WS recurrences over a finite tiling search space.

Decision variables are the tile sizes TM, TN, TK and the buffer depth; every duration is a
precomputed integer (nanoseconds) selected by implications on those variables, so the
arithmetic stays linear. The event times are Int -> Int arrays ``Sa``, ``Sb``, ``Sm`` as §3.2
describes; the release term ``Sm(i - buffer_depth)`` is a select at a symbolic index, and
``Sm(j) = -T_MATH`` for j <= 0 encodes "every buffer slot is free at time 0".

Two things make this encoding fast where the paper's takes 0.2-0.6 s (Table 1):

* The recurrences are not unrolled to the largest stage count. They are unrolled over a window
  of ``max(buffer_depth) + 1`` stages; beyond it the schedule is periodic (``Sm(i) - Sm(i-1)``
  is constant once the buffer no longer binds), so
  ``Sm(S) = Sm(w) + (S - w) (Sm(w) - Sm(w-1))``. docs/model-notes.md gives the argument; the
  test suite checks the solver against the stage-by-stage simulator on every problem.
* Valid inequalities ("cuts") implied by eq. (1)-(3), evaluated per tile triple, bound the
  objectives from below so the solver can discard most triples without array reasoning. They
  are sound for every solution of the recurrences whether or not they are tight.

The constraints are emitted as SMT-LIB 2 text and parsed by Z3 in one call: building thousands
of implications through the Python API costs more than solving them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import z3

from perfmodel.gemm_ws import (
    GemmShape,
    GemmWsMachine,
    Tiling,
    WaveTimeModel,
    stage_count,
    stage_durations,
    us_to_ns,
    wave_count,
)
from solver.search_space import SearchSpace


@dataclass(frozen=True)
class Encoding:
    """Variables of one encoded problem and its constraints."""

    tile_m: z3.ArithRef
    tile_n: z3.ArithRef
    tile_k: z3.ArithRef
    buffer_depth: z3.ArithRef
    overall_time_ns: z3.ArithRef
    total_math_wait_ns: z3.ArithRef
    constraints: z3.AstVector
    smtlib: str
    #: min over all triples of the overall-time cut: no configuration can be faster
    overall_time_floor_ns: int

    def tiling_of(self, model: z3.ModelRef) -> Tiling:
        def value(v: z3.ArithRef) -> int:
            return int(model.eval(v, model_completion=True).as_long())

        return Tiling(
            value(self.tile_m), value(self.tile_n), value(self.tile_k), value(self.buffer_depth)
        )

    def is_tiling(self, tiling: Tiling) -> z3.BoolRef:
        return z3.And(
            self.tile_m == tiling.tile_m,
            self.tile_n == tiling.tile_n,
            self.tile_k == tiling.tile_k,
            self.buffer_depth == tiling.buffer_depth,
        )


def _int(value: int) -> str:
    return str(value) if value >= 0 else f"(- {-value})"


def _one_of(var: str, values: tuple[int, ...]) -> str:
    if values == tuple(range(values[0], values[-1] + 1)):
        return f"(and (>= {var} {values[0]}) (<= {var} {values[-1]}))"
    return "(or " + " ".join(f"(= {var} {v})" for v in values) + ")"


def _max(a: str, b: str) -> str:
    return f"(ite (>= {a} {b}) {a} {b})"


def encode(
    shape: GemmShape,
    machine: GemmWsMachine,
    space: SearchSpace,
    element_bytes: int,
    wave_model: WaveTimeModel,
) -> Encoding:
    out: list[str] = [
        "(declare-const tile_m Int) (declare-const tile_n Int) (declare-const tile_k Int)",
        "(declare-const buffer_depth Int)",
        "(declare-const t_load_a Int) (declare-const t_load_b Int) (declare-const t_math Int)",
        "(declare-const waves Int) (declare-const last_math_start Int)",
        "(declare-const math_wait_per_wave Int)",
        "(declare-const overall_time Int) (declare-const total_math_wait Int)",
        "(declare-const Sa (Array Int Int)) (declare-const Sb (Array Int Int))",
        "(declare-const Sm (Array Int Int))",
    ]
    a = out.append
    a(f"(assert {_one_of('tile_m', space.tile_m)})")
    a(f"(assert {_one_of('tile_n', space.tile_n)})")
    a(f"(assert {_one_of('tile_k', space.tile_k)})")
    a(f"(assert {_one_of('buffer_depth', space.buffer_depth)})")

    stage_counts = {tk: stage_count(shape, Tiling(1, 1, tk, 1)) for tk in space.tile_k}
    tail_math = wave_model is WaveTimeModel.INCLUDE_LAST_MATH
    t_epilogue = us_to_ns(machine.t_epilogue_us)
    t_init = us_to_ns(machine.t_init_us)
    limit = machine.shared_memory_per_block_bytes if space.enforce_shared_memory else None
    deepest = space.buffer_depth[-1]

    # §2.2: durations are linear in the tile work plus a startup latency and do not depend on
    # the buffer depth, so they are tabulated per (TM, TK), (TK, TN) and (TM, TN, TK).
    load_a: dict[tuple[int, int], int] = {}
    load_b: dict[tuple[int, int], int] = {}
    for tm, tk in itertools.product(space.tile_m, space.tile_k):
        load_a[tm, tk] = stage_durations(Tiling(tm, 1, tk, 1), machine).t_load_a_ns
        a(f"(assert (=> (and (= tile_m {tm}) (= tile_k {tk})) (= t_load_a {load_a[tm, tk]})))")
    for tk, tn in itertools.product(space.tile_k, space.tile_n):
        load_b[tk, tn] = stage_durations(Tiling(1, tn, tk, 1), machine).t_load_b_ns
        a(f"(assert (=> (and (= tile_k {tk}) (= tile_n {tn})) (= t_load_b {load_b[tk, tn]})))")
    # §2.1.1: W = ceil(ceil(M/TM) * ceil(N/TN) / SMs), tabulated per (TM, TN).
    waves: dict[tuple[int, int], int] = {}
    for tm, tn in itertools.product(space.tile_m, space.tile_n):
        waves[tm, tn] = wave_count(shape, Tiling(tm, tn, 1, 1), machine.sm_count)
        a(f"(assert (=> (and (= tile_m {tm}) (= tile_n {tn})) (= waves {waves[tm, tn]})))")

    overall_floor: int | None = None
    for tm, tn, tk in itertools.product(space.tile_m, space.tile_n, space.tile_k):
        t_math = stage_durations(Tiling(tm, tn, tk, 1), machine).t_math_ns
        triple = f"(and (= tile_m {tm}) (= tile_n {tn}) (= tile_k {tk}))"
        facts = [f"(= t_math {t_math})"]
        # Shared-memory capacity per CTA (not in the paper; a real kernel cannot exceed it).
        if limit is not None:
            max_depth = limit // ((tm * tk + tk * tn) * element_bytes)
            if max_depth < deepest:
                facts.append(f"(<= buffer_depth {max_depth})")
        # Cuts. eq. (3) chains Sm(i) >= Sm(i-1) + T_MATH, and Sm(1) >= Sb(1) + T_LOAD-B >=
        # T_LOAD-A + T_LOAD-B = L, so Sm(S) >= L + (S-1) T_MATH. eq. (1)-(2) chain the DMA warp
        # (Sa(i) >= Sb(i-1) + T_LOAD-B, Sb(i) >= Sa(i) + T_LOAD-A), so Sm(S) >= S L.
        stages = stage_counts[tk]
        load = load_a[tm, tk] + load_b[tk, tn]
        floor_last_math = max(load + (stages - 1) * t_math, stages * load)
        w = waves[tm, tn]
        tail = t_math if tail_math else 0
        facts.append(f"(>= last_math_start {floor_last_math})")
        floor_overall = w * (floor_last_math + tail + t_epilogue) + t_init
        if overall_floor is None or floor_overall < overall_floor:
            overall_floor = floor_overall
        facts.append(f"(>= overall_time {floor_overall})")
        facts.append(f"(>= total_math_wait {w * (floor_last_math - (stages - 1) * t_math)})")
        a(f"(assert (=> {triple} (and {' '.join(facts)})))")

    window = max(2, min(max(stage_counts.values()), deepest + 1))
    # Sm(j) = -T_MATH for j <= 0: Sm(j) + T_MATH = 0, the slot is free from the start.
    for j in range(1 - deepest, 1):
        a(f"(assert (= (select Sm {_int(j)}) (- t_math)))")
    for i in range(1, window + 1):
        # The release of stage i - buffer_depth: a select at a symbolic index.
        slot_free = f"(+ (select Sm (- {i} buffer_depth)) t_math)"
        sa, sb, sm = f"(select Sa {i})", f"(select Sb {i})", f"(select Sm {i})"
        if i == 1:
            a(f"(assert (= {sa} 0))")  # eq. (1), i = 1
        else:
            a(f"(assert (= {sa} {_max(f'(+ (select Sb {i - 1}) t_load_b)', slot_free)}))")  # (1)
        a(f"(assert (= {sb} {_max(f'(+ {sa} t_load_a)', slot_free)}))")  # eq. (2)
        a(f"(assert (= {sm} {_max(f'(+ (select Sm {i - 1}) t_math)', f'(+ {sb} t_load_b)')}))")

    # Sm(S): read inside the window, else extrapolate the periodic increment.
    period = f"(- (select Sm {window}) (select Sm {window - 1}))"
    for tk, stages in stage_counts.items():
        if stages <= window:
            value = f"(select Sm {stages})"
        else:
            value = f"(+ (select Sm {window}) (* {stages - window} {period}))"
        a(f"(assert (=> (= tile_k {tk}) (= last_math_start {value})))")
        # §3.2: sum_i Wait(i) telescopes to Sm(S) - (S - 1) T_MATH.
        a(
            f"(assert (=> (= tile_k {tk}) (= math_wait_per_wave "
            f"(- last_math_start (* {stages - 1} t_math)))))"
        )
    wave_time = f"(+ last_math_start {'t_math ' if tail_math else ''}{t_epilogue})"
    for w in sorted(set(waves.values())):
        # Overall time = wave time x W + T_INIT and W x sum Wait (§3.2); W is a constant in
        # each branch, which keeps both objectives linear.
        a(f"(assert (=> (= waves {w}) (= overall_time (+ (* {w} {wave_time}) {t_init}))))")
        a(f"(assert (=> (= waves {w}) (= total_math_wait (* {w} math_wait_per_wave))))")

    text = "\n".join(out)
    constraints = z3.parse_smt2_string(text)
    tm_v, tn_v, tk_v, depth_v = z3.Ints("tile_m tile_n tile_k buffer_depth")
    return Encoding(
        tile_m=tm_v,
        tile_n=tn_v,
        tile_k=tk_v,
        buffer_depth=depth_v,
        overall_time_ns=z3.Int("overall_time"),
        total_math_wait_ns=z3.Int("total_math_wait"),
        constraints=constraints,
        smtlib=text,
        overall_time_floor_ns=overall_floor if overall_floor is not None else 0,
    )
