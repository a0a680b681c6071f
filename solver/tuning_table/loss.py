"""How much the engine's nearest-key lookup may lose for any M between the table's keys.

The engines read a table as ``configs[min(keys, key=lambda x: abs(x - M))]`` over the keys in
file order (ascending here), so a tie between two keys goes to the smaller one. Over the range
[first key, last key] the M values fall into pieces: a new piece starts at every multiple of
``step`` plus one and wherever the nearest key changes. Within a piece the configuration
taken is fixed, and every configuration's predicted time is non-decreasing in M (more rows
never make a GEMM faster: the tile counts, hence the waves, only grow), so for M in
[first, last] of a piece

    t(chosen, M) / t*(M) - 1  <=  t(chosen, last) / t*(first) - 1,

t* the fastest configuration at that M. That right-hand side, taken over every piece, is the
stated worst loss: a bound for every integer M in the range, not only the sampled ones. When
the model's times change only where some tile count ceil(M / tile_m) does (tile_m multiples of
``step``), they are constant on each piece and the bound is the exact worst loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def nearest_key_index(keys: Sequence[int], m: int) -> int:
    """The engines' lookup: the key nearest to ``m``, the first (smaller) one on a tie."""
    return min(range(len(keys)), key=lambda i: abs(keys[i] - m))


@dataclass(frozen=True, slots=True)
class Piece:
    """M values ``first_m``..``last_m`` (inclusive), all served by key ``key_index``."""

    first_m: int
    last_m: int
    key_index: int


def pieces(keys: Sequence[int], step: int) -> list[Piece]:
    """The range [keys[0], keys[-1]] cut at every multiple of ``step`` (a piece starts after
    it) and where the nearest key changes (``keys`` ascending, distinct)."""
    if step < 1:
        raise ValueError("step must be at least 1")
    if list(keys) != sorted(set(keys)) or not keys:
        raise ValueError("keys must be ascending and distinct")
    starts = {keys[0]}
    starts.update(range(-(-keys[0] // step) * step + 1, keys[-1] + 1, step))
    for left, right in zip(keys, keys[1:], strict=False):
        # M <= (left + right) / 2 goes to left (ties to the smaller key)
        starts.add((left + right) // 2 + 1)
    ordered = sorted(starts)
    ends = [s - 1 for s in ordered[1:]] + [keys[-1]]
    return [
        Piece(first, last, nearest_key_index(keys, first))
        for first, last in zip(ordered, ends, strict=True)
    ]


def sample_points(parts: Sequence[Piece]) -> list[int]:
    """The M values whose predicted times the bound needs: both ends of every piece."""
    return sorted({p.first_m for p in parts} | {p.last_m for p in parts})


@dataclass(frozen=True, slots=True)
class LossBound:
    """The worst loss over the range and where; per piece its bound (same order)."""

    worst_loss: float
    worst_piece: Piece
    piece_losses: tuple[float, ...]


def worst_loss(
    parts: Sequence[Piece], chosen: Sequence[int], times_at: Mapping[int, Sequence[int]]
) -> LossBound:
    """The bound above: ``chosen[i]`` is key i's configuration index; ``times_at[M][c]`` the
    predicted ns of configuration c at M for every M of :func:`sample_points`."""
    losses = []
    for part in parts:
        c = chosen[part.key_index]
        losses.append(times_at[part.last_m][c] / min(times_at[part.first_m]) - 1.0)
    worst = max(range(len(parts)), key=lambda i: losses[i])
    return LossBound(losses[worst], parts[worst], tuple(losses))
