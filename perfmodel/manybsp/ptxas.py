"""Registers per thread from ``ptxas -v`` when the tool is installed."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USED = re.compile(r"Used (\d+) registers")
PTXAS_TIMEOUT_S = 30.0


#: tried when ptxas no longer supports the module's own target (CUDA 13 starts at sm_75)
FALLBACK_TARGET = "sm_75"


def ptxas_registers(ptx: str, kernel: str, target: str) -> tuple[int, str] | None:
    """(``Used N registers`` of ``kernel``, the target ptxas compiled for); None when ptxas is
    absent, refuses the module for its own target and for :data:`FALLBACK_TARGET`, or times
    out."""
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    return _registers(exe, ptx, kernel, target)


# A sweep over launch shapes resubmits the same module: compiling a CUTLASS kernel takes ptxas
# longer than the whole model (bench/RESULTS.md, "Hopper PTX"), so answers are kept per
# (ptxas, text, kernel, target); 16 modules of at most KPERF_MAX_PTX_BYTES each.
@functools.lru_cache(maxsize=16)
def _registers(exe: str, ptx: str, kernel: str, target: str) -> tuple[int, str] | None:
    for arch in dict.fromkeys((target, FALLBACK_TARGET)):
        regs = _run(exe, ptx, kernel, arch)
        if regs is not None:
            return regs, arch
    return None


def _run(exe: str, ptx: str, kernel: str, target: str) -> int | None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx, encoding="utf-8")
        try:
            proc = subprocess.run(
                [exe, "-v", f"--gpu-name={target}", str(src), "-o", str(Path(tmp) / "k.cubin")],
                capture_output=True,
                text=True,
                timeout=PTXAS_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
    if proc.returncode != 0:
        return None
    current: str | None = None
    for line in (proc.stdout + proc.stderr).splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
            continue
        m = _USED.search(line)
        if m and current == kernel:
            return int(m.group(1))
    return None
