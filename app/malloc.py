"""The server process's allocator settings: large buffers go back to the system when freed.

glibc's malloc serves a request above its mmap threshold with a mapping of its own, returned
to the kernel on ``free``; below it, from a heap that only shrinks from the top. The threshold
starts at 128 KiB but is *dynamic*: each freed mapping raises it to that size (up to 32 MiB).
A server that handles 2 MB request bodies and 36 MB answers therefore soon serves its 2 MB
buffers from heaps, one per thread that touched them, and keeps their pages after a burst:
measured with ten concurrent 36 MB cache hits, 20 MiB more peak RSS and 35 MiB never given back
(bench/RESULTS.md, "Large answers"). Setting the threshold explicitly (``mallopt``,
``M_MMAP_THRESHOLD``) turns the dynamic adjustment off. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("kperf.malloc")

#: mallopt's parameter number for the mmap threshold (glibc malloc.h)
M_MMAP_THRESHOLD = -3
#: buffers of at least this many bytes are mapped on their own (glibc's starting value is 128
#: KiB; twice that keeps the many 64-256 KiB network chunks on the heap, where they are reused)
MMAP_THRESHOLD_BYTES = 256 * 1024


def pin_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes``; False where there is no glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes))
    if not applied:
        log.warning("mallopt(M_MMAP_THRESHOLD) refused", extra={"bytes": threshold_bytes})
    return applied
