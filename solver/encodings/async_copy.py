"""Z3 encoding of the async-copy GeMM-WS variant (docs/model-notes.md, "GeMM-WS async-copy").

Decision variables: TM, TN, TK, buffer depth D. Each encoded configuration fixes, by an
implication, the per-stage durations of its full waves (c CTAs sharing an SM) and of its partial
wave (r CTAs), its wave counts and its CTAs per SM; the recurrences (A1)-(A3) of each
configuration are integer constants ``I_<wave>_c<index>_<i>`` and ``M_<wave>_c<index>_<i>``
with its durations written in as numbers (``f``: full wave, ``p``: partial wave): Z3 evaluates
them by propagation, and only the choice among the configurations is searched (the
certificate's encoding, solver/per_configuration.py, where the bounds leave a handful).

The recurrences are unrolled over a window of at most 2 x D stages. Beyond it,
``M(S + D) - M(S)`` is the constant max(D max(d, T), d + lambda + T) for every S >= 1 (the
closed form of docs/model-notes.md async-copy 2), so with S = r + qD, 1 <= r <= D,
``M(S) = M(r) + q (M(r + D) - M(r))``: r + D <= 2D lies inside the window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from perfmodel.gemm_ws import Tiling
from perfmodel.pipeline import GemmOnMachine
from perfmodel.pipelines.async_copy import AsyncCopyPipeline
from perfmodel.pipelines.async_copy.bounds import AsyncConfig, encoded_configs
from perfmodel.pipelines.async_copy.recurrences import AsyncDurations, AsyncDurationTable
from solver.encoding import Encoding
from solver.smtlib import all_equal, maximum

if TYPE_CHECKING:
    from perfmodel.gemm_ws_scoring import Configurations


#: the variables every encoding declares (solver/encoding.py Encoding.parse reads them)
_DECLARATIONS = (
    "(declare-const tile_m Int) (declare-const tile_n Int) (declare-const tile_k Int)",
    "(declare-const buffer_depth Int)",
    "(declare-const overall_time Int) (declare-const total_math_wait Int)",
)


def encode_async_copy(
    model: AsyncCopyPipeline, gemm: GemmOnMachine, configs: Configurations
) -> Encoding:
    """The encoding of exactly ``configs`` under ``model`` (its SMs' residency limits): each
    configuration's constants from the model's plan (perfmodel/pipelines/async_copy/bounds.py),
    then :func:`encode_async`."""
    table = AsyncDurationTable(gemm.machine)
    encoded = encoded_configs(gemm.shape, gemm.machine, model.limits, gemm.element_bytes, configs)
    return encode_async(encoded, table.epilogue_ns, table.init_ns)


def encode_async(configs: Sequence[AsyncConfig], t_epilogue_ns: int, t_init_ns: int) -> Encoding:
    """Encode exactly ``configs`` (module docstring)."""
    if not configs:
        raise ValueError("encode_async needs at least one configuration")
    out = list(_DECLARATIONS)
    a = out.append
    waves = ("f", "p") if any(c.partial_wave_ctas for c in configs) else ("f",)
    # per depth, the window its configurations need: M(S) inside it, or M(r) and M(r + D)
    windows: dict[int, int] = {}
    for c in configs:
        depth = c.tiling.buffer_depth
        windows[depth] = max(windows.get(depth, 1), min(c.stages, 2 * depth))
    for wave in waves:
        for name in ("d", "lam", "t"):
            a(f"(declare-const {name}_{wave} Int)")

    choices = []
    for index, c in enumerate(configs):
        t = c.tiling
        window, key = windows[t.buffer_depth], f"c{index}"
        constant_recurrences(a, "f", t.buffer_depth, window, key, c.full)
        if c.partial_wave_ctas:
            constant_recurrences(a, "p", t.buffer_depth, window, key, c.partial)
        ms_f, ms_p = (
            last_math_start(f"M_{wave}_{key}", c.stages, t.buffer_depth, window)
            for wave in ("f", "p")
        )
        facts = _durations("f", c.full)
        if len(waves) == 2:
            facts += _durations("p", c.partial if c.partial_wave_ctas else c.full)
        facts += _objectives(c, ms_f, ms_p, t_epilogue_ns, t_init_ns)
        choices.append(_chosen(a, t, facts))
    a(f"(assert (or {' '.join(choices)}))")
    # No cut here: the certificate's bounds leave only configurations able to beat the
    # incumbent.
    return Encoding.parse("\n".join(out), overall_time_floor_ns=0)


def _chosen(a: Callable[[str], None], t: Tiling, facts: list[str]) -> str:
    """Assert ``facts`` of the configuration ``t``; its condition (one of the choices)."""
    chosen = all_equal(
        {"tile_m": t.tile_m, "tile_n": t.tile_n, "tile_k": t.tile_k, "buffer_depth": t.buffer_depth}
    )
    a(f"(assert (=> {chosen} (and {' '.join(facts)})))")
    return chosen


def _objectives(
    c: AsyncConfig, ms_f: str, ms_p: str, t_epilogue_ns: int, t_init_ns: int
) -> list[str]:
    """``overall_time`` and ``total_math_wait`` of ``c`` from the last MATH start of a full
    wave's CTA (``ms_f``) and of the partial wave's (``ms_p``, read only if it has one)."""
    # Overall = floor(q/c) full waves + the partial wave + T_INIT (async-copy 1); each wave
    # ends when its last MATH does: M(S) + T + T_EPILOGUE.
    overall = f"(* {c.full_waves} (+ {ms_f} t_f {t_epilogue_ns}))"
    # Sum of MATH waits telescopes to M(S) - (S - 1) T per CTA (GeMM-WS 8).
    wait = f"(* {c.full_waves * c.ctas_per_sm} (- {ms_f} (* {c.stages - 1} t_f)))"
    if c.partial_wave_ctas:
        overall = f"(+ {overall} {ms_p} t_p {t_epilogue_ns})"
        wait = f"(+ {wait} (* {c.partial_wave_ctas} (- {ms_p} (* {c.stages - 1} t_p))))"
    return [f"(= overall_time (+ {overall} {t_init_ns}))", f"(= total_math_wait {wait})"]


def _durations(wave: str, durations: AsyncDurations) -> list[str]:
    return [
        f"(= d_{wave} {durations.issue_ns})",
        f"(= lam_{wave} {durations.latency_ns})",
        f"(= t_{wave} {durations.math_ns})",
    ]


def last_math_start(prefix: str, stages: int, depth: int, window: int) -> str:
    """M(S): inside the window, else M(r) + q (M(r + D) - M(r)) with S = r + qD, 1 <= r <= D;
    ``prefix``: that of the per-stage constants."""
    if stages <= window:
        return f"{prefix}_{stages}"
    r = (stages - 1) % depth + 1
    q = (stages - r) // depth
    return f"(+ {prefix}_{r} (* {q} (- {prefix}_{r + depth} {prefix}_{r})))"


def constant_recurrences(
    a: Callable[[str], None],
    wave: str,
    depth: int,
    window: int,
    key: str,
    durations: AsyncDurations,
) -> None:
    """(A1)-(A3) for buffer depth ``depth`` over stages 1..window with ``durations`` as
    numbers, integer constants ``I_<wave>_<key>_<i>`` and ``M_<wave>_<key>_<i>``; for
    i <= depth the slot is free from the start (M(i - D) + T = 0), so (A1) is the copy
    engine's term alone."""
    d, lam, t = (str(v) for v in (durations.issue_ns, durations.latency_ns, durations.math_ns))

    def issue(i: int) -> str:
        return f"I_{wave}_{key}_{i}"

    def math(i: int) -> str:
        return f"M_{wave}_{key}_{i}"

    for i in range(1, window + 1):
        a(f"(declare-const {issue(i)} Int) (declare-const {math(i)} Int)")
        if i == 1:
            a(f"(assert (= {issue(1)} 0))")
        elif i <= depth:
            a(f"(assert (= {issue(i)} (+ {issue(i - 1)} {d})))")  # (A1), slot free
        else:
            engine_free, slot_free = f"(+ {issue(i - 1)} {d})", f"(+ {math(i - depth)} {t})"
            a(f"(assert (= {issue(i)} {maximum(engine_free, slot_free)}))")  # (A1)
        arrival = f"(+ {issue(i)} {d} {lam})"  # (A2)
        if i == 1:
            a(f"(assert (= {math(1)} {arrival}))")  # M(0) + T = 0 <= the arrival
        else:
            a(f"(assert (= {math(i)} {maximum(arrival, f'(+ {math(i - 1)} {t})')}))")  # (A3)
