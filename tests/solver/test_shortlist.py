"""Shortlists that learn: properties of the explore / exploit selection, and the
probability of being fastest against a plain count over the draws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.shortlist import ShortlistMode, shortlist


@st.composite
def _cases(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    draws = draw(st.integers(1, 12))
    candidates = draw(st.integers(1, 9))
    values = draw(
        st.lists(st.integers(1, 6), min_size=draws * candidates, max_size=draws * candidates)
    )  # few distinct values: plenty of ties
    times = np.array(values, dtype=np.int64).reshape(draws, candidates)
    order = np.array(draw(st.permutations(range(candidates))), dtype=np.intp)
    return times, order, draw(st.integers(1, 10))


def _count_wins(times: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Per draw, the fastest column; a tie goes to the one ranked earlier in ``order``."""
    wins = np.zeros(times.shape[1])
    for row in times:
        best = min(range(times.shape[1]), key=lambda c: (row[c], list(order).index(c)))
        wins[best] += 1
    return wins / times.shape[0]


@given(_cases())
@settings(max_examples=300, deadline=None)
def test_probability_best_is_the_share_of_draws_won(case: tuple) -> None:
    times, order, top_k = case
    result = shortlist(times, order, top_k)
    assert result.probability_best == pytest.approx(_count_wins(times, order))
    assert result.probability_best.sum() == pytest.approx(1.0)
    ranked = list(result.ranked)
    assert np.all(result.interval_low[ranked] <= result.interval_high[ranked])
    # the intervals are the draws' 10-90 % quantiles of the ranked columns, and only theirs
    low, high = np.quantile(times[:, ranked], [0.1, 0.9], axis=0)
    assert result.interval_low[ranked] == pytest.approx(low)
    assert result.interval_high[ranked] == pytest.approx(high)
    others = [c for c in range(times.shape[1]) if c not in ranked]
    assert np.all(np.isnan(result.interval_low[others]))


@given(_cases())
@settings(max_examples=300, deadline=None)
def test_rank_one_is_the_point_optimum_and_explore_takes_the_likeliest(case: tuple) -> None:
    times, order, top_k = case
    explore = shortlist(times, order, top_k, ShortlistMode.EXPLORE)
    exploit = shortlist(times, order, top_k, ShortlistMode.EXPLOIT)
    assert explore.ranked[0] == exploit.ranked[0] == order[0]
    assert len(explore.ranked) == len(exploit.ranked) == min(top_k, times.shape[1])
    assert exploit.ranked == tuple(int(c) for c in order[:top_k])
    assert len(set(explore.ranked)) == len(explore.ranked)
    p = explore.probability_best
    chosen = explore.ranked[1:]
    left_out = [c for c in range(times.shape[1]) if c not in explore.ranked]
    if chosen and left_out:  # nothing left out is likelier than what was taken
        assert max(p[c] for c in left_out) <= min(p[c] for c in chosen)


@given(_cases())
@settings(max_examples=200, deadline=None)
def test_a_confident_posterior_makes_explore_equal_exploit(case: tuple) -> None:
    """Every draw the same: one candidate wins them all, and the rest follow the point order
    (the point estimate ranks candidates as any draw does when the draws agree)."""
    times, _, top_k = case
    row = times[0]
    same = np.tile(row, (times.shape[0], 1))
    order = np.array(sorted(range(row.size), key=lambda c: (row[c], c)), dtype=np.intp)
    explore = shortlist(same, order, top_k, ShortlistMode.EXPLORE)
    exploit = shortlist(same, order, top_k, ShortlistMode.EXPLOIT)
    assert explore.ranked == exploit.ranked


def test_bad_arguments() -> None:
    times = np.ones((2, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="point_order"):
        shortlist(times, np.array([0, 1], dtype=np.intp), 1)
    with pytest.raises(ValueError, match="top_k"):
        shortlist(times, np.array([0, 1, 2], dtype=np.intp), 0)
