"""Every .entry of the checked-in nvcc fixtures, with a launch its source allows.

Used by the API test (200 for each) and the grid-growth property of the predictor. The block
is the kernel's required or maximal shape (.reqntid / .maxntid of its header) or 256 threads.
"""

from __future__ import annotations

from pathlib import Path

from perfmodel.ptx import parse_module

NVCC_DIR = Path(__file__).resolve().parent / "fixtures" / "ptx" / "nvcc"

#: registers per thread given with each request, so that the tests do not depend on ptxas;
#: below the 940MX limit (255) and 65,536 / 384 threads
REGISTERS_PER_THREAD = 64


def entries() -> list[tuple[str, str, tuple[int, int, int]]]:
    """(fixture file name, entry name, block shape) for every entry of every fixture."""
    out = []
    for path in sorted(NVCC_DIR.glob("*.ptx")):
        for fn in parse_module(path.read_text()).functions:
            if not fn.is_entry:
                continue
            shape = fn.tuning.get("reqntid") or fn.tuning.get("maxntid") or (256,)
            block = (*shape, 1, 1)[:3]
            out.append((path.name, fn.name, (block[0], block[1], block[2])))
    return out


#: growing grids (blocks along x, y, z), below and across multiples of any SM count
ENTRY_GRIDS = ((1, 1, 1), (2, 1, 1), (2, 3, 1), (7, 3, 2), (66, 5, 4))
