"""The tiling search space: candidate values per dimension and the hardware filter.

The paper searches tile shapes with no capacity limit (§3.2); a real kernel must fit its
circular buffer, buffer_depth x (TM*TK + TK*TN) x element_bytes, in the shared memory a CTA may
use. That constraint is on by default and is counted, per candidate, in the search summary.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from perfmodel.gemm_ws import Tiling
from solver.errors import InvalidSearchSpace

DEFAULT_TILE_VALUES: tuple[int, ...] = (16, 32, 64, 128, 256)
DEFAULT_BUFFER_DEPTHS: tuple[int, ...] = tuple(range(2, 9))
MAX_VALUES_PER_DIMENSION = 4096
#: the presolve evaluates every (TM, TN, TK) triple in Python: ~5 us each, so this bounds it
#: to well under a second whatever the request's time limit
MAX_TILE_TRIPLES = 110_592  # e.g. 48 values per tile dimension
MAX_TILE = 65536
MAX_BUFFER_DEPTH = 64


def values_from_range(field: str, minimum: int, maximum: int, multiple_of: int) -> tuple[int, ...]:
    """Every multiple of ``multiple_of`` in [minimum, maximum]."""
    if multiple_of < 1:
        raise InvalidSearchSpace(f"{field}.multiple_of", "must be at least 1")
    if minimum > maximum:
        raise InvalidSearchSpace(field, f"min ({minimum}) is greater than max ({maximum})")
    first = -(-minimum // multiple_of) * multiple_of
    values = tuple(range(first, maximum + 1, multiple_of))
    if not values:
        raise InvalidSearchSpace(
            field, f"no multiple of {multiple_of} lies between {minimum} and {maximum}"
        )
    return values


def _checked(field: str, values: Sequence[int], upper: int) -> tuple[int, ...]:
    unique = tuple(sorted(set(values)))
    if not unique:
        raise InvalidSearchSpace(field, "the list of candidate values is empty")
    if unique[0] < 1:
        raise InvalidSearchSpace(field, f"values must be at least 1, got {unique[0]}")
    if unique[-1] > upper:
        raise InvalidSearchSpace(field, f"values must be at most {upper}, got {unique[-1]}")
    if len(unique) > MAX_VALUES_PER_DIMENSION:
        raise InvalidSearchSpace(
            field, f"at most {MAX_VALUES_PER_DIMENSION} candidate values, got {len(unique)}"
        )
    return unique


@dataclass(frozen=True, slots=True)
class SearchSpace:
    tile_m: tuple[int, ...] = DEFAULT_TILE_VALUES
    tile_n: tuple[int, ...] = DEFAULT_TILE_VALUES
    tile_k: tuple[int, ...] = DEFAULT_TILE_VALUES
    buffer_depth: tuple[int, ...] = DEFAULT_BUFFER_DEPTHS
    enforce_shared_memory: bool = True
    #: raster group rows (Triton's GROUP_SIZE_M) and split-K slices: searched by the L2-reuse
    #: memory term only (perfmodel/pipelines/l2_reuse.py); 1 each otherwise
    group_m: tuple[int, ...] = (1,)
    split_k: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        for name in ("group_m", "split_k"):
            object.__setattr__(self, name, _checked(name, getattr(self, name), MAX_TILE))
        for name in ("tile_m", "tile_n", "tile_k"):
            object.__setattr__(self, name, _checked(name, getattr(self, name), MAX_TILE))
        object.__setattr__(
            self, "buffer_depth", _checked("buffer_depth", self.buffer_depth, MAX_BUFFER_DEPTH)
        )
        triples = len(self.tile_m) * len(self.tile_n) * len(self.tile_k)
        if triples > MAX_TILE_TRIPLES:
            raise InvalidSearchSpace(
                "search_space",
                f"{triples} (tile_m, tile_n, tile_k) combinations exceed the limit of "
                f"{MAX_TILE_TRIPLES}; use coarser ranges (a larger multiple_of)",
            )

    @property
    def size(self) -> int:
        tiles = len(self.tile_m) * len(self.tile_n) * len(self.tile_k)
        return tiles * len(self.buffer_depth) * len(self.group_m) * len(self.split_k)

    def tilings(self) -> Iterator[Tiling]:
        for tm, tn, tk, depth, group_m, split_k in itertools.product(
            self.tile_m, self.tile_n, self.tile_k, self.buffer_depth, self.group_m, self.split_k
        ):
            yield Tiling(tm, tn, tk, depth, group_m, split_k)


@dataclass(frozen=True, slots=True)
class SearchSummary:
    """How many candidates the space holds and how many each constraint rejected."""

    candidates_considered: int
    feasible: int
    rejected: dict[str, int]


def shared_memory_fits(
    tiling: Tiling, element_bytes: int, shared_memory_per_block_bytes: int | None
) -> bool:
    if shared_memory_per_block_bytes is None:
        return True
    return tiling.shared_memory_bytes(element_bytes) <= shared_memory_per_block_bytes
