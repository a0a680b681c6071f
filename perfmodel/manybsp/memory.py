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


def lane_points(block: tuple[int, int, int], warp_size: int) -> list[dict[str, int]]:
    """(tid.x, tid.y, tid.z) of the lanes of the block's first warp."""
    bx, by, bz = block
    n = min(warp_size, bx * by * bz)
    return [
        {"tid.x": t % bx, "tid.y": (t // bx) % by, "tid.z": t // (bx * by)} for t in range(n)
    ]


def warp_access(
    form: LinearForm,
    width_bytes: int,
    block: tuple[int, int, int],
    warp_size: int,
    segment_bytes: int,
    sector_bytes: int,
) -> WarpAccess:
    """Lines, sectors, bank degree and distinct addresses of one warp's access."""
    points = lane_points(block, warp_size)
    addrs = [form.at(p) for p in points]
    lines: set[int] = set()
    sectors: set[int] = set()
    for a in addrs:
        for b in range(a, a + width_bytes, min(width_bytes, sector_bytes)):
            sectors.add(b // sector_bytes)
            lines.add(b // segment_bytes)
        last = a + width_bytes - 1
        sectors.add(last // sector_bytes)
        lines.add(last // segment_bytes)
    words_in_bank: dict[int, set[int]] = {}
    for a in addrs:
        for word in range(a // BANK_BYTES, (a + width_bytes - 1) // BANK_BYTES + 1):
            words_in_bank.setdefault(word % BANKS, set()).add(word)
    degree = max((len(v) for v in words_in_bank.values()), default=1)
    # wide accesses (64/128-bit) are split into half/quarter-warp phases by the hardware;
    # a phase covers 128 bytes, so the conflict-free minimum is width/4 words per bank
    phases = max(1, width_bytes * len(addrs) // (BANKS * BANK_BYTES))
    degree = max(1, -(-degree // phases))
    tid_symbols = {"tid.x", "tid.y", "tid.z"}
    lane_unknown = form.unknown and bool(form.opaque & tid_symbols)
    return WarpAccess(
        lines=max(1, len(lines)),
        sectors=max(1, len(sectors)),
        bank_degree=degree,
        distinct=max(1, len(set(addrs))),
        lanes=len(addrs),
        assumed_uniform_part=lane_unknown,
        thread_dependent=bool(form.symbols & tid_symbols),
    )
