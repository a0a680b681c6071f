"""A tuning table over M: predicted time of the entry the engine takes at each M (nearest
key), each M's own optimum, and the loss band between them; the keys marked.

Plain sequences in (the curve of app/convert/tuning_table.TableCurve), SVG bytes out.
SVG ids: ``entry`` (the table's time), ``optimum``, ``loss-band``, ``key-<M>`` (one marker
per key), ``summary`` (the stated bound's label).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from render._figure import figure, svg_bytes


def tuning_table_svg(
    ms: Sequence[int],
    entry_us: Sequence[float],
    optimum_us: Sequence[float],
    keys: Sequence[int],
    worst_loss: float,
    *,
    title: str = "Tuning table",
) -> bytes:
    """Time against M (log-log) as SVG bytes; ValueError names a bad argument."""
    if not ms:
        raise ValueError("ms: give at least one M")
    if not (len(entry_us) == len(optimum_us) == len(ms)):
        raise ValueError("entry_us and optimum_us: one time per M")
    for name, values in (("entry_us", entry_us), ("optimum_us", optimum_us)):
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"{name}: times must be positive finite numbers")
    at = dict(zip(ms, entry_us, strict=True))
    with figure(8.0, 4.2) as fig:
        axes = fig.subplots()
        axes.fill_between(
            ms,
            optimum_us,
            entry_us,
            step="post",
            color="#F2B880",
            alpha=0.6,
            gid="loss-band",
            label="loss (entry over optimum)",
        )
        for times, color, gid, label in (
            (optimum_us, "#4C72B0", "optimum", "each M's optimum"),
            (entry_us, "#C44E52", "entry", "table entry (nearest key)"),
        ):
            axes.step(ms, times, where="post", color=color, linewidth=1.2, gid=gid, label=label)
        for key in keys:
            if key in at:
                axes.plot(
                    [key],
                    [at[key]],
                    marker="o",
                    markersize=4,
                    color="#222222",
                    linestyle="none",
                    gid=f"key-{key}",
                )
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("M (rows, batch size)")
        axes.set_ylabel("predicted time (µs)")
        axes.set_title(title, loc="left", fontsize=9.5)
        axes.text(
            1.0,
            1.0,
            f"worst loss between keys: {worst_loss * 100:.1f} %",
            transform=axes.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            gid="summary",
        )
        axes.legend(loc="upper left", fontsize=7.5, frameon=False)
        return svg_bytes(fig)
