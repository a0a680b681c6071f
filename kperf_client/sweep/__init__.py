"""``kperf sweep``: many GEMM shapes through one or more services, resumable.

``shapes`` reads the input, ``journal`` is the output file that doubles as the resume record,
``runner`` sends batches with retries, ``console`` draws progress and the closing summary.
"""

from kperf_client.sweep.journal import Journal, JournalLocked
from kperf_client.sweep.runner import Sweep, SweepOptions, SweepStats
from kperf_client.sweep.shapes import BadLine, Shape, read_shapes

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
