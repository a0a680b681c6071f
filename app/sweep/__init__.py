"""``kperf sweep``: many GEMM shapes through one or more services, resumable.

``shapes`` reads the input, ``journal`` is the output file that doubles as the resume record,
``runner`` sends batches with retries, ``console`` draws progress and the closing summary.
"""

from app.sweep.journal import Journal, JournalLocked
from app.sweep.runner import Sweep, SweepOptions, SweepStats
from app.sweep.shapes import BadLine, Shape, read_shapes

__all__ = [
    "BadLine",
    "Journal",
    "JournalLocked",
    "Shape",
    "Sweep",
    "SweepOptions",
    "SweepStats",
    "read_shapes",
]
