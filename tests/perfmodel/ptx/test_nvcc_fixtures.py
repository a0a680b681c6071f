"""Real PTX from nvcc: the checked-in fixtures parse and show the properties of their .cu source.

Regenerate with tests/fixtures/ptx/nvcc/regenerate.sh. Expected values come from the CUDA
sources (declared shared arrays, loop bounds, index expressions), not from the parser.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from perfmodel.ptx import Function, build_cfg, find_loops, parse_module, tid_x_stride_bytes
from tests.perfmodel.ptx.conftest import NVCC_DIR

FIXTURES = sorted(NVCC_DIR.glob("*.ptx"))


def load(name: str) -> str:
    return (NVCC_DIR / name).read_text()


def test_fixtures_are_present():
    # every .cu has at least one generated module next to it
    for cu in NVCC_DIR.glob("*.cu"):
        assert any(p.name.startswith(cu.stem + ".") for p in FIXTURES), cu.name


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_fixture_parses_and_analyses(path: Path):
    text = path.read_text()
    m = parse_module(text)
    # independent count: ".entry" directives in the text
    assert len(m.entries) == len(re.findall(r"\.entry\s", text))
    assert m.target == re.search(r"\.target\s+(\w+)", text).group(1)
    lines = text.splitlines()
    for fn in m.functions:
        blocks = build_cfg(fn)
        assert sum(b.end - b.start for b in blocks) == len(fn.instructions)
        for ins in fn.instructions:
            # the reported position holds the opcode as written
            assert lines[ins.line - 1][ins.column - 1 :].startswith(ins.full_opcode)
        for loop in find_loops(fn, blocks):
            assert loop.header_label in fn.label_index
            assert loop.first_line <= loop.last_line


def kernel(name: str, fixture: str) -> Function:
    return parse_module(load(fixture)).entry(name)


def lines_with(fn: Function, full_opcode: str) -> list[int]:
    return [i for i, ins in enumerate(fn.instructions) if ins.full_opcode == full_opcode]


@pytest.mark.parametrize("fixture", ["matmul_tiled.sm_75.ptx", "matmul_tiled.sm_90.ptx"])
def test_matmul_loops_barriers_shared(fixture):
    fn = kernel("matmul_tiled", fixture)
    # __shared__ float As[16][16], Bs[16][16]
    assert fn.shared_bytes == 2 * 16 * 16 * 4
    # two __syncthreads() in the tile loop
    assert len(lines_with(fn, "bar.sync")) == 2
    loops = find_loops(fn, build_cfg(fn))
    outer, inner = loops
    assert (outer.depth, inner.depth, inner.parent) == (1, 2, outer.header_label)
    # the tile loop spans both barriers; its count n/16 is a runtime value
    bars = [fn.instructions[i].line for i in lines_with(fn, "bar.sync")]
    assert outer.first_line < min(bars) and max(bars) <= outer.last_line
    assert outer.inferred_trip_count is None
    # the k loop: for (k = 0; k < 16; ++k), compiled with #pragma unroll 1
    assert inner.inferred_trip_count == 16
    assert fn.instructions[fn.label_index[inner.header_label]].line == inner.first_line


def test_matmul_fixed_trip_counts():
    fn = kernel("matmul_fixed", "matmul_tiled.sm_75.ptx")
    counts = [lp.inferred_trip_count for lp in find_loops(fn, build_cfg(fn))]
    assert counts == [1024 // 16, 16]


def test_matmul_strides():
    fn = kernel("matmul_tiled", "matmul_tiled.sm_75.ptx")
    loads = lines_with(fn, "ld.global.f32")
    # A[row*n + t*16 + tx] and B[(t*16+ty)*n + col], col = bx*16 + tx: consecutive floats
    assert [tid_x_stride_bytes(fn, i) for i in loads] == [4, 4]
    shared = lines_with(fn, "ld.shared.f32")
    # As[ty][k] is the same for all tx (broadcast), Bs[k][tx] consecutive
    assert sorted(tid_x_stride_bytes(fn, i) for i in shared) == [0, 4]


def test_transpose_is_strided_and_stencil_coalesced():
    fn = kernel("transpose_naive", "stencil.sm_75.ptx")
    (load_i,) = lines_with(fn, "ld.global.f32")
    (store_i,) = lines_with(fn, "st.global.f32")
    assert tid_x_stride_bytes(fn, load_i) == 1024 * 4  # in[x * 1024 + y]
    assert tid_x_stride_bytes(fn, store_i) == 4  # out[y * width + x]
    st = kernel("stencil_1d", "stencil.sm_75.ptx")
    assert st.shared_bytes == (256 + 2 * 3) * 4
    (loop,) = find_loops(st, build_cfg(st))
    assert loop.inferred_trip_count == 2 * 3 + 1  # o = -RADIUS .. RADIUS
    assert all(tid_x_stride_bytes(st, i) == 4 for i in lines_with(st, "ld.global.f32"))


def test_reduce_shfl():
    fn = kernel("reduce_shfl", "reduce_shfl.sm_75.ptx")
    shfl = [i for i in fn.instructions if i.opcode == "shfl"]
    # warp_sum is inlined twice and fully unrolled: 5 steps (16, 8, 4, 2, 1) each time
    assert len(shfl) == 10
    assert all(len(i.defs) == 2 for i in shfl)  # %r|%p: value and in-range predicate
    assert fn.shared_bytes == 32 * 4
    assert find_loops(fn, build_cfg(fn)) == ()
    (atom,) = [i for i in fn.instructions if i.opcode == "atom"]
    assert atom.state_space == "global"
    # atomicAdd(out, v): one address for the whole warp
    assert tid_x_stride_bytes(fn, fn.instructions.index(atom)) == 0


def test_histogram_atomics():
    fn = kernel("histogram", "atomics.sm_75.ptx")
    assert fn.shared_bytes == 256 * 4
    atoms = [(i, ins) for i, ins in enumerate(fn.instructions) if ins.opcode == "atom"]
    spaces = sorted(ins.state_space or "" for _, ins in atoms)
    assert spaces == ["global", "global", "shared"]
    strides = {ins.state_space: [] for _, ins in atoms}
    for i, ins in atoms:
        strides[ins.state_space].append(tid_x_stride_bytes(fn, i))
    assert strides["shared"] == [None]  # &local[data[i]]: data dependent
    assert sorted(strides["global"]) == [0, 4]  # &bins[256] and &bins[threadIdx.x]
    # the grid-stride loop bound is the runtime n
    (loop,) = find_loops(fn, build_cfg(fn))
    assert loop.inferred_trip_count is None


def test_double_precision():
    fn = kernel("daxpy", "dp.sm_75.ptx")
    f64 = [i for i, ins in enumerate(fn.instructions) if ins.full_opcode.endswith("global.f64")]
    assert len(f64) == 3 and all(tid_x_stride_bytes(fn, i) == 8 for i in f64)
    h = kernel("horner100", "dp.sm_75.ptx")
    (loop,) = find_loops(h, build_cfg(h))
    assert loop.inferred_trip_count == 100
    assert any(ins.full_opcode.startswith("fma.rn.f64") for ins in h.instructions)


def test_debug_build_parses():
    m = parse_module(load("dp.debug.sm_75.ptx"))
    # the .func prototype of sqrt has no body; the -G build defines it as well
    assert set(m.entries) == {"daxpy", "horner100"}


def test_sm80_cp_async_and_mma():
    fn = kernel("wmma_cp_async", "sm80_mma.sm_80.ptx")
    assert fn.shared_bytes == 2 * 16 * 16 * 2  # two 16x16 half tiles
    cps = [
        (i, ins)
        for i, ins in enumerate(fn.instructions)
        if ins.full_opcode.startswith("cp.async.cg")
    ]
    assert cps and all(ins.state_space == "global" for _, ins in cps)
    # &A[kt*256 + t*8] with 2-byte halves: 16 bytes per thread
    assert {tid_x_stride_bytes(fn, i) for i, _ in cps} == {16}
    assert any(ins.opcode == "wmma" and "mma" in ins.modifiers for ins in fn.instructions)
    mma = kernel("mma_m16n8k16", "sm80_mma.sm_80.ptx")
    (ins,) = [i for i in mma.instructions if i.opcode == "mma"]
    assert [o.kind for o in ins.operands] == ["vector"] * 4
    assert len(ins.defs) == 4 and set(ins.defs) <= set(ins.uses)  # accumulates in place


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_live_nvcc_regenerates_a_fixture(tmp_path):
    out = tmp_path / "stencil.ptx"
    subprocess.run(
        ["nvcc", "-ptx", "-arch=sm_75", "-o", str(out), str(NVCC_DIR / "stencil.cu")],
        check=True,
        capture_output=True,
        timeout=100,
    )
    fresh = parse_module(out.read_text())
    stored = parse_module(load("stencil.sm_75.ptx"))
    assert fresh.entries == stored.entries
    for name in fresh.entries:
        a, b = fresh.entry(name), stored.entry(name)
        assert [i.full_opcode for i in a.instructions] == [i.full_opcode for i in b.instructions]
        assert a.shared_bytes == b.shared_bytes


def test_crlf_line_endings_give_the_same_positions():
    text = load("matmul_tiled.sm_75.ptx")
    a = parse_module(text).entry("matmul_tiled")
    b = parse_module(text.replace("\n", "\r\n")).entry("matmul_tiled")
    assert [(i.line, i.column, i.text) for i in a.instructions] == [
        (i.line, i.column, i.text) for i in b.instructions
    ]


# ---- sm_90a (tests/fixtures/ptx/nvcc/make_hopper_fixtures.sh)


@pytest.mark.parametrize("name", ["grammar.sm_90a.ptx", "grammar.debug.sm_90a.ptx"])
def test_grammar_directives_of_grammar_cu(name):
    """Launch attributes of grammar.cu become header directives; values from the source."""
    m = parse_module(load(name))
    assert m.target == "sm_90a"
    tuning = {f.name: dict(f.tuning) for f in m.functions if f.is_entry}
    # __cluster_dims__(2, 1, 1) __launch_bounds__(128)
    assert tuning["_Z16cluster_exchangePfPKf"] == {
        "maxntid": (128, 1, 1),
        "explicitcluster": (),
        "reqnctapercluster": (2, 1, 1),
    }
    assert tuning["_Z13indirect_callPfi"] == {"maxntid": (256, 1, 1), "minnctapersm": (2,)}
    assert tuning["_Z6cappedPfi"] == {"maxnreg": (64,)}  # __maxnreg__(64)
    # __block_size__((64, 2, 1)): a required shape, and each block its own 1x1x1 cluster
    assert tuning["_Z11fixed_shapePf"] == {
        "blocksareclusters": (),
        "reqntid": (64, 2, 1),
        "reqnctapercluster": (1, 1, 1),
    }
    bodies = {f.name for f in m.functions if not f.is_entry}
    # __noinline__ functions have bodies (.visible/.weak .func); external_scale is .extern only
    assert {"_Z5twicef", "_Z6thricef", "_Z4polyILi4EEff", "_Z4polyILi2EEff"} <= bodies
    assert "_Z14external_scalef" not in bodies


def test_grammar_loops_and_calls():
    m = parse_module(load("grammar.sm_90a.ptx"))
    fns = {f.name: f for f in m.functions}
    # poly<K>: for (i = 0; i < K; ++i) under #pragma unroll 1 (.pragma "nounroll")
    for k in (3, 4):
        fn = fns[f"_Z4polyILi{k}EEff"]
        (loop,) = find_loops(fn, build_cfg(fn))
        assert loop.inferred_trip_count == k
    # poly<2> is counted by a predicate that flips (mov.pred %p, -1 ... 0): no counter
    fn = fns["_Z4polyILi2EEff"]
    (loop,) = find_loops(fn, build_cfg(fn))
    assert loop.inferred_trip_count is None
    # capped: the loop bound is the runtime n
    (loop,) = find_loops(fns["_Z6cappedPfi"], build_cfg(fns["_Z6cappedPfi"]))
    assert loop.inferred_trip_count is None
    # indirect_call: one call through the function pointer (with a prototype), one direct
    calls = [i for i in fns["_Z13indirect_callPfi"].instructions if i.opcode == "call"]
    assert len(calls) == 2
    assert sum(any(o.text.startswith("prototype_") for o in c.operands) for c in calls) == 1
    # cluster_exchange: cluster.sync() is barrier.cluster arrive + wait, twice
    ops = [i.full_opcode for i in fns["_Z16cluster_exchangePfPKf"].instructions]
    assert ops.count("barrier.cluster.arrive") == ops.count("barrier.cluster.wait") == 2


# (fixture, wgmma shape: M 64 per warp group, N the tile N (or the tile N a warp group owns))
CUTLASS = [
    # 64x128x64, ping-pong: each math warp group owns a whole 64x128 tile
    ("cutlass_ws_gemm.pingpong_64x128x64.sm_90a.ptx", "m64n128k16"),
    # 128x256x64, cooperative: two warp groups split M, each 64x256
    ("cutlass_ws_gemm.cooperative_128x256x64.sm_90a.ptx", "m64n256k16"),
    ("cutlass_ws_gemm.ws_64x128x64.sm_90a.ptx", "m64n128k16"),
    # FMHA 128x64, head dim 64: S = Q K^T per 64-wide KV tile and O += P V, both 64x64
    ("cutlass_fmha.cooperative_128x64x64.sm_90a.ptx", "m64n64k16"),
]


@pytest.mark.parametrize(("fixture", "shape"), CUTLASS)
def test_cutlass_kernels_parse_with_their_tile_shapes(fixture, shape):
    text = load(fixture)
    m = parse_module(text)
    (fn,) = [f for f in m.functions if f.is_entry]
    mma = [i for i in fn.instructions if i.opcode == "wgmma" and i.modifiers[0] == "mma_async"]
    assert mma and {i.modifiers[3] for i in mma} == {shape}
    # the k loop advances by k16 steps: a 64-deep k tile takes 64 / 16 = 4 wgmma per stage
    assert len(mma) % 4 == 0
    # CuTe's barrier waits reuse LAB_WAIT in every inline-asm block: each is its own loop
    waits = text.count("LAB_WAIT:")
    assert waits > 1
    assert sum(1 for lab in fn.label_index if lab.startswith("LAB_WAIT@")) == waits
    # shared memory is dynamic (extern .shared []): nothing static
    assert fn.shared_bytes == 0


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not on PATH")
def test_ptxas_counts_registers_of_sm_90a_modules():
    from perfmodel.manybsp.ptxas import ptxas_registers

    fixture = "cutlass_ws_gemm.pingpong_64x128x64.sm_90a.ptx"
    text = load(fixture)
    fn = parse_module(text).entries[0]
    found = ptxas_registers(text, fn, "sm_90a")
    assert found is not None
    regs, arch = found
    assert arch == "sm_90a"  # compiled for its own target, no fallback
    # setmaxnreg.inc raises the math warp groups to 232: the launch count is at most that
    assert 1 <= regs <= 232


def test_string_valued_section_with_braces_and_slashes():
    """A .debug_str-style .section whose strings hold braces and '//' (nvcc 13's -G output
    in grammar.debug.sm_90a.ptx encodes its strings as .b8 numbers; this is the string form)."""
    text = (
        ".version 8.0\n.target sm_90a\n.address_size 64\n"
        '.section .debug_str\n{\n$L__info_string0:\n.b8 "void k<{1}>() // x"\n.b8 0\n}\n'
        ".visible .entry k()\n{\nret;\n}\n"
    )
    m = parse_module(text)
    assert m.entries == ("k",)
    assert m.entry("k").instructions[0].line == text.splitlines().index("ret;") + 1
