"""Matplotlib behind one door: lazy import, fixed settings, deterministic SVG bytes.

Only :class:`matplotlib.figure.Figure` and the SVG canvas are used: no pyplot, no GUI
backend, no global figure registry. matplotlib (and numpy under it) take ~0.5 s to import,
so nothing here is imported before the first picture is drawn. Drawing holds one lock:
matplotlib's settings are process-global, so a picture is drawn by one thread at a time.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: fixed settings of every picture: text stays text (<text>, searchable and small), ids are
#: derived from a constant salt, so the same answer always gives the same bytes
RC: dict[str, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "kperf",
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "path.simplify": True,
}

#: metadata written into the SVG: no date, so the bytes do not change from run to run
METADATA = {"Date": None, "Creator": "kperf"}

_LOCK = threading.Lock()


@contextmanager
def figure(
    width_in: float, height_in: float, layout: Literal["constrained"] | None = "constrained"
) -> Iterator[Figure]:
    """A fresh figure under :data:`RC`, for one picture (yields while holding the lock)."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with _LOCK, matplotlib.rc_context():
        # restored when the context ends; typed Any: the stubs' key type differs by version
        params: Any = matplotlib.rcParams
        params.update(RC)
        fig = Figure(figsize=(width_in, height_in), layout=layout)
        FigureCanvasSVG(fig)
        yield fig


def svg_bytes(fig: Figure) -> bytes:
    """The figure as SVG, UTF-8, deterministic (call inside :func:`figure`)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", metadata=METADATA)
    return buffer.getvalue()


def fmt_us(value_us: float) -> str:
    """A time in µs with nanosecond resolution, as every picture labels it."""
    return f"{value_us:,.3f} µs"


def bottom_legend(fig: Any, handles: list[Any]) -> None:
    """The timelines' legend: ``handles`` in five columns along the figure's bottom edge."""
    fig.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncols=5,
        fontsize=7.5,
        frameon=False,
    )


class TimelineLabels(TypedDict, total=False):
    """What only labels a timeline picture: the device, the dtype, the candidate's rank."""

    device: str
    dtype: str
    rank: int | None


def timeline_heading(model: str, sim: Any, labels: TimelineLabels) -> str:
    """The first title line of a pipeline timeline: the model, the GEMM, the device, the tiling
    and the rank."""
    shape, t = sim.shape, sim.tiling
    device, dtype, rank = labels.get("device", ""), labels.get("dtype", ""), labels.get("rank")
    where = f" on {device}" if device else ""
    kind = f" ({dtype})" if dtype else ""
    ranked = f", rank {rank}" if rank is not None else ""
    return (
        f"{model}: {shape.m}×{shape.n}×{shape.k}{kind}{where} — tiling "
        f"{t.tile_m}×{t.tile_n}×{t.tile_k}, buffer depth {t.buffer_depth}{ranked}"
    )


def kernel_legend_tail(colors: dict[str, str], waves: str, partial: str | None) -> list[Any]:
    """The legend entries every timeline's kernel panel shares: T_EPILOGUE, the waves and
    T_INIT (``partial``: the label of the last, partial wave, if drawn)."""
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=colors["epilogue"], label="T_EPILOGUE"),
        Patch(facecolor=colors["wave"], label=waves),
    ]
    if partial is not None:
        handles.append(Patch(facecolor=colors["slot"], label=partial))
    return [*handles, Patch(facecolor=colors["init"], label="T_INIT")]
