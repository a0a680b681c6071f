"""Shortlists that learn: rank the candidates a tuner should time next by the probability that
each is the fastest under the device's posterior, or by the point estimate alone.

The point estimate's optimum (which Z3 proves) is always rank 1; the other ranks go, in
``explore`` mode, to the candidates most often fastest across posterior draws, so that the true
best is likely among the shortlist even while the figures are uncertain; with a confident
posterior every draw agrees and explore equals exploit. Pure numpy on a matrix of predicted
times: the scorer fills it (one row per draw, one column per candidate).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from perfmodel.belief import interval_of


class ShortlistMode(StrEnum):
    EXPLORE = "explore"
    EXPLOIT = "exploit"


@dataclass(frozen=True, slots=True)
class Shortlist:
    """``ranked`` holds candidate (column) indices, best first; per candidate column:
    ``probability_best`` (share of draws in which it is fastest; ties go to the better point
    rank) and the 10-90 % interval of its predicted time over the draws (NaN for a column
    not ranked: quantiles cost a sort per column, and only the ranked ones are reported)."""

    ranked: tuple[int, ...]
    probability_best: NDArray[np.float64]
    interval_low: NDArray[np.float64]
    interval_high: NDArray[np.float64]


def shortlist(
    draw_times: NDArray[np.int64] | NDArray[np.float64],
    point_order: NDArray[np.intp],
    top_k: int,
    mode: ShortlistMode = ShortlistMode.EXPLORE,
    point_times: NDArray[np.int64] | NDArray[np.float64] | None = None,
) -> Shortlist:
    """Choose ``top_k`` of the columns of ``draw_times`` (shape (draws, candidates)).

    ``point_order`` lists every column from best to worst under the point estimate (the
    solver's lexicographic order); its first entry is rank 1 in both modes. The intervals
    contain ``point_times`` (each column's point prediction) when given.
    """
    times = np.asarray(draw_times)
    draws, candidates = times.shape
    if point_order.size != candidates or candidates == 0:
        raise ValueError("point_order must rank every candidate column, and there must be one")
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    rank_of = np.empty(candidates, dtype=np.intp)
    rank_of[point_order] = np.arange(candidates)
    # fastest per draw, ties to the better point rank: sort columns by point rank first
    by_rank = times[:, point_order]
    winners = point_order[np.argmin(by_rank, axis=1)]
    probability = np.bincount(winners, minlength=candidates) / max(draws, 1)
    first = int(point_order[0])
    if mode is ShortlistMode.EXPLOIT:
        ranked = point_order[:top_k]
    else:
        # most probable first; equal probabilities (zero included) in point order
        order = np.lexsort((rank_of, -probability))
        rest = order[order != first][: top_k - 1]
        ranked = np.concatenate([np.array([first], dtype=np.intp), rest.astype(np.intp)])
    low, high = np.full(candidates, np.nan), np.full(candidates, np.nan)
    point = None if point_times is None else np.asarray(point_times)[ranked]
    low[ranked], high[ranked] = interval_of(times[:, ranked], point)
    return Shortlist(
        ranked=tuple(int(c) for c in ranked),
        probability_best=probability.astype(np.float64),
        interval_low=low,
        interval_high=high,
    )
