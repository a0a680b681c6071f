"""Many-BSP breakdown of one prediction (many-bsp-supplementary.txt §1).

Top: one stacked bar per level-1 superstep, in program order: comp, comm and ovh cycles of
one block, each times the superstep's iterations (the addends of eq. (10)-(12)). Bottom: the
kernel total as the terms of eq. (24) or (25), which add up to the labelled total.

SVG ids: ``superstep-<k>-comp``, ``superstep-<k>-comm``, ``superstep-<k>-ovh`` and
``superstep-<k>-label`` (k = 1.. in program order), ``term-launch``, ``term-blocks``,
``term-rounds`` (eq. (25) only), ``term-tail`` and ``total`` (the text
``kernel_exec_cycle ... = <predicted_cycles> cycles``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perfmodel.manybsp.kernel import KernelTerms
from render._figure import figure, fmt_us, svg_bytes

COLORS = {"comp": "#4C72B0", "comm": "#DD8452", "ovh": "#8172B3"}
TERM_COLORS = {
    "launch": "#937860",
    "blocks": "#4C72B0",
    "rounds": "#C44E52",
    "tail": "#DD8452",
}
PARTS = (
    ("comp", "comp (eq. 10)"),
    ("comm", "comm, before overlap (eq. 12)"),
    ("ovh", "ovh: barriers (eq. 11)"),
)


def fmt_cycles(value: float) -> str:
    return f"{value:,.1f}"


def _superstep_rows(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    rows = []
    for step in steps:
        n = float(step["iterations"])
        rows.append({part: float(step[f"{part}_cycles"]) * n for part, _ in PARTS})
    return rows


def _term_list(terms: KernelTerms, answer: Mapping[str, Any]) -> list[tuple[str, str, float]]:
    """(id, label, cycles) of each addend, in the equation's order."""
    listed = [
        ("launch", "block_lnch_ovh", terms.block_launch_overhead),
        (
            "blocks",
            f"n_b / n_sm × comp / min(μ, (1+ρ)/2)   (n_b = {answer['n_b']}, ρ = {answer['rho']})",
            terms.blocks,
        ),
    ]
    if terms.equation == "25":
        listed.append(
            (
                "rounds",
                f"(K−1)(τ−ρ)/(τ−1) × novlp   (K = {float(answer['K']):.3g}, τ = {answer['tau']})",
                terms.rounds,
            )
        )
    listed.append(("tail", "novlp / 2", terms.tail))
    return listed


def breakdown_svg(answer: Mapping[str, Any], terms: KernelTerms) -> bytes:
    """The breakdown of a POST /predict-kernel answer (its JSON as a dict) as SVG bytes.

    ``terms`` are the addends of eq. (24)/(25) for that answer
    (:func:`perfmodel.manybsp.kernel.kernel_terms`); the bars draw them, the label states the
    answer's ``predicted_cycles`` (they agree to the last bit: the model sums the same terms).
    """
    steps = list(answer["level1_supersteps"])
    rows = _superstep_rows(steps)
    count = len(steps)
    height = 2.6 + 0.28 * max(count, 3)
    with figure(10.0, height) as fig:
        top, bottom = fig.subplots(2, 1, height_ratios=[max(count, 3) * 0.28 + 0.6, 1.3])
        fig.suptitle(
            f"Many-BSP breakdown: kernel {answer['kernel']} on {answer['device']} — "
            f"{count} level-1 superstep{'s' if count != 1 else ''}, eq. ({terms.equation})",
            fontsize=9.5,
        )
        ys = list(range(count))
        grand = sum(sum(r.values()) for r in rows) or 1.0
        widest = max((sum(r.values()) for r in rows), default=0.0)
        for k, row in enumerate(rows, start=1):
            left = 0.0
            y = ys[k - 1]
            for part, _ in PARTS:
                top.barh(
                    y,
                    row[part],
                    left=left,
                    height=0.6,
                    color=COLORS[part],
                    gid=f"superstep-{k}-{part}",
                )
                left += row[part]
            top.text(
                left + widest * 0.01,
                y,
                f"{fmt_cycles(left)} ({100 * left / grand:.1f} %)",
                va="center",
                fontsize=7.5,
            )
        labels = [
            f"#{k}: lines {s['start_line']}–{s['end_line']} × {s['iterations']}"
            for k, s in enumerate(steps, start=1)
        ]
        top.set_yticks(ys, labels)
        for k, tick in enumerate(top.get_yticklabels(), start=1):
            tick.set_gid(f"superstep-{k}-label")
        top.invert_yaxis()
        top.set_xlim(0, widest * 1.18 if widest > 0 else 1.0)
        top.set_xlabel("cycles per block (× iterations)")
        top.set_title("level-1 supersteps in program order", loc="left", fontsize=8.5)
        top.legend(
            handles=[_patch(COLORS[p], label) for p, label in PARTS],
            loc="lower right",
            fontsize=7.5,
            frameon=False,
        )

        listed = _term_list(terms, answer)
        left = 0.0
        for key, _, value in listed:
            bottom.barh(0, value, left=left, height=0.5, color=TERM_COLORS[key], gid=f"term-{key}")
            left += value
        total = terms.total
        bottom.set_xlim(0, max(total, 1.0) * 1.02)
        bottom.set_ylim(-0.5, 0.9)
        bottom.set_yticks([])
        bottom.spines["left"].set_visible(False)
        bottom.set_xlabel("cycles")
        bottom.legend(
            handles=[
                _patch(TERM_COLORS[key], f"{label} = {fmt_cycles(value)}")
                for key, label, value in listed
            ],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.55),
            ncols=2,
            fontsize=7.5,
            frameon=False,
        )
        time_us = answer.get("predicted_time_us")
        clock = answer.get("clock_mhz")
        at = ""
        if time_us is not None and clock is not None:
            at = f" = {fmt_us(float(time_us))} at {float(clock):g} MHz"
        bottom.text(
            1.0,
            0.98,
            f"kernel_exec_cycle, eq. ({terms.equation}) = "
            f"{fmt_cycles(float(answer['predicted_cycles']))} cycles{at}",
            transform=bottom.transAxes,
            ha="right",
            va="top",
            fontsize=8.5,
            fontweight="bold",
            gid="total",
        )
        bottom.set_title(
            f"kernel total, term by term (per block: comp = {fmt_cycles(float(answer['comp']))}, "
            f"novlp = {fmt_cycles(float(answer['novlp']))} cycles; μ = {answer['mu']:g})",
            loc="left",
            fontsize=8.5,
        )
        return svg_bytes(fig)


def _patch(color: str, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=color, label=label)
