"""Calibration fit: measured against predicted times, with the identity line and residuals.

Left: one point per measurement (x = measured, y = predicted) and the line y = x. Right: the
relative error of each point, (predicted − measured) / measured, in %. The title states the
mean absolute relative error (eq. (27) of many-bsp-supplementary.txt, averaged).

SVG ids: ``points`` (one marker per measurement), ``identity``, ``residuals`` (one marker
per measurement), ``zero``, ``point-label-<i>`` when labels are given, and ``summary``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from render._figure import figure, svg_bytes

#: most points labelled with their names (beyond this the labels would overlap)
MAX_LABELS = 16
#: times spanning more than this ratio are drawn on log axes
LOG_SPAN = 20.0


def _check(
    measured: Sequence[float], predicted: Sequence[float], labels: Sequence[str] | None
) -> None:
    if len(measured) == 0:
        raise ValueError("measured: give at least one measurement")
    if len(predicted) != len(measured):
        raise ValueError(
            f"predicted: {len(predicted)} values for {len(measured)} measurements; give one "
            "prediction per measurement"
        )
    if labels is not None and len(labels) != len(measured):
        raise ValueError(f"labels: {len(labels)} labels for {len(measured)} measurements")
    for name, values in (("measured", measured), ("predicted", predicted)):
        for i, value in enumerate(values):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}[{i}]: must be a positive finite number, got {value}")


def mean_abs_error_percent(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """Mean of |measured − predicted| / measured × 100 (eq. (27) per point)."""
    errors = [abs(m - p) / m * 100 for m, p in zip(measured, predicted, strict=True)]
    return sum(errors) / len(errors)


def calibration_svg(
    measured: Sequence[float],
    predicted: Sequence[float],
    labels: Sequence[str] | None = None,
    *,
    unit: str = "µs",
    title: str = "Calibration fit",
) -> bytes:
    """Measured vs predicted (same ``unit``) as SVG bytes; ValueError names a bad argument."""
    _check(measured, predicted, labels)
    residuals = [(p - m) / m * 100 for m, p in zip(measured, predicted, strict=True)]
    mape = mean_abs_error_percent(measured, predicted)
    worst = max(abs(r) for r in residuals)
    lo = min(min(measured), min(predicted))
    hi = max(max(measured), max(predicted))
    log = hi / lo > LOG_SPAN
    if log:
        low, high = lo / 1.3, hi * 1.3
    else:
        pad = (hi - lo) * 0.06 or hi * 0.1
        low, high = lo - pad, hi + pad
    with figure(10.0, 4.4) as fig:
        fit, errors = fig.subplots(1, 2, width_ratios=[1.15, 1])
        fig.suptitle(
            f"{title}: {len(measured)} measurement{'s' if len(measured) != 1 else ''}",
            fontsize=9.5,
        )
        fit.plot(
            [low, high],
            [low, high],
            color="#888888",
            linestyle="--",
            linewidth=0.9,
            gid="identity",
            label="predicted = measured",
        )
        fit.plot(
            measured,
            predicted,
            linestyle="none",
            marker="o",
            markersize=5,
            color="#4C72B0",
            gid="points",
            label="measurement",
        )
        if labels is not None and len(labels) <= MAX_LABELS:
            for i, (m, p, text) in enumerate(zip(measured, predicted, labels, strict=True)):
                fit.annotate(
                    text,
                    (m, p),
                    xytext=(4, 4),
                    textcoords="offset points",
                    fontsize=7,
                    gid=f"point-label-{i}",
                )
        if log:
            fit.set_xscale("log")
            fit.set_yscale("log")
            errors.set_xscale("log")
        fit.set_xlim(low, high)
        fit.set_ylim(low, high)
        fit.set_aspect("equal", adjustable="box")
        fit.set_xlabel(f"measured ({unit})")
        fit.set_ylabel(f"predicted ({unit})")
        fit.legend(loc="upper left", fontsize=7.5, frameon=False)
        fit.set_title("measured vs predicted", loc="left", fontsize=8.5)

        errors.axhline(0.0, color="#888888", linewidth=0.9, gid="zero")
        errors.plot(
            measured,
            residuals,
            linestyle="none",
            marker="o",
            markersize=5,
            color="#C44E52",
            gid="residuals",
        )
        limit = max(worst * 1.2, 1.0)
        errors.set_ylim(-limit, limit)
        errors.set_xlabel(f"measured ({unit})")
        errors.set_ylabel("(predicted − measured) / measured (%)")
        errors.set_title("residuals", loc="left", fontsize=8.5)
        errors.text(
            1.0,
            1.0,
            f"mean |error| {mape:.2f} %, worst {worst:.2f} %",
            transform=errors.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            gid="summary",
        )
        return svg_bytes(fig)
