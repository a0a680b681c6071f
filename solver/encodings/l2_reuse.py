"""Z3 encoding of the L2-reuse memory term (perfmodel/pipelines/l2_reuse.py): (A1)-(A3) per
configuration with its stage quantities (:meth:`L2ReuseModel.stage_times`, ticks of 1 ps)
written in as numbers, unrolled over 2 D stages and extrapolated by the period (the async-copy
encoding's, solver/encodings/async_copy.py), and the waves' composition in linear integer
arithmetic, each wave after the first the longer of its main part and the C store before it.
The configuration variables include group_m and split_k (:class:`RasterEncoding`), so one Z3
check covers every (tile, depth, group_m, split_k) the bounds leave.

Derivation: docs/model-notes.md, "Memory hierarchy, L2 reuse, split-K and tf32" 3 and 3b.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import z3

from perfmodel.gemm_ws import Tiling
from perfmodel.gemm_ws_memory_model import TICKS_PER_NS, StageTimes
from perfmodel.pipelines.async_copy.recurrences import AsyncDurations
from solver.encoding import Encoding
from solver.encodings.async_copy import constant_recurrences, last_math_start
from solver.smtlib import maximum as _max

if TYPE_CHECKING:
    from perfmodel.gemm_ws_scoring import Configurations
    from perfmodel.pipeline import GemmOnMachine
    from perfmodel.pipelines.l2_reuse import L2ReuseModel


@dataclass(frozen=True)
class RasterEncoding(Encoding):
    """An encoding whose configurations also choose group_m and split_k."""

    group_m: z3.ArithRef = field(default_factory=lambda: z3.Int("group_m"))
    split_k: z3.ArithRef = field(default_factory=lambda: z3.Int("split_k"))

    def tiling_of(self, model: z3.ModelRef) -> Tiling:
        def value(v: z3.ArithRef) -> int:
            return int(model.eval(v, model_completion=True).as_long())

        tiling = super().tiling_of(model)
        return dataclasses.replace(tiling, group_m=value(self.group_m), split_k=value(self.split_k))

    def is_tiling(self, tiling: Tiling) -> z3.BoolRef:
        return z3.And(
            super().is_tiling(tiling),
            self.group_m == tiling.group_m,
            self.split_k == tiling.split_k,
        )


def encode_l2_reuse(
    model: L2ReuseModel, gemm: GemmOnMachine, configs: Configurations
) -> RasterEncoding:
    """(A1)-(A3) and the waves of each of ``configs`` (module docstring)."""
    if not configs.count:
        raise ValueError("encode needs at least one configuration")
    return _encode(model.stage_times(gemm, configs), configs)


def _encode(s: StageTimes, configs: Configurations) -> RasterEncoding:
    out = [
        "(declare-const tile_m Int) (declare-const tile_n Int) (declare-const tile_k Int)",
        "(declare-const buffer_depth Int) (declare-const group_m Int) (declare-const split_k Int)",
        "(declare-const overall_time Int) (declare-const total_math_wait Int)",
        "(declare-const overall_ticks Int) (declare-const wait_ticks Int)",
    ]
    a = out.append
    per_sm, full, partial = s.wave_shares()
    # each wave kind's (d, lambda, T) of every configuration, computed once
    stage_of = {"f": s.wave(per_sm), "p": s.wave(np.maximum(partial, 1))}
    choices = []
    for i in range(configs.count):
        chosen = (
            f"(and (= tile_m {configs.tile_m[i]}) (= tile_n {configs.tile_n[i]}) "
            f"(= tile_k {configs.tile_k[i]}) (= buffer_depth {configs.buffer_depth[i]}) "
            f"(= group_m {configs.group_m[i]}) (= split_k {configs.split_k[i]}))"
        )
        choices.append(chosen)
        stages, depth = int(s.stages[i]), int(s.depth[i])
        window = max(1, min(stages, 2 * depth))
        waves: dict[str, tuple[str, str, int]] = {}
        for wave, share in (("f", int(per_sm[i])), ("p", int(partial[i]))):
            if not share or (wave == "f" and not full[i]):
                continue
            d = AsyncDurations(share, *(int(v[i]) for v in stage_of[wave]))
            key = f"c{i}"
            constant_recurrences(a, wave, depth, window, key, d)
            last = last_math_start(f"M_{wave}_{key}", stages, depth, window)
            main = f"(+ {last} {int(s.after_last_math(d.math_ns, share, i))})"
            wait = f"(* {share} (- {last} {(stages - 1) * d.math_ns}))"
            store = min(share * s.sm_count, int(s.ctas[i])) * int(s.store_per_cta[i])
            waves[wave] = (main, wait, store)
        terms, waits = [], []
        if "f" in waves:
            main, wait, store = waves["f"]
            # the first full wave, then each later one the longer of it and the store before
            terms += [main, f"(* {int(full[i]) - 1} {_max(main, str(store))})"]
            waits.append(f"(* {int(full[i])} {wait})")
        if "p" in waves:
            main_p, wait_p, store_p = waves["p"]
            terms.append(_max(main_p, str(waves["f"][2])) if "f" in waves else main_p)
            terms.append(str(store_p))
            waits.append(wait_p)
        else:
            terms.append(str(waves["f"][2]))
        a(
            f"(assert (=> {chosen} (and (= overall_ticks (+ {int(s.fixed[i])} {' '.join(terms)}))"
            f" (= wait_ticks (+ 0 {' '.join(waits)})))))"
        )
    a(f"(assert (or {' '.join(choices)}))")
    half = f"{TICKS_PER_NS // 2}"
    a(f"(assert (= overall_time (div (+ overall_ticks {half}) {TICKS_PER_NS})))")
    a(f"(assert (= total_math_wait (div (+ wait_ticks {half}) {TICKS_PER_NS})))")
    base = Encoding.parse("\n".join(out), overall_time_floor_ns=0)
    return RasterEncoding(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
