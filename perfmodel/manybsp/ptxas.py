"""Registers per thread from ``ptxas -v`` when the tool is installed."""

from __future__ import annotations

import functools
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USED = re.compile(r"Used (\d+) registers")
PTXAS_TIMEOUT_S = 30.0


#: tried when ptxas no longer supports the module's own target (CUDA 13 starts at sm_75)
FALLBACK_TARGET = "sm_75"


class PtxasUnavailable(Exception):
    """ptxas could not report the registers; the message says why (absent, refused the
    module, timed out, killed)."""


def ptxas_registers(ptx: str, kernel: str, target: str) -> tuple[int, str]:
    """(``Used N registers`` of ``kernel``, the target ptxas compiled for), compiling for the
    module's own target, then for :data:`FALLBACK_TARGET`; :class:`PtxasUnavailable` when
    ptxas is absent, refuses the module for both, or times out."""
    exe = shutil.which("ptxas")
    if exe is None:
        raise PtxasUnavailable("ptxas is not on PATH")
    found = _registers(exe, ptx, kernel, target)
    if isinstance(found, str):
        raise PtxasUnavailable(found)
    return found


# A sweep over launch shapes resubmits the same module: compiling a CUTLASS kernel takes ptxas
# longer than the whole model (bench/RESULTS.md, "Hopper PTX"), so answers are kept per
# (ptxas, text, kernel, target); 16 modules of at most KPERF_MAX_PTX_BYTES each. A failure is
# kept too: a module ptxas timed out on is not compiled again for each resubmission.
@functools.lru_cache(maxsize=16)
def _registers(exe: str, ptx: str, kernel: str, target: str) -> tuple[int, str] | str:
    """The registers and target, or why ptxas gave none (each target tried, ``; `` apart)."""
    reasons: list[str] = []
    for arch in dict.fromkeys((target, FALLBACK_TARGET)):
        regs = _run(exe, ptx, kernel, arch)
        if isinstance(regs, int):
            return regs, arch
        reasons.append(regs or f"ptxas gave no registers for {arch}")
        if isinstance(regs, str) and regs.startswith("ptxas did not finish"):
            break  # another target would take as long
    return "; ".join(reasons)


def _first_error(output: str) -> str:
    """ptxas's first error line, shortened (the whole output may be megabytes)."""
    for line in output.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return output.strip().splitlines()[0][:300] if output.strip() else "no output"


def _run(exe: str, ptx: str, kernel: str, target: str) -> int | str:
    """``Used N registers`` of ``kernel`` compiled for ``target``, or why there is none."""
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
        except subprocess.TimeoutExpired:
            return f"ptxas did not finish within {PTXAS_TIMEOUT_S:g} s ({target})"
        except OSError as exc:
            return f"ptxas could not start: {exc}"
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return f"ptxas was killed by {name} compiling for {target} (out of memory?)"
    if proc.returncode != 0:
        return f"ptxas refused the module for {target}: {_first_error(proc.stderr)}"
    current: str | None = None
    for line in (proc.stdout + proc.stderr).splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
            continue
        m = _USED.search(line)
        if m and current == kernel:
            return int(m.group(1))
    return f"ptxas reported no registers for kernel {kernel} ({target})"
