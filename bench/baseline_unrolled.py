"""Baseline for the solver benchmark: the paper's straightforward encoding (§3.2).

Every stage up to the largest stage count is unrolled, Sa/Sb/Sm are Int -> Int arrays indexed
with the buffer-depth variable, the objectives go to z3.Optimize as written in §3.2 (overall time
and total MATH wait, lexicographic), and there are no cuts or periodic tail. It is kept here, not
in the service, only to measure what the production encoding gains.
"""

from __future__ import annotations

import itertools
import time

import z3

from perfmodel.gemm_ws import (
    GemmShape,
    GemmWsMachine,
    Tiling,
    stage_count,
    stage_durations,
    us_to_ns,
    wave_count,
)
from solver.search_space import SearchSpace


def solve_unrolled(
    shape: GemmShape, machine: GemmWsMachine, space: SearchSpace, timeout_s: float
) -> tuple[Tiling | None, bool, float]:
    """(best tiling, proven optimal?, seconds)."""
    started = time.perf_counter()
    tm, tn, tk, depth = z3.Ints("tm tn tk depth")
    ta, tb, tmath, waves, stages = z3.Ints("ta tb tmath waves stages")
    opt = z3.Optimize()
    opt.set(timeout=int(timeout_s * 1000))
    opt.add(z3.Or([tm == v for v in space.tile_m]), z3.Or([tn == v for v in space.tile_n]))
    opt.add(z3.Or([tk == v for v in space.tile_k]))
    opt.add(z3.Or([depth == v for v in space.buffer_depth]))
    for a, n, b in itertools.product(space.tile_m, space.tile_n, space.tile_k):
        d = stage_durations(Tiling(a, n, b, 1), machine)
        w = wave_count(shape, Tiling(a, n, b, 1), machine.sm_count)
        opt.add(
            z3.Implies(
                z3.And(tm == a, tn == n, tk == b),
                z3.And(ta == d.t_load_a_ns, tb == d.t_load_b_ns, tmath == d.t_math_ns, waves == w),
            )
        )
    s_max = max(stage_count(shape, Tiling(1, 1, b, 1)) for b in space.tile_k)
    for b in space.tile_k:
        opt.add(z3.Implies(tk == b, stages == stage_count(shape, Tiling(1, 1, b, 1))))
    sa, sb, sm = (z3.Array(x, z3.IntSort(), z3.IntSort()) for x in ("Sa", "Sb", "Sm"))

    def mx(x: z3.ArithRef, y: z3.ArithRef) -> z3.ArithRef:
        return z3.If(x >= y, x, y)

    for j in range(1 - space.buffer_depth[-1], 1):
        opt.add(sm[j] == -tmath)
    waits = []
    for i in range(1, s_max + 1):
        free = sm[i - depth] + tmath
        opt.add(sa[i] == (0 if i == 1 else mx(sb[i - 1] + tb, free)))
        opt.add(sb[i] == mx(sa[i] + ta, free))
        opt.add(sm[i] == mx(sm[i - 1] + tmath, sb[i] + tb))
        wait = sb[1] + tb if i == 1 else sm[i] - (sm[i - 1] + tmath)
        waits.append(z3.If(i <= stages, wait, 0))
    overall = (sm[stages] + us_to_ns(machine.t_epilogue_us)) * waves + us_to_ns(machine.t_init_us)
    opt.minimize(overall)
    opt.minimize(waves * z3.Sum(waits))
    outcome = opt.check()
    elapsed = time.perf_counter() - started
    if outcome == z3.unsat:
        return None, True, elapsed
    try:
        model = opt.model()
    except z3.Z3Exception:
        return None, False, elapsed
    if len(model) == 0:
        return None, False, elapsed
    values = [model.eval(v, model_completion=True).as_long() for v in (tm, tn, tk, depth)]
    return Tiling(*values), outcome == z3.sat, elapsed
