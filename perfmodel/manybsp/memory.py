"""What one warp's memory instruction touches: 128-byte lines, 32-byte sectors, shared-memory
bank conflicts and constant-cache serialization, from the address of every lane.

The address is the launch-specific linear form of :mod:`perfmodel.ptx.linear`, evaluated at
the 32 lanes of the block's first full warp (lane ``l`` is the thread of linear index ``l``:
``tid.x = l mod ntid.x``, ``tid.y = (l div ntid.x) mod ntid.y``; CUDA C++ Programming Guide,
"Thread Hierarchy"). So 2-D blocks narrower than a warp are counted as the rows they are.

* Global memory: a warp's request is split into 128-byte lines (the n_ma of eq. (12), one
  latency each, as before) and, on Volta and later, 32-byte sectors: the unit of L1/L2/DRAM
  traffic (CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory").
* Shared memory: 32 banks of 4 bytes; lanes reading different words of one bank are
  serialized, lanes reading the same word are served by one broadcast (Programming Guide,
  "Shared Memory" for compute capability 5.x and later). n_ma is that degree.
* Constant memory: one address per cycle; a warp reading k distinct addresses is served in k
  passes (Programming Guide, "Constant Memory"). n_ma is k.

A part of an address that the evaluation cannot follow (data loaded from memory, a float
converted to an index) is taken as the same for every lane of the warp; the front end says so
in a warning naming the instruction.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from perfmodel.ptx.linear import LinearForm

LINE_BYTES = 128
BANKS = 32
BANK_BYTES = 4


@dataclass(frozen=True, slots=True)
class WarpAccess:
    lines: int  #: distinct 128-byte lines (or segments of the profile's size)
    sectors: int  #: distinct 32-byte sectors
    bank_degree: int  #: shared memory: most distinct words in one bank (1: conflict free)
    distinct: int  #: distinct addresses (constant-cache passes)
    lanes: int  #: active lanes of the warp
    assumed_uniform_part: bool  #: an unknown lane-dependent part was taken as equal
    thread_dependent: bool  #: the address differs between the block's threads


@functools.lru_cache(maxsize=64)
def lane_points(block: tuple[int, int, int], warp_size: int) -> tuple[tuple[int, int, int], ...]:
    """(tid.x, tid.y, tid.z) of the lanes of the block's first warp."""
    bx, by, bz = block
    n = min(warp_size, bx * by * bz)
    return tuple((t % bx, (t // bx) % by, t // (bx * by)) for t in range(n))


def warp_access(
    form: LinearForm,
    width_bytes: int,
    block: tuple[int, int, int],
    warp_size: int,
    segment_bytes: int,
    sector_bytes: int,
) -> WarpAccess:
    """Lines, sectors, bank degree and distinct addresses of one warp's access."""
    cx, cy, cz = (form.coefs.get(s, 0) for s in ("tid.x", "tid.y", "tid.z"))
    tid_symbols = {"tid.x", "tid.y", "tid.z"}
    counts = _counts(
        cx,
        cy,
        cz,
        form.const % LINE_BYTES,
        width_bytes,
        block,
        warp_size,
        segment_bytes,
        sector_bytes,
    )
    return WarpAccess(
        *counts,
        assumed_uniform_part=form.unknown and bool(form.opaque & tid_symbols),
        thread_dependent=bool(form.symbols & tid_symbols),
    )


@functools.lru_cache(maxsize=4096)
def _counts(
    cx: int,
    cy: int,
    cz: int,
    const: int,
    width: int,
    block: tuple[int, int, int],
    warp_size: int,
    segment: int,
    sector: int,
) -> tuple[int, int, int, int, int]:
    """(lines, sectors, bank degree, distinct addresses, lanes); ``const`` modulo the line
    size is all of the base that matters (every count is modulo a line)."""
    addrs = [const + cx * x + cy * y + cz * z for x, y, z in lane_points(block, warp_size)]
    lines: set[int] = set()
    sectors: set[int] = set()
    step = min(width, sector)
    for a in addrs:
        for b in (*range(a, a + width, step), a + width - 1):
            sectors.add(b // sector)
            lines.add(b // segment)
    words_in_bank: dict[int, set[int]] = {}
    for a in addrs:
        for word in range(a // BANK_BYTES, (a + width - 1) // BANK_BYTES + 1):
            words_in_bank.setdefault(word % BANKS, set()).add(word)
    degree = max((len(v) for v in words_in_bank.values()), default=1)
    # wide accesses (64/128-bit) are split into half/quarter-warp phases by the hardware;
    # a phase covers 128 bytes, so the conflict-free minimum is width/4 words per bank
    phases = max(1, width * len(addrs) // (BANKS * BANK_BYTES))
    degree = max(1, -(-degree // phases))
    return max(1, len(lines)), max(1, len(sectors)), degree, max(1, len(set(addrs))), len(addrs)
