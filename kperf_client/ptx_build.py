"""PTX and ptxas resources of a tuned CUDA kernel, one configuration at a time.

``PtxBuilder(source, arch="sm_80").build(params, grid, block)`` compiles the source the way
Kernel Tuner compiles that configuration (:func:`kperf_client.kt_geometry.kernel_tuner_source`:
``#define`` lines in front, ``#line 1``; the source's folder and ``include_dirs`` on the
include path) with ``nvcc -ptx -arch=<arch>``, then assembles the PTX with ``ptxas -v`` for
the registers per thread and the shared, constant, stack and spill bytes of each entry.

Results are cached in ``cache_dir`` (when given) under the SHA-256 of the prepared source, the
text of every file it includes with quotes, the arch, the options and ``nvcc --version``:
``<digest>.ptx`` and ``<digest>.ptxas.txt`` (ptxas' report). A changed header, flag or
toolkit is a new build.

Without a CUDA toolkit, :func:`load_prebuilt` reads a folder of PTX built elsewhere. Naming:
``<instance>.ptx``, where ``<instance>`` is :func:`instance_name` of the configuration (its
tunables' values in the cache's parameter order, joined by ``_``: Kernel Tuner's instance
string, e.g. ``4_64_1_1_3_0_1_0.ptx``), and optionally ``<instance>.ptxas.txt`` holding
``ptxas -v`` 's report for it (without one, ptxas is run when on PATH; else the resources are
unknown).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kperf_client.kt_geometry import BLOCK_SIZE_NAMES, Params, kernel_tuner_source

#: an nvcc virtual/real architecture name as ``-arch`` takes it
_ARCH = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(.*)")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_TARGET = re.compile(r"^\s*\.target\s+(sm_[0-9]+[a-z]?)", re.MULTILINE)
_TIMEOUT_S = 300


class ToolchainMissing(RuntimeError):
    """nvcc or ptxas is not on PATH."""


class BuildFailed(RuntimeError):
    """nvcc or ptxas refused the source; the message holds the tool's own report."""


@dataclass(frozen=True)
class KernelResources:
    """What ``ptxas -v`` reports for one entry."""

    registers_per_thread: int
    shared_bytes: int
    constant_bytes: int
    stack_frame_bytes: int
    spill_stores_bytes: int
    spill_loads_bytes: int


@dataclass(frozen=True)
class PtxBuild:
    """One configuration's PTX and, when known, its entry's resources."""

    ptx: str
    kernel: str | None
    resources: KernelResources | None
    #: ``nvcc`` (built here, cached or not) or ``prebuilt`` (read from a folder)
    origin: str
    digest: str | None = None


def parse_ptxas_report(report: str) -> dict[str, KernelResources]:
    """Resources per entry name from ``ptxas -v`` 's report (its stderr)."""
    found: dict[str, KernelResources] = {}
    entry: str | None = None
    stack = (0, 0, 0)
    for line in report.splitlines():
        if match := _ENTRY.search(line):
            entry, stack = match.group(1), (0, 0, 0)
        elif entry is not None and (match := _STACK.search(line)):
            stack = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
        elif entry is not None and (match := _USED.search(line)):
            rest = match.group(2)
            smem = _SMEM.search(rest)
            found[entry] = KernelResources(
                registers_per_thread=int(match.group(1)),
                shared_bytes=int(smem.group(1)) if smem else 0,
                constant_bytes=sum(int(c) for c in _CMEM.findall(rest)),
                stack_frame_bytes=stack[0],
                spill_stores_bytes=stack[1],
                spill_loads_bytes=stack[2],
            )
            entry = None
    return found


def instance_name(params: Params) -> str:
    """Kernel Tuner's instance string: the values in the parameters' order, joined by ``_``."""
    return "_".join(str(value) for value in params.values())


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolchainMissing(
            f"{name} is not on PATH: install the CUDA toolkit (nvcc and ptxas), or build the PTX "
            "elsewhere and pass its folder (prebuilt PTX)"
        )
    return path


def require_toolchain() -> None:
    """Raises :class:`ToolchainMissing` unless nvcc and ptxas are both on PATH."""
    _tool("nvcc")
    _tool("ptxas")


def _run(command: list[str], what: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise BuildFailed(f"{what} failed ({' '.join(command)}):\n{done.stderr.strip()}")
    return done


def _entry_resources(
    resources: Mapping[str, KernelResources], kernel: str | None, where: str
) -> KernelResources:
    if kernel is not None:
        if kernel not in resources:
            raise BuildFailed(
                f"{where} has no entry {kernel!r}; it has: {', '.join(sorted(resources))}"
            )
        return resources[kernel]
    if len(resources) != 1:
        raise BuildFailed(
            f"{where} has {len(resources)} entries ({', '.join(sorted(resources))}): name the "
            "kernel"
        )
    return next(iter(resources.values()))


def ptxas_report(ptx_path: Path, arch: str) -> str:
    """``ptxas -v`` 's report on a PTX file (ptxas must be on PATH)."""
    command = [_tool("ptxas"), "-v", f"-arch={arch}", str(ptx_path), "-o", os.devnull]
    return _run(command, "ptxas").stderr


def _quoted_includes(text: str, folders: Sequence[Path], seen: dict[str, str]) -> None:
    """Adds each file ``text`` includes with quotes (found in ``folders``), recursively."""
    for name in _INCLUDE.findall(text):
        for folder in folders:
            path = folder / name
            if path.is_file() and str(path) not in seen:
                body = path.read_text(encoding="utf-8", errors="replace")
                seen[str(path)] = body
                _quoted_includes(body, [path.parent, *folders], seen)
                break


def _write_atomically(path: Path, text: str) -> None:
    """Whole or absent, whatever else builds into the same cache folder at the same time."""
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, suffix=".part", delete=False
    ) as f:
        f.write(text)
    os.replace(f.name, path)


class PtxBuilder:
    """Builds one CUDA source's configurations to PTX with nvcc, as Kernel Tuner would."""

    def __init__(
        self,
        source: Path,
        *,
        arch: str,
        kernel: str | None = None,
        include_dirs: Sequence[Path] = (),
        options: Sequence[str] = (),
        cache_dir: Path | None = None,
        block_size_names: Sequence[str] = BLOCK_SIZE_NAMES,
    ) -> None:
        if not _ARCH.match(arch):
            raise ValueError(f"arch must look like sm_80 or sm_90a, got {arch!r}")
        self.source = source
        self.text = source.read_text(encoding="utf-8")
        self.arch = arch
        self.kernel = kernel
        self.include_dirs = [source.resolve().parent, *(d.resolve() for d in include_dirs)]
        self.options = list(options)
        self.cache_dir = cache_dir
        self.block_size_names = tuple(block_size_names)
        self.nvcc = _tool("nvcc")
        _tool("ptxas")
        self.nvcc_version = _run([self.nvcc, "--version"], "nvcc --version").stdout
        includes: dict[str, str] = {}
        _quoted_includes(self.text, self.include_dirs, includes)
        self._includes = sorted(includes.values())

    def digest(self, prepared: str) -> str:
        """The cache key of one configuration's build."""
        key = {
            "source": prepared,
            "includes": self._includes,
            "arch": self.arch,
            "options": self.options,
            "nvcc": self.nvcc_version,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    def build(self, params: Params, grid: Sequence[int], block: Sequence[int]) -> PtxBuild:
        """The PTX and resources of one configuration launched with ``grid`` and ``block``."""
        prepared = kernel_tuner_source(self.text, params, grid, block, self.block_size_names)
        digest = self.digest(prepared)
        if self.cache_dir is not None:
            ptx_path = self.cache_dir / f"{digest}.ptx"
            report_path = self.cache_dir / f"{digest}.ptxas.txt"
            if ptx_path.is_file() and report_path.is_file():
                report = report_path.read_text(encoding="utf-8")
                return self._result(ptx_path.read_text(encoding="utf-8"), report, digest)
        with tempfile.TemporaryDirectory(prefix="kperf-ptx-") as tmp:
            cu = Path(tmp) / self.source.name
            cu.write_text(prepared, encoding="utf-8")
            ptx_file = Path(tmp) / "kernel.ptx"
            includes = [f"-I{folder}" for folder in self.include_dirs]
            _run(
                [self.nvcc, "-ptx", f"-arch={self.arch}", *includes, *self.options, str(cu)]
                + ["-o", str(ptx_file)],
                "nvcc",
            )
            ptx = ptx_file.read_text(encoding="utf-8")
            report = ptxas_report(ptx_file, self.arch)
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            # the report last: a build is cached only when both files are there
            _write_atomically(self.cache_dir / f"{digest}.ptx", ptx)
            _write_atomically(self.cache_dir / f"{digest}.ptxas.txt", report)
        return self._result(ptx, report, digest)

    def _result(self, ptx: str, report: str, digest: str) -> PtxBuild:
        resources = _entry_resources(parse_ptxas_report(report), self.kernel, str(self.source))
        return PtxBuild(
            ptx=ptx, kernel=self.kernel, resources=resources, origin="nvcc", digest=digest
        )


def load_prebuilt(
    folder: Path, params: Params, *, arch: str | None, kernel: str | None
) -> PtxBuild:
    """One configuration's PTX from a folder of prebuilt PTX (naming: the module's docstring);
    ``arch`` for ptxas, default: the PTX's own ``.target``."""
    stem = instance_name(params)
    ptx_path = folder / f"{stem}.ptx"
    if not ptx_path.is_file():
        raise FileNotFoundError(f"no prebuilt PTX for configuration {dict(params)}: {ptx_path}")
    ptx = ptx_path.read_text(encoding="utf-8")
    report_path = folder / f"{stem}.ptxas.txt"
    resources: KernelResources | None
    if report_path.is_file():
        report = report_path.read_text(encoding="utf-8")
        resources = _entry_resources(parse_ptxas_report(report), kernel, str(report_path))
    elif shutil.which("ptxas") is not None:
        target = _TARGET.search(ptx)
        report = ptxas_report(ptx_path, arch or (target.group(1) if target else "sm_80"))
        resources = _entry_resources(parse_ptxas_report(report), kernel, str(ptx_path))
    else:
        resources = None
    return PtxBuild(ptx=ptx, kernel=kernel, resources=resources, origin="prebuilt")
