"""The server's allocator setting (app/malloc.py): freed large buffers go back to the system.

Measured in fresh interpreters, with and without the setting, on the allocation pattern of a
burst of large request bodies: each 1 MB buffer is followed by a small long-lived object (as
a request's buffers are by the objects it leaves behind), then the buffers are freed.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from app.malloc import MMAP_THRESHOLD_BYTES, pin_mmap_threshold

MALLOC_MODULE = Path(__file__).resolve().parents[2] / "app" / "malloc.py"

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt(M_MMAP_THRESHOLD) is glibc's",
)

BURST = """
import importlib.util
import sys

# app/malloc.py alone, by its path: importing the app package would load the service's
# modules (numpy, pydantic) into the heap this measures
spec = importlib.util.spec_from_file_location("malloc_alone", sys.argv[2])
malloc_alone = importlib.util.module_from_spec(spec)
spec.loader.exec_module(malloc_alone)
pin_mmap_threshold = malloc_alone.pin_mmap_threshold

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

if sys.argv[1] == "pinned":
    assert pin_mmap_threshold()
warm = bytearray(4_000_000)  # a freed mapping raises glibc's dynamic threshold above 1 MB
del warm
before = rss_kib()
buffers, survivors = [], []
for i in range(40):
    buffers.append(bytearray(1_000_000))
    survivors.append(bytearray(1000))  # above pymalloc's 512 bytes: from the same heap
del buffers
print(rss_kib() - before)
"""


def retained_kib(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", BURST, mode, str(MALLOC_MODULE)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


@glibc
def test_pinned_threshold_gives_freed_buffers_back() -> None:
    unpinned, pinned = retained_kib("default"), retained_kib("pinned")
    # 40 MB of buffers: by default most stay resident (heap pages under the survivors)
    assert unpinned > 20_000, unpinned
    assert pinned < 5_000, pinned


@glibc
def test_pinning_reports_success_on_glibc() -> None:
    assert pin_mmap_threshold(MMAP_THRESHOLD_BYTES) is True
