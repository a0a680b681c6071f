"""GeMM-WS async-copy timeline of one tiling (docs/model-notes.md, "GeMM-WS async-copy").

Two panels. The top one is the whole kernel: T_INIT, then the full waves of c CTAs sharing
each SM and the last, partial wave of r CTAs (async-copy 1), with the labelled total. The
bottom one is one full wave of one CTA, one row per stage (eq. A1-A3): the copy *issue*
(d, on the copy engine shared by the SM's c CTAs), the copy *in flight* (lambda, from the end
of the issue to the data in shared memory), the *arrival*, the MATH warp's wait and its MATH
(T). Stages whose in-flight spans overlap in time are loads in flight together: at most
``buffer_depth`` of them. Pipelines over :data:`MAX_ASYNC_STAGES_DRAWN` stages show their
first stages only, and say so.

Every drawn element has an SVG id: ``stage-<i>-issue``, ``stage-<i>-in-flight``,
``stage-<i>-arrival``, ``stage-<i>-math-wait``, ``stage-<i>-math``, ``t-epilogue``,
``wave-end``, ``stages-not-drawn``; in the kernel panel ``t-init``, ``waves-full``,
``wave-partial`` and ``total`` (the text ``total = ... = <overall time> µs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfmodel.gemm_ws import GemmWsMachine, us_to_ns
from perfmodel.pipelines.async_copy.recurrences import AsyncSimulation
from render._figure import (
    bottom_legend,
    figure,
    fmt_us,
    kernel_legend_tail,
    svg_bytes,
    timeline_heading,
)
from render.timeline import COLORS, LABEL_BOX

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: pipelines up to this long are drawn whole; longer ones show this many first stages
MAX_ASYNC_STAGES_DRAWN = 16
BAR_HEIGHT = 0.6
#: the in-flight span is drawn thinner than the work bars: it is time, not work
FLIGHT_HEIGHT = 0.22
#: the MATH wait is a thin band under its stage's row
WAIT_HEIGHT = 0.12
ASYNC_COLORS = {
    "issue": COLORS["load_a"],
    "flight": COLORS["load_b"],
    "arrival": "#1B3A5C",
}


def _rect(
    ax: Axes, x0_us: float, x1_us: float, y: float, height: float, gid: str, **style: Any
) -> None:
    from matplotlib.patches import Rectangle

    ax.add_artist(Rectangle((x0_us, y - height / 2), x1_us - x0_us, height, gid=gid, **style))


def _partial_wave_ns(sim: AsyncSimulation, machine: GemmWsMachine) -> int:
    """The last, partial wave's time: what the overall time holds beyond T_INIT and the full
    waves (0 when there is none)."""
    return sim.overall_time_ns - us_to_ns(machine.t_init_us) - sim.full_waves * sim.wave_time_ns


def _draw_kernel(ax: Axes, sim: AsyncSimulation, machine: GemmWsMachine) -> None:
    init_ns = us_to_ns(machine.t_init_us)
    full_ns = sim.full_waves * sim.wave_time_ns
    partial_ns = _partial_wave_ns(sim, machine)
    end_us = sim.overall_time_ns / 1000
    c = sim.ctas_per_sm

    def box(start_ns: int, stop_ns: int, gid: str, color: str, text: str) -> None:
        x0, x1 = start_ns / 1000, stop_ns / 1000
        _rect(ax, x0, x1, 0.0, 0.6, gid, facecolor=color, edgecolor="white", linewidth=0.8)
        if (x1 - x0) >= 0.08 * end_us:
            ax.text((x0 + x1) / 2, 0.0, text, ha="center", va="center", fontsize=7.5)

    box(0, init_ns, "t-init", COLORS["init"], "T_INIT")
    if sim.full_waves:
        box(
            init_ns,
            init_ns + full_ns,
            "waves-full",
            COLORS["wave"],
            f"{sim.full_waves} wave(s) × {fmt_us(sim.wave_time_ns / 1000)}, {c} CTA(s) per SM",
        )
    if sim.partial_wave_ctas:
        box(
            init_ns + full_ns,
            init_ns + full_ns + partial_ns,
            "wave-partial",
            COLORS["slot"],
            f"last wave: {sim.partial_wave_ctas} CTA(s)",
        )
    ax.set_xlim(0, end_us * 1.01)
    ax.set_ylim(-0.5, 0.9)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("time from the kernel's launch (µs)")
    partial = f" + {fmt_us(partial_ns / 1000)}" if sim.partial_wave_ctas else ""
    ax.text(
        1.0,
        0.98,
        f"total = {sim.full_waves} × {fmt_us(sim.wave_time_ns / 1000)}{partial} + "
        f"{fmt_us(init_ns / 1000)} = {fmt_us(sim.overall_time_ns / 1000)}",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8.5,
        fontweight="bold",
        bbox=LABEL_BOX,
        gid="total",
    )


def _draw_wave(ax: Axes, sim: AsyncSimulation, machine: GemmWsMachine) -> str:
    """The wave panel, one row per drawn stage (stage 1 on top); returns its title."""
    from matplotlib.lines import Line2D

    d, lam, t = sim.durations.issue_ns, sim.durations.latency_ns, sim.durations.math_ns
    drawn = min(sim.stages, MAX_ASYNC_STAGES_DRAWN)
    whole = drawn == sim.stages
    epilogue_ns = us_to_ns(machine.t_epilogue_us)
    last_math_end = sim.events[drawn - 1].math_start_ns + t
    end_ns = sim.wave_time_ns if whole else last_math_end
    rows = drawn + (1 if whole else 0)  # the epilogue's row under the stages
    for e in sim.events[:drawn]:
        i, y = e.stage, rows - e.stage + 1
        issue_end = e.issue_start_ns + d
        _rect(
            ax,
            e.issue_start_ns / 1000,
            issue_end / 1000,
            y,
            BAR_HEIGHT,
            f"stage-{i}-issue",
            facecolor=ASYNC_COLORS["issue"],
            edgecolor="white",
            linewidth=0.4,
        )
        # (A2): in flight from the end of the issue until the data arrive, lambda later
        _rect(
            ax,
            issue_end / 1000,
            e.arrival_ns / 1000,
            y,
            FLIGHT_HEIGHT,
            f"stage-{i}-in-flight",
            facecolor=ASYNC_COLORS["flight"],
            edgecolor="none",
        )
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
        if e.math_wait_ns > 0:
            # §3.2 Wait(i), under the row: the MATH warp idles from MATH i-1's end to M(i)
            _rect(
                ax,
                (e.math_start_ns - e.math_wait_ns) / 1000,
                e.math_start_ns / 1000,
                y - BAR_HEIGHT / 2 - WAIT_HEIGHT / 2,
                WAIT_HEIGHT,
                f"stage-{i}-math-wait",
                facecolor=COLORS["math_wait"],
                alpha=0.35,
                edgecolor="none",
            )
        _rect(
            ax,
            e.math_start_ns / 1000,
            (e.math_start_ns + t) / 1000,
            y,
            BAR_HEIGHT,
            f"stage-{i}-math",
            facecolor=COLORS["math"],
            edgecolor="white",
            linewidth=0.4,
        )
    if whole:
        _rect(
            ax,
            (sim.wave_time_ns - epilogue_ns) / 1000,
            sim.wave_time_ns / 1000,
            1.0,
            BAR_HEIGHT,
            "t-epilogue",
            facecolor=COLORS["epilogue"],
            edgecolor="white",
            linewidth=0.4,
        )
        ax.axvline(
            sim.wave_time_ns / 1000, color="black", linewidth=0.8, linestyle="--", gid="wave-end"
        )
        ax.text(
            sim.wave_time_ns / 1000,
            rows + 0.75,
            f"wave = M(S) + T + T_EPILOGUE = {fmt_us(sim.wave_time_ns / 1000)}",
            ha="right",
            va="bottom",
            fontsize=7.5,
            bbox=LABEL_BOX,
            gid="wave-time",
        )
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
    del lam  # drawn through the events: arrival - issue end = lambda
    shown = f"all {sim.stages} stages" if whole else f"stages 1–{drawn} of {sim.stages}"
    return f"one wave, one CTA: {shown} (eq. A1–A3)"


def _legend(fig: Any) -> None:
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
    sim: AsyncSimulation,
    machine: GemmWsMachine,
    *,
    device: str = "",
    dtype: str = "",
    rank: int | None = None,
) -> bytes:
    """The async-copy timeline of ``sim`` (one tiling simulated on ``machine`` by
    :func:`perfmodel.pipelines.async_copy.recurrences.simulate_async`) as SVG bytes.

    ``device``, ``dtype`` and ``rank`` only label the picture.
    """
    dur = sim.durations
    drawn = min(sim.stages, MAX_ASYNC_STAGES_DRAWN)
    height = 3.2 + 0.22 * (drawn + 1)
    with figure(11.0, height, layout=None) as fig:
        # fixed layout in inches from the top and the bottom, whatever the stage count
        def frac(inches: float) -> float:
            return inches / height

        top = fig.add_axes((0.095, 1 - frac(1.55), 0.88, frac(0.42)))
        bottom = fig.add_axes((0.095, frac(0.95), 0.88, 1 - frac(0.95) - frac(2.25)))
        fig.suptitle(
            timeline_heading("GeMM-WS async-copy timeline", sim, device, dtype, rank) + "\n"
            f"{sim.ctas_per_sm} CTA(s) per SM sharing it: issue d {fmt_us(dur.issue_ns / 1000)}, "
            f"latency λ {fmt_us(dur.latency_ns / 1000)}, MATH T {fmt_us(dur.math_ns / 1000)}; "
            f"{sim.bound.value}-bound, {sim.stages_in_flight} stage(s) in flight; "
            f"{sim.stages} stages × {sim.waves} waves",
            fontsize=9.5,
        )
        _draw_kernel(top, sim, machine)
        top.set_title(
            "kernel: T_INIT, full waves of c CTAs per SM, then the partial wave",
            loc="left",
            fontsize=8.5,
        )
        bottom.set_title(_draw_wave(bottom, sim, machine), loc="left", fontsize=8.5)
        _legend(fig)
        return svg_bytes(fig)
