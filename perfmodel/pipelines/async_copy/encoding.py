"""Z3 encoding of the async-copy GeMM-WS variant (docs/model-notes.md, "GeMM-WS async-copy").

Decision variables: TM, TN, TK, buffer depth D. Each encoded configuration fixes, by an
implication, the per-stage durations of its full waves (c CTAs sharing an SM) and of its partial
wave (r CTAs), its wave counts and its CTAs per SM; the recurrences (A1)-(A3) are Int -> Int
arrays ``If``/``Mf`` (full wave) and ``Ip``/``Mp`` (partial wave) with the slot release
``M(i - D)`` a select at a symbolic index, and ``M(j) = -T`` for j <= 0 ("every slot free at
time 0", as in solver/encoding.py).

The arrays are unrolled over a window of at most 2 x max(D) stages. Beyond it,
``M(S + D) - M(S)`` is the constant max(D max(d, T), d + lambda + T) for every S >= 1 (the
closed form of docs/model-notes.md async-copy 2), so with S = r + qD, 1 <= r <= D,
``M(S) = M(r) + q (M(r + D) - M(r))``: r + D <= 2D lies inside the window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfmodel.gemm_ws import Tiling
from perfmodel.pipelines.async_copy.recurrences import AsyncDurations
from solver.encoding import Encoding, _int, _max


@dataclass(frozen=True, slots=True)
class AsyncConfig:
    """One configuration to encode, with everything that is constant once it is chosen."""

    tiling: Tiling
    stages: int
    full_waves: int
    ctas_per_sm: int
    partial_wave_ctas: int
    full: AsyncDurations
    #: durations of the partial wave (r CTAs sharing); unused when partial_wave_ctas is 0
    partial: AsyncDurations


#: the variables every encoding declares (solver/encoding.py Encoding.parse reads them)
_DECLARATIONS = (
    "(declare-const tile_m Int) (declare-const tile_n Int) (declare-const tile_k Int)",
    "(declare-const buffer_depth Int)",
    "(declare-const overall_time Int) (declare-const total_math_wait Int)",
)


def encode_async(
    configs: Sequence[AsyncConfig],
    t_epilogue_ns: int,
    t_init_ns: int,
    *,
    per_depth: bool = False,
    per_configuration: bool = False,
) -> Encoding:
    """Encode exactly ``configs`` (the survivors of the optimizer's presolve).

    ``per_depth``: instead of one pair of arrays indexed at ``i - buffer_depth`` (a select at
    a symbolic index), one set of integer constants ``M_<wave>_<D>_<i>`` per buffer depth D of
    the configurations, with the slot release M(i - D) at a constant index: the same
    recurrences (A1)-(A3) in linear integer arithmetic without arrays, which Z3 decides
    several times faster.

    ``per_configuration``: the same constants per encoded configuration, its durations written
    in as numbers: Z3 evaluates (A1)-(A3) of each configuration by propagation, and only the
    choice among them is searched (the certificate's encoding, solver/per_configuration.py,
    where the bounds leave a handful of configurations).
    """
    if not configs:
        raise ValueError("encode_async needs at least one configuration")
    if per_depth or per_configuration:
        return _encode_per_depth(configs, t_epilogue_ns, t_init_ns, per_configuration)
    deepest = max(c.tiling.buffer_depth for c in configs)
    window = max(2, min(max(c.stages for c in configs), 2 * deepest))
    out = list(_DECLARATIONS)
    a = out.append
    # The partial-wave schedule only when some configuration has a partial wave.
    waves = ("f", "p") if any(c.partial_wave_ctas for c in configs) else ("f",)
    for wave in waves:
        for name in ("d", "lam", "t", "ms"):
            a(f"(declare-const {name}_{wave} Int)")
        a(f"(declare-const I{wave} (Array Int Int)) (declare-const M{wave} (Array Int Int))")
        _recurrences(a, wave, window, deepest)

    choices = []
    for c in configs:
        t = c.tiling
        facts = [
            *_durations("f", c.full),
            f"(= ms_f {_last_math_start('Mf', c.stages, t.buffer_depth, window)})",
        ]
        if len(waves) == 2:
            facts += _durations("p", c.partial if c.partial_wave_ctas else c.full)
            facts.append(f"(= ms_p {_last_math_start('Mp', c.stages, t.buffer_depth, window)})")
        facts += _objectives(c, "ms_f", "ms_p", t_epilogue_ns, t_init_ns)
        choices.append(_chosen(a, t, facts))
    a(f"(assert (or {' '.join(choices)}))")

    # No cut here: the optimizer's presolve gives the overall-time probe instead.
    return Encoding.parse("\n".join(out), overall_time_floor_ns=0)


def _chosen(a: Callable[[str], None], t: Tiling, facts: list[str]) -> str:
    """Assert ``facts`` of the configuration ``t``; its condition (one of the choices)."""
    chosen = (
        f"(and (= tile_m {t.tile_m}) (= tile_n {t.tile_n}) (= tile_k {t.tile_k}) "
        f"(= buffer_depth {t.buffer_depth}))"
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


def _recurrences(a: Callable[[str], None], wave: str, window: int, deepest: int) -> None:
    issue, math, d, lam, t = f"I{wave}", f"M{wave}", f"d_{wave}", f"lam_{wave}", f"t_{wave}"
    # M(j) = -T for j <= 0: M(j) + T = 0, the slot is free from the start; M(0) + T = 0 too.
    for j in range(1 - deepest, 1):
        a(f"(assert (= (select {math} {_int(j)}) (- {t})))")
    for i in range(1, window + 1):
        if i == 1:
            a(f"(assert (= (select {issue} 1) 0))")
        else:
            engine_free = f"(+ (select {issue} {i - 1}) {d})"
            slot_free = f"(+ (select {math} (- {i} buffer_depth)) {t})"
            a(f"(assert (= (select {issue} {i}) {_max(engine_free, slot_free)}))")  # (A1)
        arrival = f"(+ (select {issue} {i}) {d} {lam})"  # (A2)
        previous = f"(+ (select {math} {i - 1}) {t})"
        a(f"(assert (= (select {math} {i}) {_max(arrival, previous)}))")  # (A3)


def _last_math_start(
    array: str, stages: int, depth: int, window: int, constants: bool = False
) -> str:
    """M(S): inside the window, else M(r) + q (M(r + D) - M(r)) with S = r + qD, 1 <= r <= D;
    ``array`` is an array name, or with ``constants`` the prefix of per-stage constants."""

    def at(i: int) -> str:
        return f"{array}_{i}" if constants else f"(select {array} {i})"

    if stages <= window:
        return at(stages)
    r = (stages - 1) % depth + 1
    q = (stages - r) // depth
    return f"(+ {at(r)} (* {q} (- {at(r + depth)} {at(r)})))"


def _encode_per_depth(
    configs: Sequence[AsyncConfig], t_epilogue_ns: int, t_init_ns: int, per_configuration: bool
) -> Encoding:
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
        if not per_configuration:
            for depth, window in sorted(windows.items()):
                _constant_recurrences(a, wave, depth, window)

    choices = []
    for index, c in enumerate(configs):
        t = c.tiling
        window = windows[t.buffer_depth]
        # the recurrences of this configuration: its depth's (shared), or its own with its
        # durations as numbers
        key = f"c{index}" if per_configuration else str(t.buffer_depth)
        if per_configuration:
            _constant_recurrences(a, "f", t.buffer_depth, window, key, c.full)
            if c.partial_wave_ctas:
                _constant_recurrences(a, "p", t.buffer_depth, window, key, c.partial)
        ms_f, ms_p = (
            _last_math_start(f"M_{wave}_{key}", c.stages, t.buffer_depth, window, True)
            for wave in ("f", "p")
        )
        facts = _durations("f", c.full)
        if len(waves) == 2:
            facts += _durations("p", c.partial if c.partial_wave_ctas else c.full)
        facts += _objectives(c, ms_f, ms_p, t_epilogue_ns, t_init_ns)
        choices.append(_chosen(a, t, facts))
    a(f"(assert (or {' '.join(choices)}))")
    return Encoding.parse("\n".join(out), overall_time_floor_ns=0)


def _constant_recurrences(
    a: Callable[[str], None],
    wave: str,
    depth: int,
    window: int,
    key: str | None = None,
    durations: AsyncDurations | None = None,
) -> None:
    """(A1)-(A3) for buffer depth ``depth`` over stages 1..window, integer constants
    ``I_<wave>_<key>_<i>`` and ``M_<wave>_<key>_<i>`` (key: the depth, or a configuration's
    own with its ``durations`` as numbers); for i <= depth the slot is free from the start
    (M(i - D) + T = 0), so (A1) is the copy engine's term alone."""
    d, lam, t = f"d_{wave}", f"lam_{wave}", f"t_{wave}"
    if durations is not None:
        d, lam, t = (str(v) for v in (durations.issue_ns, durations.latency_ns, durations.math_ns))
    key = key or str(depth)

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
            a(f"(assert (= {issue(i)} {_max(engine_free, slot_free)}))")  # (A1)
        arrival = f"(+ {issue(i)} {d} {lam})"  # (A2)
        if i == 1:
            a(f"(assert (= {math(1)} {arrival}))")  # M(0) + T = 0 <= the arrival
        else:
            a(f"(assert (= {math(i)} {_max(arrival, f'(+ {math(i - 1)} {t})')}))")  # (A3)
