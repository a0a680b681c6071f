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
* Valid inequalities ("cuts", solver/bounds.py) implied by eq. (1)-(3), evaluated per tile
  triple, bound the objectives from below so the solver can discard most triples without array
  reasoning; the optimizer also leaves out of the encoding every triple whose bound already
  exceeds the time of ``top_k`` simulated configurations (a branch-and-bound presolve). Both
  are sound for every solution of the recurrences whether or not the bounds are tight.

The constraints are emitted as SMT-LIB 2 text and parsed by Z3 in one call: building thousands
of implications through the Python API costs more than solving them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import z3

from perfmodel.gemm_ws import GemmShape, GemmWsMachine, Tiling, WaveTimeModel, us_to_ns
from solver.bounds import TripleBound, triple_bounds
from solver.search_space import SearchSpace
from solver.smtlib import all_equal, integer, maximum, one_of

#: the variables every encoding declares, as Z3 terms of Z3's main context (made once: terms
#: are immutable, and making them costs more than a small certificate's other Python work)
_TILE_M, _TILE_N, _TILE_K, _BUFFER_DEPTH = z3.Ints("tile_m tile_n tile_k buffer_depth")
_OVERALL_TIME, _TOTAL_MATH_WAIT = z3.Ints("overall_time total_math_wait")


@dataclass(frozen=True)
class Encoding:
    """Variables of one encoded problem and its constraints."""

    tile_m: z3.ArithRef
    tile_n: z3.ArithRef
    tile_k: z3.ArithRef
    buffer_depth: z3.ArithRef
    overall_time_ns: z3.ArithRef
    total_math_wait_ns: z3.ArithRef
    #: the constraints as SMT-LIB 2 text: ``solver.from_string`` parses them into a solver in
    #: one call (adding a parsed vector crosses into Python once per assertion)
    smtlib: str
    #: min over all triples of the overall-time cut: no configuration can be faster
    overall_time_floor_ns: int
    #: the leading part of ``smtlib`` that problems of a kind share (:class:`EncodingText`;
    #: empty: none), which solver/z3_session.py keeps asserted between certificate checks
    shared: str = ""

    @classmethod
    def parse(cls, smtlib: str, overall_time_floor_ns: int, shared: str = "") -> Encoding:
        """The encoding of SMT-LIB text declaring tile_m, tile_n, tile_k, buffer_depth,
        overall_time and total_math_wait (``shared``: a leading part of it, see above)."""
        return cls(
            _TILE_M,
            _TILE_N,
            _TILE_K,
            _BUFFER_DEPTH,
            _OVERALL_TIME,
            _TOTAL_MATH_WAIT,
            smtlib,
            overall_time_floor_ns,
            shared,
        )

    @property
    def specific(self) -> str:
        """What ``smtlib`` holds beyond :attr:`shared`."""
        return self.smtlib[len(self.shared) :]

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


@dataclass(frozen=True, slots=True)
class EncodingText:
    """An encoding as SMT-LIB 2 text in two parts whose conjunction is the encoding.

    ``shared``: the declarations and the recurrences of eq. (1)-(3) over the unrolled window;
    it depends only on the deepest buffer and the window length, so problems of a kind share
    it (solver/z3_session.py asserts it once per solver). ``specific``: the problem's own
    facts (its triples' durations, cuts and wave counts, its depths, Sm(S) per tile_k).
    """

    shared: str
    specific: str
    #: min over all triples of the overall-time cut: no configuration can be faster
    overall_time_floor_ns: int

    @property
    def smtlib(self) -> str:
        return self.shared + "\n" + self.specific

    def parse(self) -> Encoding:
        return Encoding.parse(self.smtlib, self.overall_time_floor_ns, shared=self.shared)


def encode_text(
    triples: Sequence[TripleBound],
    space: SearchSpace,
    machine: GemmWsMachine,
    wave_model: WaveTimeModel,
) -> EncodingText:
    """:func:`encode`'s constraints as text, shared part and specific part, without building
    any Z3 object (so a caller may parse them into a solver of its own context)."""
    if not triples:
        raise ValueError("encode needs at least one tile triple")
    shared: list[str] = [
        "(declare-const tile_m Int) (declare-const tile_n Int) (declare-const tile_k Int)",
        "(declare-const buffer_depth Int)",
        "(declare-const t_load_a Int) (declare-const t_load_b Int) (declare-const t_math Int)",
        "(declare-const waves Int) (declare-const last_math_start Int)",
        "(declare-const math_wait_per_wave Int)",
        "(declare-const overall_time Int) (declare-const total_math_wait Int)",
        "(declare-const Sa (Array Int Int)) (declare-const Sb (Array Int Int))",
        "(declare-const Sm (Array Int Int))",
    ]
    out: list[str] = []
    a = out.append
    a(f"(assert {one_of('buffer_depth', space.buffer_depth)})")
    tail_math = wave_model is WaveTimeModel.INCLUDE_LAST_MATH
    t_epilogue = us_to_ns(machine.t_epilogue_us)
    t_init = us_to_ns(machine.t_init_us)
    deepest = space.buffer_depth[-1]

    # The tile triple is one of the encoded ones; each fixes its §2.2 durations, its wave
    # count W (§2.1.1), its shared-memory depth limit and the cuts of solver/bounds.py.
    choices = []
    for t in triples:
        triple = all_equal({"tile_m": t.tile_m, "tile_n": t.tile_n, "tile_k": t.tile_k})
        choices.append(triple)
        facts = [
            f"(= t_load_a {t.t_load_a_ns})",
            f"(= t_load_b {t.t_load_b_ns})",
            f"(= t_math {t.t_math_ns})",
            f"(= waves {t.waves})",
            f"(>= last_math_start {t.last_math_start_floor_ns})",
            f"(>= overall_time {t.overall_time_floor_ns})",
            f"(>= total_math_wait {t.total_math_wait_floor_ns})",
        ]
        # Shared-memory capacity per CTA (not in the paper; a real kernel cannot exceed it).
        if t.max_buffer_depth is not None and t.max_buffer_depth < deepest:
            facts.append(f"(<= buffer_depth {t.max_buffer_depth})")
        a(f"(assert (=> {triple} (and {' '.join(facts)})))")
    a(f"(assert (or {' '.join(choices)}))")

    stage_counts = {t.tile_k: t.stages for t in triples}
    window = max(2, min(max(stage_counts.values()), deepest + 1))
    r = shared.append  # the recurrences: the same text for the same deepest depth and window
    # Sm(j) = -T_MATH for j <= 0: Sm(j) + T_MATH = 0, the slot is free from the start.
    for j in range(1 - deepest, 1):
        r(f"(assert (= (select Sm {integer(j)}) (- t_math)))")
    for i in range(1, window + 1):
        # The release of stage i - buffer_depth: a select at a symbolic index.
        slot_free = f"(+ (select Sm (- {i} buffer_depth)) t_math)"
        sa, sb, sm = f"(select Sa {i})", f"(select Sb {i})", f"(select Sm {i})"
        if i == 1:
            r(f"(assert (= {sa} 0))")  # eq. (1), i = 1
        else:
            r(f"(assert (= {sa} {maximum(f'(+ (select Sb {i - 1}) t_load_b)', slot_free)}))")  # (1)
        r(f"(assert (= {sb} {maximum(f'(+ {sa} t_load_a)', slot_free)}))")  # eq. (2)
        r(f"(assert (= {sm} {maximum(f'(+ (select Sm {i - 1}) t_math)', f'(+ {sb} t_load_b)')}))")

    # Sm(S): read inside the window, else extrapolate the periodic increment.
    period = f"(- (select Sm {window}) (select Sm {window - 1}))"
    for tk, stages in sorted(stage_counts.items()):
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
    for w in sorted({t.waves for t in triples}):
        # Overall time = wave time x W + T_INIT and W x sum Wait (§3.2); W is a constant in
        # each branch, which keeps both objectives linear.
        a(f"(assert (=> (= waves {w}) (= overall_time (+ (* {w} {wave_time}) {t_init}))))")
        a(f"(assert (=> (= waves {w}) (= total_math_wait (* {w} math_wait_per_wave))))")

    return EncodingText(
        "\n".join(shared),
        "\n".join(out),
        overall_time_floor_ns=min(t.overall_time_floor_ns for t in triples),
    )


def encode_listed(
    shape: GemmShape,
    machine: GemmWsMachine,
    tilings: Sequence[Tiling],
    element_bytes: int,
    wave_model: WaveTimeModel,
) -> Encoding:
    """Eq. (1)-(3) over exactly ``tilings`` (each already checked against the hardware): the
    encoding over their tile triples, each triple's buffer depth restricted to the depths
    listed with it. Each triple's cuts (solver/bounds.py) are taken over its own depths, so
    they hold for every configuration it is encoded with."""
    depths: dict[tuple[int, int, int], set[int]] = {}
    for t in tilings:
        depths.setdefault((t.tile_m, t.tile_n, t.tile_k), set()).add(t.buffer_depth)
    bounds: list[TripleBound] = []
    only: list[str] = []
    for (tm, tn, tk), listed in depths.items():
        space = SearchSpace((tm,), (tn,), (tk,), tuple(sorted(listed)), False)
        bounds += triple_bounds(shape, machine, space, element_bytes, wave_model)
        allowed = " ".join(f"(= buffer_depth {d})" for d in space.buffer_depth)
        triple = all_equal({"tile_m": tm, "tile_n": tn, "tile_k": tk})
        only.append(f"(assert (=> {triple} (or {allowed})))")
    every_depth = tuple(sorted({t.buffer_depth for t in tilings}))
    space = SearchSpace((tm,), (tn,), (tk,), every_depth, False)
    text = encode_text(bounds, space, machine, wave_model)
    return Encoding.parse(
        "\n".join((text.smtlib, *only)), text.overall_time_floor_ns, shared=text.shared
    )
