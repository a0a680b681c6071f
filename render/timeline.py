"""GeMM-WS pipeline timeline of one tiling (warp-specialization-gemm-model.txt §2).

Two panels. The top one is the whole kernel: T_INIT, then W identical waves (§2.1.1), with
the labelled total ``W x wave + T_INIT``. The bottom one is one wave, stage by stage
(eq. 1-3): the DMA warp's lane (load A, load B, and its stalls on a full buffer), the MATH
warp's lane (MATH per stage and the wait before it), the buffer slots freed when a MATH
ends, and T_EPILOGUE at the end of the wave. Long pipelines keep their first
:data:`FIRST_STAGES` and last :data:`LAST_STAGES` stages; the periodic middle is cut out of
the time axis and labelled (above :data:`MAX_STAGES_DRAWN` stages).

Every drawn element has an SVG id (matplotlib ``gid``) a reader or a test can find:
``stage-<i>-load-a``, ``stage-<i>-load-b``, ``stage-<i>-math``, ``stage-<i>-math-wait``,
``stage-<i>-dma-stall``, ``slot-free-<i>``, ``t-epilogue``, ``wave-end``, ``elided-stages``;
in the kernel panel ``t-init``, ``wave-<w>``, ``wave-boundary-<w>``, ``elided-waves`` and
``total`` (the text ``total = ... = <predicted_time_us> µs``).

The async-copy variant (docs/model-notes.md, "GeMM-WS async-copy"), :func:`async_timeline_svg`,
shares the kernel panel (there T_INIT, the full waves of c CTAs sharing each SM as one box
``waves-full`` and the last, partial wave ``wave-partial``), the bars, the wave's end and the
frame. Its wave panel has one row per stage (eq. A1-A3): the copy *issue* (d, on the copy
engine shared by the SM's c CTAs), the copy *in flight* (lambda), the *arrival*, the MATH
warp's wait and its MATH (T); ids ``stage-<i>-issue``, ``stage-<i>-in-flight``,
``stage-<i>-arrival``, ``stage-<i>-math-wait``, ``stage-<i>-math``, ``t-epilogue``,
``wave-end`` and ``stages-not-drawn``. Stages whose in-flight spans overlap are loads in flight
together (at most ``buffer_depth``); pipelines over :data:`MAX_ASYNC_STAGES_DRAWN` stages show
their first stages only, and say so.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

from perfmodel.gemm_ws import GemmWsMachine, Simulation, StageEvents, us_to_ns
from render._figure import (
    TimelineLabels,
    bottom_legend,
    figure,
    fmt_us,
    kernel_legend_tail,
    svg_bytes,
    timeline_heading,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation

#: a panel's place in its figure: left, bottom, width, height (fractions of the figure)
Rect = tuple[float, float, float, float]

#: stages drawn at the start and at the end of a long pipeline
FIRST_STAGES = 8
LAST_STAGES = 4
#: pipelines up to this long are drawn whole
MAX_STAGES_DRAWN = 24
#: waves drawn at the start of a kernel with many waves (plus the last one)
FIRST_WAVES = 2
MAX_WAVES_DRAWN = 5
#: width of a cut in the time axis, as a fraction of the drawn span
GAP_FRACTION = 0.07

COLORS = {
    "load_a": "#4C72B0",
    "load_b": "#64B5CD",
    "dma_stall": "#BBBBBB",
    "math": "#DD8452",
    "math_wait": "#C44E52",
    "slot": "#55A868",
    "epilogue": "#8172B3",
    "init": "#937860",
    "wave": "#CCB974",
    "cut": "#F2F2F2",
}
LANES = {"dma": 3.0, "math": 2.0, "slots": 1.0, "epilogue": 0.0}
BAR_HEIGHT = 0.6
#: async-copy pipelines up to this long are drawn whole; longer ones show this many first stages
MAX_ASYNC_STAGES_DRAWN = 16
#: the in-flight span is drawn thinner than the work bars: it is time, not work
FLIGHT_HEIGHT = 0.22
#: the async-copy MATH wait is a thin band under its stage's row
WAIT_HEIGHT = 0.12
ASYNC_COLORS = {"issue": COLORS["load_a"], "flight": COLORS["load_b"], "arrival": "#1B3A5C"}
#: behind labels that may lie over bars or a cut
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5}


@dataclass(frozen=True, slots=True)
class TimeAxis:
    """Real time (ns) to drawn x (µs): the interval (cut_start, cut_end) is replaced by a gap.

    Without a cut, x is the time in µs. Times inside the cut are never drawn.
    """

    cut_start_ns: int | None = None
    cut_end_ns: int | None = None
    gap_us: float = 0.0

    def x(self, t_ns: int) -> float:
        if self.cut_start_ns is None or self.cut_end_ns is None or t_ns <= self.cut_start_ns:
            return t_ns / 1000
        return (t_ns - (self.cut_end_ns - self.cut_start_ns)) / 1000 + self.gap_us

    def segments(self, end_ns: int) -> list[tuple[int, int]]:
        """The drawn ranges of real time, in ns."""
        if self.cut_start_ns is None or self.cut_end_ns is None:
            return [(0, end_ns)]
        return [(0, self.cut_start_ns), (self.cut_end_ns, end_ns)]


def with_cut(start_ns: int, end_ns: int, drawn_span_ns: int) -> TimeAxis:
    """A :class:`TimeAxis` cutting out (start, end), its gap a fixed share of the drawing."""
    gap_us = GAP_FRACTION * drawn_span_ns / 1000 / (1 - GAP_FRACTION)
    return TimeAxis(start_ns, end_ns, gap_us)


@dataclass(frozen=True, slots=True)
class StageSelection:
    """What the wave panel draws: the stages whose MATH it shows, and the cut in time."""

    shown: tuple[int, ...]
    elided: tuple[int, int] | None  # first and last stage whose MATH is cut out
    axis: TimeAxis


def select_stages(sim: Simulation, wave_end_ns: int) -> StageSelection:
    """All stages of a short pipeline; else the first and last ones, cutting the middle out.

    The cut runs from the end of MATH ``FIRST_STAGES`` to the end of the last elided MATH,
    so the MATH lane shows whole stages on both sides. Everything else (loads, stalls,
    waits, freed slots) is drawn wherever it falls in the two windows, clipped at the cut:
    the DMA warp runs ahead of MATH, so the loads beside a MATH belong to later stages.
    """
    stages, t_math = sim.stages, sim.durations.t_math_ns
    if stages <= MAX_STAGES_DRAWN:
        return StageSelection(tuple(range(1, stages + 1)), None, TimeAxis())
    last_elided = stages - LAST_STAGES
    cut_start = sim.events[FIRST_STAGES - 1].math_start_ns + t_math
    cut_end = sim.events[last_elided - 1].math_start_ns + t_math
    end = max(wave_end_ns, sim.events[-1].math_start_ns + t_math)
    drawn = cut_start + (end - cut_end)
    shown = (*range(1, FIRST_STAGES + 1), *range(last_elided + 1, stages + 1))
    return StageSelection(
        shown, (FIRST_STAGES + 1, last_elided), with_cut(cut_start, cut_end, drawn)
    )


def visible(axis: TimeAxis, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
    """The parts of [start, end] outside the cut (none, one, or two when it spans the cut).

    An empty interval (a duration that rounds to 0 ns) is kept where it is drawn: a point.
    """
    if end_ns < start_ns:
        return []
    cut_start, cut_end = axis.cut_start_ns, axis.cut_end_ns
    if cut_start is None or cut_end is None:
        return [(start_ns, end_ns)]
    if end_ns == start_ns:
        return [(start_ns, end_ns)] if not cut_start < start_ns < cut_end else []
    parts = []
    if start_ns < cut_start:
        parts.append((start_ns, min(end_ns, cut_start)))
    if end_ns > cut_end:
        parts.append((max(start_ns, cut_end), end_ns))
    return parts


def _candidate_stages(sim: Simulation, axis: TimeAxis) -> list[int]:
    """Stages with something in a window: a stage's DMA work and stalls span
    [Sb(i-1) + T_LOAD-B, Sb(i) + T_LOAD-B], its MATH wait and MATH [Sm(i-1) + T_MATH, ...]."""
    events, t_b = sim.events, sim.durations.t_load_b_ns
    if axis.cut_start_ns is None or axis.cut_end_ns is None:
        return list(range(1, sim.stages + 1))
    cut_start, cut_end = axis.cut_start_ns, axis.cut_end_ns
    # stage i starts (its load A, or the stall before it) at Sb(i-1) + T_LOAD-B: stages up to
    # one past the last load B that ends before the cut reach into the first window
    early = bisect.bisect_left(events, cut_start, key=lambda e: e.load_b_start_ns + t_b) + 1
    # the second window: from the first stage whose load B ends after the cut, and at the
    # latest the first stage whose MATH is shown there
    late = bisect.bisect_right(events, cut_end, key=lambda e: e.load_b_start_ns + t_b) + 1
    late = min(late, sim.stages - LAST_STAGES + 1)
    early = max(early, FIRST_STAGES)  # the shown MATHs, even when durations round to 0 ns
    return sorted({*range(1, min(early, sim.stages) + 1), *range(late, sim.stages + 1)})


def _period_text(events: Sequence[StageEvents], first: int, last: int) -> str:
    """MATH start to MATH start across the elided stages: one value when periodic."""
    steps = {
        events[i].math_start_ns - events[i - 1].math_start_ns for i in range(first - 1, last + 1)
    }
    if len(steps) == 1:
        return f"periodic: one stage every {fmt_us(steps.pop() / 1000)}"
    return f"not periodic: {fmt_us(min(steps) / 1000)} to {fmt_us(max(steps) / 1000)} per stage"


def _bar(
    ax: Axes,
    axis: TimeAxis,
    start_ns: int,
    end_ns: int,
    lane: str | float,
    gid: str,
    *,
    work: bool = True,
    **style: Any,
) -> None:
    """One bar centred on ``lane`` (a name of :data:`LANES`, or a row's y), clipped to the
    drawn windows (a second part gets the id ``<gid>-2``).

    Work (a load, a MATH) is drawn even when it takes 0 ns; a wait of 0 ns is not a wait.
    """
    from matplotlib.patches import Rectangle

    if not work and end_ns <= start_ns:
        return
    height = style.pop("height", BAR_HEIGHT)
    y = (LANES[lane] if isinstance(lane, str) else lane) - height / 2
    for n, (s0, s1) in enumerate(visible(axis, start_ns, end_ns)):
        x0, x1 = axis.x(s0), axis.x(s1)
        part = gid if n == 0 else f"{gid}-2"
        # add_artist, not add_patch: the limits are set explicitly, autoscaling is wasted work
        ax.add_artist(Rectangle((x0, y), x1 - x0, height, gid=part, **style))


def _time_ticks(ax: Axes, axis: TimeAxis, end_ns: int) -> None:
    """Ticks labelled with real µs on each drawn segment of a (possibly cut) time axis."""
    from matplotlib.ticker import MaxNLocator

    locator = MaxNLocator(nbins=6 if axis.cut_start_ns is None else 3, steps=[1, 2, 2.5, 5, 10])
    ticks: list[float] = []
    labels: list[str] = []
    for lo, hi in axis.segments(end_ns):
        for value_us in locator.tick_values(lo / 1000, hi / 1000):
            t_ns = round(value_us * 1000)
            if lo <= t_ns <= hi:
                ticks.append(axis.x(t_ns))
                labels.append(f"{value_us:,.0f}" if value_us == int(value_us) else f"{value_us:,g}")
    ax.set_xticks(ticks, labels)


def _cut_band(ax: Axes, axis: TimeAxis, gid: str, text: str, rotation: float = 90) -> None:
    assert axis.cut_start_ns is not None
    x0 = axis.x(axis.cut_start_ns)
    ax.axvspan(x0, x0 + axis.gap_us, color=COLORS["cut"], zorder=0, gid=f"{gid}-band")
    ax.text(
        x0 + axis.gap_us / 2,
        0.5,
        text,
        transform=ax.get_xaxis_transform(),
        rotation=rotation,
        ha="center",
        va="center",
        fontsize=7.5,
        color="#555555",
        gid=gid,
    )


def _work(color: str) -> dict[str, Any]:
    """The style of a work bar (a load, a MATH, the epilogue): filled, a thin white edge."""
    return {"facecolor": color, "edgecolor": "white", "linewidth": 0.4}


STYLE: dict[str, dict[str, Any]] = {
    "load-a": _work(COLORS["load_a"]),
    "load-b": _work(COLORS["load_b"]),
    "dma-stall": {
        "facecolor": "none",
        "edgecolor": COLORS["dma_stall"],
        "hatch": "////",
        "linewidth": 0.5,
    },
    "math": _work(COLORS["math"]),
    "math-wait": {
        "facecolor": COLORS["math_wait"],
        "alpha": 0.25,
        "edgecolor": COLORS["math_wait"],
        "hatch": "xx",
        "linewidth": 0.5,
    },
    "epilogue": _work(COLORS["epilogue"]),
}
#: the async-copy wave panel's bars; the in-flight span and the MATH wait are thinner
ASYNC_STYLE: dict[str, dict[str, Any]] = {
    "issue": _work(ASYNC_COLORS["issue"]),
    "in-flight": {
        "height": FLIGHT_HEIGHT,
        "facecolor": ASYNC_COLORS["flight"],
        "edgecolor": "none",
    },
    "math-wait": {
        "height": WAIT_HEIGHT,
        "facecolor": COLORS["math_wait"],
        "alpha": 0.35,
        "edgecolor": "none",
    },
    "math": _work(COLORS["math"]),
}
#: bars that stand for a wait, not for work: a wait of 0 ns is not drawn
_WAITS = ("dma-stall", "dma-stall-b", "math-wait")


def _draw_stage(
    ax: Axes, sim: Simulation, axis: TimeAxis, i: int, math_shown: bool, label_min_ns: float
) -> None:
    """Stage i's bars, each clipped to the drawn windows; its MATH side if ``math_shown``."""
    d, events = sim.durations, sim.events
    e = events[i - 1]
    a_end, b_end = e.load_a_start_ns + d.t_load_a_ns, e.load_b_start_ns + d.t_load_b_ns
    math_end = e.math_start_ns + d.t_math_ns
    previous_b_end = events[i - 2].load_b_start_ns + d.t_load_b_ns if i > 1 else 0
    # DMA stalls: eq. (1)/(2) waited for a free buffer slot (the MATH of stage i - depth);
    # §3.2 Wait(i): the MATH warp idles until b_i has arrived
    bars = [
        (previous_b_end, e.load_a_start_ns, "dma", "dma-stall", "dma-stall"),
        (a_end, e.load_b_start_ns, "dma", "dma-stall-b", "dma-stall"),
        (e.load_a_start_ns, a_end, "dma", "load-a", "load-a"),
        (e.load_b_start_ns, b_end, "dma", "load-b", "load-b"),
    ]
    if math_shown:
        wait_start = e.math_start_ns - e.math_wait_ns
        bars += [
            (wait_start, e.math_start_ns, "math", "math-wait", "math-wait"),
            (e.math_start_ns, math_end, "math", "math", "math"),
        ]
    for start, end, lane, part, style in bars:
        gid = f"stage-{i}-{part}"
        _bar(ax, axis, start, end, lane, gid, work=part not in _WAITS, **STYLE[style])
    if not math_shown:
        return
    # the stage number: inside its MATH bar when it fits, else just below it
    inside = d.t_math_ns >= label_min_ns
    ax.text(
        axis.x(e.math_start_ns + d.t_math_ns // 2),
        LANES["math"] if inside else LANES["math"] - BAR_HEIGHT / 2 - 0.04,
        str(i),
        ha="center",
        va="center" if inside else "top",
        fontsize=7,
        color="white" if inside else "#333333",
        gid=f"stage-{i}-number",
    )
    # the slot of stage i is free when its MATH ends; stage i + depth loads into it
    from matplotlib.lines import Line2D

    ax.add_artist(
        Line2D(
            [axis.x(math_end)],
            [LANES["slots"]],
            marker="v",
            markersize=5,
            color=COLORS["slot"],
            linestyle="none",
            gid=f"slot-free-{i}",
        )
    )


def _draw_wave(ax: Axes, sim: Simulation, machine: GemmWsMachine, wave_end_ns: int) -> str:
    """The wave panel; returns its title."""
    d = sim.durations
    selection = select_stages(sim, wave_end_ns)
    axis = selection.axis
    end_ns = max(wave_end_ns, sim.events[-1].math_start_ns + d.t_math_ns)
    label_min_ns = 0.025 * axis.x(end_ns) * 1000
    shown = set(selection.shown)
    for i in _candidate_stages(sim, axis):
        _draw_stage(ax, sim, axis, i, i in shown, label_min_ns)
    epilogue_ns = us_to_ns(machine.t_epilogue_us)
    _bar(
        ax,
        axis,
        wave_end_ns - epilogue_ns,
        wave_end_ns,
        "epilogue",
        "t-epilogue",
        **STYLE["epilogue"],
    )
    ax.text(
        axis.x(wave_end_ns - epilogue_ns),
        LANES["epilogue"],
        f"T_EPILOGUE = {fmt_us(epilogue_ns / 1000)} ",
        ha="right",
        va="center",
        fontsize=7.5,
    )
    _wave_end(ax, axis.x(wave_end_ns), LANES["dma"] + 0.55, "Sm(S) + T_EPILOGUE", wave_end_ns)
    if selection.elided is not None:
        first, last = selection.elided
        _cut_band(
            ax,
            axis,
            "elided-stages",
            f"MATH of stages {first}–{last} ({last - first + 1}) elided\n"
            f"{_period_text(sim.events, first, last)}",
        )
    ax.set_xlim(0, axis.x(end_ns) * 1.01)
    ax.set_ylim(LANES["epilogue"] - 0.6, LANES["dma"] + 0.9)
    ax.set_yticks(
        [LANES[k] for k in ("dma", "math", "slots", "epilogue")],
        ["DMA warp", "MATH warp", "slot freed", "epilogue"],
    )
    _time_ticks(ax, axis, end_ns)
    ax.set_xlabel("time from the wave's start (µs)")
    if selection.elided is None:
        return f"one wave: all {sim.stages} stages"
    first, last = selection.elided
    return (
        f"one wave: MATH of stages 1–{first - 1} and {last + 1}–{sim.stages} of {sim.stages} "
        "shown, the middle elided"
    )


def _wave_end(ax: Axes, x: float, y: float, sum_text: str, wave_ns: int) -> None:
    """The dashed end of the wave and its labelled time ``wave = <sum_text> = ...``."""
    ax.axvline(x, color="black", linewidth=0.8, linestyle="--", gid="wave-end")
    ax.text(
        x,
        y,
        f"wave = {sum_text} = {fmt_us(wave_ns / 1000)}",
        ha="right",
        va="bottom",
        fontsize=7.5,
        bbox=LABEL_BOX,
        gid="wave-time",
    )


def _kernel_box(
    ax: Axes, axis: TimeAxis, span_ns: tuple[int, int], end_ns: int, gid: str, color: str, text: str
) -> None:
    """One box of the kernel panel; its text when the box is wide enough to hold it."""
    _bar(ax, axis, *span_ns, 0.0, gid, facecolor=color, edgecolor="white", linewidth=0.8)
    x0, x1 = axis.x(span_ns[0]), axis.x(span_ns[1])
    if (x1 - x0) >= 0.08 * axis.x(end_ns):
        ax.text((x0 + x1) / 2, 0.0, text, ha="center", va="center", fontsize=7.5)


def _kernel_frame(ax: Axes, axis: TimeAxis, end_ns: int, total_text: str) -> None:
    """The kernel panel's axes and its labelled total ``total = ... = <overall time>``."""
    ax.set_xlim(0, axis.x(end_ns) * 1.01)
    ax.set_ylim(-0.5, 0.9)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("time from the kernel's launch (µs)")
    ax.text(
        1.0,
        0.98,
        total_text,
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8.5,
        fontweight="bold",
        bbox=LABEL_BOX,
        gid="total",
    )


def _draw_kernel(ax: Axes, sim: Simulation, machine: GemmWsMachine) -> None:
    init_ns = us_to_ns(machine.t_init_us)
    wave_ns, waves = sim.wave_time_ns, sim.waves
    end_ns = init_ns + waves * wave_ns
    if waves > MAX_WAVES_DRAWN:
        drawn_waves = [*range(1, FIRST_WAVES + 1), waves]
        cut = (init_ns + FIRST_WAVES * wave_ns, init_ns + (waves - 1) * wave_ns)
        axis = with_cut(cut[0], cut[1], init_ns + (FIRST_WAVES + 1) * wave_ns)
    else:
        drawn_waves = list(range(1, waves + 1))
        axis = TimeAxis()
    box = functools.partial(_kernel_box, ax, axis, end_ns=end_ns)
    box((0, init_ns), gid="t-init", color=COLORS["init"], text="T_INIT")
    for w in drawn_waves:
        start = init_ns + (w - 1) * wave_ns
        box(
            (start, start + wave_ns),
            gid=f"wave-{w}",
            color=COLORS["wave"],
            text=f"wave {w}\n{fmt_us(wave_ns / 1000)}",
        )
        if w > 1:
            x = axis.x(start)
            ax.vlines(x, -0.4, 0.4, color="black", linewidth=0.8, gid=f"wave-boundary-{w}")
    if axis.cut_start_ns is not None:
        _cut_band(ax, axis, "elided-waves", f"waves\n{FIRST_WAVES + 1}–{waves - 1}", rotation=0)
    ax.text(
        0.0,
        0.98,
        f"T_INIT = {fmt_us(machine.t_init_us)}",
        transform=ax.transAxes,
        ha="left",
        va="top",
        fontsize=7.5,
    )
    _kernel_frame(
        ax,
        axis,
        end_ns,
        f"total = W × wave + T_INIT = {waves} × {fmt_us(wave_ns / 1000)} + "
        f"{fmt_us(init_ns / 1000)} = {fmt_us(sim.overall_time_ns / 1000)}",
    )
    _time_ticks(ax, axis, end_ns)


def _legend(fig: Any) -> None:
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=COLORS["load_a"], label="load A (DMA)"),
        Patch(facecolor=COLORS["load_b"], label="load B (DMA)"),
        Patch(
            facecolor="none",
            edgecolor=COLORS["dma_stall"],
            hatch="////",
            label="DMA stalls: buffer full",
        ),
        Patch(facecolor=COLORS["math"], label="MATH"),
        Patch(
            facecolor=COLORS["math_wait"],
            alpha=0.25,
            edgecolor=COLORS["math_wait"],
            hatch="xx",
            label="MATH waits for data",
        ),
        Patch(facecolor=COLORS["slot"], label="▼ slot freed (MATH done)"),
        *kernel_legend_tail(COLORS, "wave", None),
    ]
    bottom_legend(fig, handles)


def timeline_svg(
    sim: Simulation, machine: GemmWsMachine, **labels: Unpack[TimelineLabels]
) -> bytes:
    """The timeline of ``sim`` (one tiling simulated on ``machine``) as SVG bytes."""
    d = sim.durations
    wave_end_ns = sim.wave_time_ns
    load = d.t_load_a_ns + d.t_load_b_ns
    bound = (
        f"load-bound: T_LOAD-A {fmt_us(d.t_load_a_ns / 1000)} + T_LOAD-B "
        f"{fmt_us(d.t_load_b_ns / 1000)} > T_MATH {fmt_us(d.t_math_ns / 1000)}"
        if sim.load_bound
        else f"MATH-bound: T_MATH {fmt_us(d.t_math_ns / 1000)} ≥ T_LOAD-A + T_LOAD-B "
        f"{fmt_us(load / 1000)}"
    )
    return _timeline_figure(
        5.6,
        ((0.095, 0.72, 0.88, 0.11), (0.095, 0.2, 0.88, 0.38)),
        timeline_heading("GeMM-WS timeline", sim, labels) + "\n"
        f"{bound}; {sim.stages} stages × {sim.waves} waves; MATH wait "
        f"{fmt_us(sim.total_math_wait_ns / 1000)} in all (W × Σ Wait(i))",
        (
            lambda ax: _draw_kernel(ax, sim, machine),
            "kernel: T_INIT, then W identical waves (§2.1.1)",
        ),
        lambda ax: _draw_wave(ax, sim, machine, wave_end_ns) + " (eq. 1–3)",
        _legend,
    )


def _timeline_figure(
    height_in: float,
    panels: tuple[Rect, Rect],
    heading: str,
    kernel: tuple[Callable[[Axes], None], str],
    wave: Callable[[Axes], str],
    legend: Callable[[Figure], None],
) -> bytes:
    """A timeline picture as SVG bytes: ``heading`` over the kernel panel (drawn, then titled)
    and the wave panel below it (its drawing returns its title), then the ``legend``. A fixed
    layout (``panels``: figure fractions): constrained layout would cost a third of the
    drawing time."""
    with figure(11.0, height_in, layout=None) as fig:
        top, bottom = (fig.add_axes(rect) for rect in panels)
        fig.suptitle(heading, fontsize=9.5)
        draw_kernel, kernel_title = kernel
        draw_kernel(top)
        top.set_title(kernel_title, loc="left", fontsize=8.5)
        bottom.set_title(wave(bottom), loc="left", fontsize=8.5)
        legend(fig)
        return svg_bytes(fig)


def _draw_async_kernel(ax: Axes, sim: AsyncSimulation, machine: GemmWsMachine) -> None:
    """T_INIT, the full waves of c CTAs per SM as one box, then the partial wave (async-copy 1)."""
    init_ns = us_to_ns(machine.t_init_us)
    full_ns = sim.full_waves * sim.wave_time_ns
    # the partial wave's time: what the overall time holds beyond T_INIT and the full waves
    partial_ns = sim.overall_time_ns - init_ns - full_ns
    axis = TimeAxis()
    box = functools.partial(_kernel_box, ax, axis, end_ns=sim.overall_time_ns)
    box((0, init_ns), gid="t-init", color=COLORS["init"], text="T_INIT")
    wave = fmt_us(sim.wave_time_ns / 1000)
    if sim.full_waves:
        box(
            (init_ns, init_ns + full_ns),
            gid="waves-full",
            color=COLORS["wave"],
            text=f"{sim.full_waves} wave(s) × {wave}, {sim.ctas_per_sm} CTA(s) per SM",
        )
    if sim.partial_wave_ctas:
        box(
            (init_ns + full_ns, sim.overall_time_ns),
            gid="wave-partial",
            color=COLORS["slot"],
            text=f"last wave: {sim.partial_wave_ctas} CTA(s)",
        )
    partial = f" + {fmt_us(partial_ns / 1000)}" if sim.partial_wave_ctas else ""
    _kernel_frame(
        ax,
        axis,
        sim.overall_time_ns,
        f"total = {sim.full_waves} × {wave}{partial} + "
        f"{fmt_us(init_ns / 1000)} = {fmt_us(sim.overall_time_ns / 1000)}",
    )


def _draw_async_wave(ax: Axes, sim: AsyncSimulation, machine: GemmWsMachine) -> str:
    """The async-copy wave panel, one row per drawn stage (stage 1 on top); returns its title."""
    from matplotlib.lines import Line2D

    d, t, axis = sim.durations.issue_ns, sim.durations.math_ns, TimeAxis()
    drawn = min(sim.stages, MAX_ASYNC_STAGES_DRAWN)
    whole = drawn == sim.stages
    end_ns = sim.wave_time_ns if whole else sim.events[drawn - 1].math_start_ns + t
    rows = drawn + (1 if whole else 0)  # the epilogue's row under the stages
    for e in sim.events[:drawn]:
        i, y = e.stage, rows - e.stage + 1
        issue_end = e.issue_start_ns + d
        # (A2): in flight from the end of the issue until the data arrive, lambda later;
        # §3.2 Wait(i), under the row: the MATH warp idles from MATH i-1's end to M(i)
        for start, end, row, part in (
            (e.issue_start_ns, issue_end, y, "issue"),
            (issue_end, e.arrival_ns, y, "in-flight"),
            (
                e.math_start_ns - e.math_wait_ns,
                e.math_start_ns,
                y - BAR_HEIGHT / 2 - WAIT_HEIGHT / 2,
                "math-wait",
            ),
            (e.math_start_ns, e.math_start_ns + t, y, "math"),
        ):
            gid = f"stage-{i}-{part}"
            _bar(ax, axis, start, end, row, gid, work=part not in _WAITS, **ASYNC_STYLE[part])
        # drawn over the bars whatever the order added (lines come after patches)
        ax.add_artist(
            Line2D(
                [e.arrival_ns / 1000],
                [y],
                marker="|",
                markersize=9,
                markeredgewidth=1.6,
                color=ASYNC_COLORS["arrival"],
                linestyle="none",
                gid=f"stage-{i}-arrival",
            )
        )
    if whole:
        epilogue_start_ns = sim.wave_time_ns - us_to_ns(machine.t_epilogue_us)
        _bar(ax, axis, epilogue_start_ns, sim.wave_time_ns, 1.0, "t-epilogue", **STYLE["epilogue"])
        _wave_end(ax, end_ns / 1000, rows + 0.75, "M(S) + T + T_EPILOGUE", sim.wave_time_ns)
    else:
        ax.text(
            1.0,
            0.02,
            f"stages {drawn + 1}–{sim.stages} not drawn; wave = {fmt_us(sim.wave_time_ns / 1000)}",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7.5,
            bbox=LABEL_BOX,
            gid="stages-not-drawn",
        )
    ax.set_xlim(0, end_ns / 1000 * 1.01)
    ax.set_ylim(0.4, rows + 1.3)
    labels = [f"stage {e.stage}" for e in sim.events[:drawn]] + (["epilogue"] if whole else [])
    ax.set_yticks([rows - i for i in range(len(labels))], labels, fontsize=7)
    ax.set_xlabel("time from the wave's start (µs)")
    shown = f"all {sim.stages} stages" if whole else f"stages 1–{drawn} of {sim.stages}"
    return f"one wave, one CTA: {shown} (eq. A1–A3)"


def _async_legend(fig: Any) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=ASYNC_COLORS["issue"], label="copy issue d (copy engine)"),
        Patch(facecolor=ASYNC_COLORS["flight"], label="in flight λ (latency)"),
        Line2D(
            [],
            [],
            marker="|",
            color=ASYNC_COLORS["arrival"],
            linestyle="none",
            markersize=9,
            markeredgewidth=1.6,
            label="data arrive",
        ),
        Patch(facecolor=COLORS["math_wait"], alpha=0.35, label="MATH waits (under its row)"),
        Patch(facecolor=COLORS["math"], label="MATH T"),
        *kernel_legend_tail(COLORS, "full waves", "partial wave"),
    ]
    bottom_legend(fig, handles)


def async_timeline_svg(
    sim: AsyncSimulation, machine: GemmWsMachine, **labels: Unpack[TimelineLabels]
) -> bytes:
    """The async-copy timeline of ``sim`` (one tiling simulated on ``machine`` by
    :func:`perfmodel.pipelines.async_copy.recurrences.simulate_async`) as SVG bytes."""
    dur = sim.durations
    height = 3.2 + 0.22 * (min(sim.stages, MAX_ASYNC_STAGES_DRAWN) + 1)
    # fixed layout in inches from the top and the bottom, whatever the stage count
    return _timeline_figure(
        height,
        (
            (0.095, 1 - 1.55 / height, 0.88, 0.42 / height),
            (0.095, 0.95 / height, 0.88, 1 - 0.95 / height - 2.25 / height),
        ),
        timeline_heading("GeMM-WS async-copy timeline", sim, labels) + "\n"
        f"{sim.ctas_per_sm} CTA(s) per SM sharing it: issue d {fmt_us(dur.issue_ns / 1000)}, "
        f"latency λ {fmt_us(dur.latency_ns / 1000)}, MATH T {fmt_us(dur.math_ns / 1000)}; "
        f"{sim.bound.value}-bound, {sim.stages_in_flight} stage(s) in flight; "
        f"{sim.stages} stages × {sim.waves} waves",
        (
            lambda ax: _draw_async_kernel(ax, sim, machine),
            "kernel: T_INIT, full waves of c CTAs per SM, then the partial wave",
        ),
        lambda ax: _draw_async_wave(ax, sim, machine),
        _async_legend,
    )
