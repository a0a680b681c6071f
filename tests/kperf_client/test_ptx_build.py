"""PtxBuilder: PTX and ptxas resources per configuration, built as Kernel Tuner builds them.

With nvcc: a tiny kernel whose shared array and constant loop bound are tunables (the bytes and
the PTX follow the defines), the cache (hit, and a changed header is a miss), and the measured
dedispersion kernel (../shared, read in place) built the way its recipe in ``defines.md`` says
(plain ``-D`` flags on the source with the pragma line removed), which must give the same PTX.
Without nvcc: a clear error, and prebuilt PTX read from a folder.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kperf_client.kt_geometry import block_dimensions, grid_dimensions
from kperf_client.ptx_build import (
    BuildFailed,
    PtxBuilder,
    ToolchainMissing,
    instance_name,
    load_prebuilt,
    parse_ptxas_report,
)

DEDISPERSION = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real-kernels" / "dedispersion"
)
TINY = """#include "tiny.h"
extern "C" __global__ void tiny(float *out) {
    __shared__ float tile[block_size_x * tile_size_x];
    float acc = 0.0f;
    for (int i = 0; i < tile_size_x; i++) {
        tile[threadIdx.x * tile_size_x + i] = SCALE * i;
    }
    __syncthreads();
    #pragma unroll loop_unroll_factor_i
    for (int i = 0; i < tile_size_x; i++) {
        acc += tile[(threadIdx.x * tile_size_x + i + 1) % (block_size_x * tile_size_x)];
    }
    out[blockIdx.x * block_size_x + threadIdx.x] = acc;
}
"""
REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_80'
ptxas info    : Function properties for a
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 360 bytes cmem[0], \
8 bytes cmem[2]
ptxas info    : Compiling entry function 'b' for 'sm_80'
ptxas info    : Function properties for b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 356 bytes cmem[0]
"""


def _skip_without_nvcc() -> None:
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc/ptxas not on PATH")


def _tiny_source(folder: Path, scale: str = "2.0f") -> Path:
    (folder / "tiny.h").write_text(f"#define SCALE {scale}\n")
    source = folder / "tiny.cu"
    source.write_text(TINY)
    return source


def _launch(params: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return grid_dimensions([4096], params), block_dimensions(params)


def test_ptxas_report_gives_each_entrys_resources() -> None:
    found = parse_ptxas_report(REPORT)
    assert sorted(found) == ["a", "b"]
    a, b = found["a"], found["b"]
    assert (a.registers_per_thread, a.shared_bytes, a.constant_bytes) == (40, 1024, 368)
    assert (a.stack_frame_bytes, a.spill_stores_bytes, a.spill_loads_bytes) == (16, 8, 4)
    assert (b.registers_per_thread, b.shared_bytes, b.constant_bytes) == (12, 0, 356)


def test_instance_name_is_kernel_tuners() -> None:
    kt_util = pytest.importorskip("kernel_tuner.util")
    params = {"block_size_x": 4, "tile_size_y": 3, "use_padding": 0}
    assert instance_name(params) == kt_util.get_instance_string(params)


def test_missing_toolchain_names_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainMissing, match="nvcc is not on PATH"):
        PtxBuilder(_tiny_source(tmp_path), arch="sm_80")


def test_prebuilt_ptx_and_report_are_read_by_instance_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no ptxas either: the report file must be used
    params = {"block_size_x": 32, "tile_size_x": 2}
    (tmp_path / "32_2.ptx").write_text(".version 8.0\n.target sm_80\n")
    (tmp_path / "32_2.ptxas.txt").write_text(REPORT)
    build = load_prebuilt(tmp_path, params, arch="sm_80", kernel="b")
    assert build.origin == "prebuilt"
    assert build.ptx.startswith(".version 8.0")
    assert build.resources is not None and build.resources.registers_per_thread == 12
    # no report and no ptxas: the PTX, resources unknown
    (tmp_path / "32_2.ptxas.txt").unlink()
    assert load_prebuilt(tmp_path, params, arch="sm_80", kernel="b").resources is None
    with pytest.raises(FileNotFoundError, match="16_2.ptx"):
        load_prebuilt(tmp_path, {"block_size_x": 16, "tile_size_x": 2}, arch="sm_80", kernel="b")


@pytest.mark.parametrize("arch", ["80", "sm80", "compute_80", "sm_80; rm"])
def test_bad_arch_is_refused(tmp_path: Path, arch: str) -> None:
    with pytest.raises(ValueError, match="arch"):
        PtxBuilder(_tiny_source(tmp_path), arch=arch)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tiny_kernel_follows_its_tunables(tmp_path: Path, arch: str) -> None:
    _skip_without_nvcc()
    builder = PtxBuilder(_tiny_source(tmp_path), arch=arch, kernel="tiny")
    shared = {}
    for bx, tsx in [(32, 1), (64, 3), (128, 4)]:
        params = {"block_size_x": bx, "tile_size_x": tsx, "loop_unroll_factor_i": 0}
        build = builder.build(params, *_launch(params))
        assert build.resources is not None
        # the shared array is block_size_x * tile_size_x floats
        assert build.resources.shared_bytes == 4 * bx * tsx
        assert 1 <= build.resources.registers_per_thread <= 255
        assert re.search(rf"\.shared \.align 4 \.b8 \S+\[{4 * bx * tsx}\]", build.ptx)
        assert f".target {arch}" in build.ptx
        shared[(bx, tsx)] = build.resources.shared_bytes
    assert len(set(shared.values())) == 3


@pytest.mark.nvcc
def test_cache_hits_and_a_changed_header_misses(tmp_path: Path) -> None:
    _skip_without_nvcc()
    cache = tmp_path / "cache"
    source = _tiny_source(tmp_path)
    params = {"block_size_x": 64, "tile_size_x": 2, "loop_unroll_factor_i": 0}
    first = PtxBuilder(source, arch="sm_80", cache_dir=cache).build(params, *_launch(params))
    assert sorted(p.suffixes[-1] for p in cache.iterdir()) == [".ptx", ".txt"]
    # a hit reads the cache: a marker written into the cached PTX comes back
    cached = cache / f"{first.digest}.ptx"
    cached.write_text(first.ptx + "// from the cache\n")
    again = PtxBuilder(source, arch="sm_80", cache_dir=cache).build(params, *_launch(params))
    assert again.digest == first.digest and again.ptx.endswith("// from the cache\n")
    # other defines, options, arch or header: other digests
    other = {**params, "tile_size_x": 3}
    digests = {
        PtxBuilder(source, arch="sm_80", cache_dir=cache).build(other, *_launch(other)).digest,
        PtxBuilder(source, arch="sm_86", cache_dir=cache).build(params, *_launch(params)).digest,
        PtxBuilder(source, arch="sm_80", cache_dir=cache, options=["-lineinfo"])
        .build(params, *_launch(params))
        .digest,
    }
    _tiny_source(tmp_path, scale="3.0f")
    changed = PtxBuilder(source, arch="sm_80", cache_dir=cache).build(params, *_launch(params))
    digests.add(changed.digest)
    assert first.digest not in digests and len(digests) == 4
    assert _code(changed.ptx) != _code(first.ptx)  # the new header's SCALE is compiled in


@pytest.mark.nvcc
def test_compile_error_carries_nvccs_report(tmp_path: Path) -> None:
    _skip_without_nvcc()
    source = _tiny_source(tmp_path)
    params = {"block_size_x": 64}  # tile_size_x undefined
    with pytest.raises(BuildFailed, match="tile_size_x"):
        PtxBuilder(source, arch="sm_80").build(params, *_launch(params))


def _recipe_ptx(tmp_path: Path, params: dict[str, int], grid: tuple[int, ...], arch: str) -> str:
    """defines.md's command-line recipe: pragma line blanked, every define a -D flag."""
    text = (DEDISPERSION / "dedispersion.cu").read_text()
    text = re.sub(
        r"^[ \t]*#pragma unroll loop_unroll_factor_channel[ \t]*$", "", text, flags=re.MULTILINE
    )
    cu = tmp_path / "dedispersion_kt.cu"
    cu.write_text(text)
    flags = [f"-Dgrid_size_{axis}={g}" for axis, g in zip("xyz", grid, strict=True)]
    flags += [f"-D{k}={v}" for k, v in params.items() if k != "loop_unroll_factor_channel"]
    out = tmp_path / "recipe.ptx"
    subprocess.run(
        ["nvcc", "-ptx", f"-arch={arch}", f"-I{DEDISPERSION}", *flags, "-Dkernel_tuner=1"]
        + [str(cu), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    return out.read_text()


def _code(ptx: str) -> list[str]:
    """PTX without comments and debug file/line directives."""
    return [
        line
        for line in ptx.splitlines()
        if line.strip() and not line.lstrip().startswith(("//", ".file", ".loc"))
    ]


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("arch", "values"),
    [("sm_80", (4, 64, 1, 1, 3, 0, 1, 0)), ("sm_86", (2, 120, 1, 2, 5, 0, 0, 0))],
)
def test_dedispersion_builds_as_its_recipe(
    tmp_path: Path, arch: str, values: tuple[int, ...]
) -> None:
    _skip_without_nvcc()
    if not (DEDISPERSION / "dedispersion.cu").exists():
        pytest.skip(f"{DEDISPERSION} absent (public data set, not in the repository)")
    names = (
        "block_size_x block_size_y block_size_z tile_size_x tile_size_y tile_stride_x "
        "tile_stride_y loop_unroll_factor_channel"
    ).split()
    params = dict(zip(names, values, strict=True))
    grid = grid_dimensions([25000, 2048, 1], params)
    builder = PtxBuilder(DEDISPERSION / "dedispersion.cu", arch=arch, kernel="dedispersion_kernel")
    build = builder.build(params, grid, block_dimensions(params))
    assert _code(build.ptx) == _code(_recipe_ptx(tmp_path, params, grid, arch))
    assert build.resources is not None
    assert build.resources.shared_bytes == 0 and build.resources.spill_stores_bytes == 0
    assert 1 <= build.resources.registers_per_thread <= 255
    # two entries in the module: without a kernel name the resources are ambiguous
    with pytest.raises(BuildFailed, match="name the kernel"):
        PtxBuilder(DEDISPERSION / "dedispersion.cu", arch=arch).build(
            params, grid, block_dimensions(params)
        )
