"""Warp roles: per-thread evaluation against Python, and the roles of hand-written and CUTLASS
warp-specialized kernels against what their sources say each warp does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.ptx import Function, parse_module, warp_roles
from perfmodel.ptx.threads import ThreadValues
from tests.perfmodel.ptx.conftest import NVCC_DIR, kernel

MASK = 0xFFFFFFFF

# ---- ThreadValues against a direct Python evaluation (independent brute force)

_OPS = {
    "add.s32": lambda a, b: (a + b) & MASK,
    "sub.s32": lambda a, b: (a - b) & MASK,
    "mul.lo.s32": lambda a, b: (a * b) & MASK,
    "and.b32": lambda a, b: a & b,
    "or.b32": lambda a, b: a | b,
    "xor.b32": lambda a, b: a ^ b,
    "shr.u32": lambda a, b: a >> min(b, 32),
    "shl.b32": lambda a, b: (a << min(b, 32)) & MASK,
    "div.u32": lambda a, b: a // b if b else None,
    "rem.u32": lambda a, b: a % b if b else None,
    "min.u32": min,
    "max.u32": max,
}


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[tuple[str, str, str]], tuple[int, int, int]]:
    """Straight-line chains over %tid.x/%tid.y/%laneid and small constants."""
    block = (draw(st.integers(1, 96)), draw(st.integers(1, 3)), 1)
    steps = []
    for k in range(draw(st.integers(1, 8))):
        srcs = ["%tid.x", "%tid.y", "%laneid"] + [f"%r{j}" for j in range(k)]
        a = draw(st.sampled_from(srcs))
        b = draw(st.one_of(st.sampled_from(srcs), st.integers(0, 40).map(str)))
        steps.append((draw(st.sampled_from(sorted(_OPS))), a, b))
    return steps, block


def _python(steps, block, t):
    x, y = t % block[0], (t // block[0]) % block[1]
    env = {"%tid.x": x, "%tid.y": y, "%laneid": t % 32}
    for k, (op, a, b) in enumerate(steps):
        av = env[a]
        bv = env[b] if b in env else int(b)
        # a division by zero leaves no value, for this register and what is computed from it
        env[f"%r{k}"] = None if av is None or bv is None else _OPS[op](av, bv)
    return env[f"%r{len(steps) - 1}"]


@settings(max_examples=150, deadline=None)
@given(programs())
def test_thread_values_match_python(program):
    steps, block = program
    lines = [f".reg .b32 %r<{len(steps)}>;"]
    for k, (op, a, b) in enumerate(steps):
        if a.startswith("%tid") or a == "%laneid":  # a special register must be moved first
            lines.append(f"mov.u32 %r{k}, {a};")
            a = f"%r{k}"
        lines.append(f"{op} %r{k}, {a}, {b};")
    lines.append("ret;")
    fn = parse_module(kernel("\n".join(lines))).entry("k")
    values = ThreadValues(fn, block)
    last = len(fn.instructions) - 1  # the ret reads the final register
    got = values.value_at(f"%r{len(steps) - 1}", last)
    n = block[0] * block[1]
    want = [_python(steps, block, t) for t in range(n)]
    if any(v is None for v in want):
        assert got is None  # a division by zero on the way: no value
    else:
        assert got is not None and [v & MASK for v in got] == want


# ---- hand-written role dispatch

# warp group index as CUTLASS computes it: shfl.sync.idx of tid.x / 128 from lane 0
DISPATCH = """\
.reg .b32 %r<8>;
.reg .pred %p<4>;
mov.u32 %r1, %tid.x;
shr.u32 %r2, %r1, 7;
mov.u32 %r3, 0;
mov.u32 %r4, 31;
mov.u32 %r5, -1;
shfl.sync.idx.b32 %r6|%p1, %r2, %r3, %r4, %r5;
setp.eq.s32 %p2, %r6, 0;
@%p2 bra PRODUCER;
add.s32 %r7, %r6, 1;
mul.lo.s32 %r7, %r7, 3;
ret;
PRODUCER:
setp.eq.u32 %p3, %r1, 0;
@%p3 bra ELECTED;
ret;
ELECTED:
add.s32 %r7, %r1, 7;
ret;"""


def test_producer_and_consumer_warp_groups_are_roles():
    fn = parse_module(kernel(DISPATCH)).entry("k")
    roles = warp_roles(fn, (256, 1, 1))
    # tid.x / 128 == 0 for warps 0-3 (threads 0..127): the producer; warps 4-7 consume.
    # tid.x == 0 holds for one lane of warp 0 and no lane of warps 1-3: warp 0 may run the
    # ELECTED code (both sides stay open for it), warps 1-3 never do.
    assert [r.warps for r in roles] == [(0,), (1, 2, 3), (4, 5, 6, 7)]
    assert [r.threads for r in roles] == [32, 96, 128]
    elected, idle, consumer = roles
    text = [ins.text for ins in fn.instructions]

    def has(role, prefix):
        return any(text[i].startswith(prefix) for i in role.instructions)

    assert has(consumer, "mul.lo") and not has(elected, "mul.lo") and not has(idle, "mul.lo")
    assert has(elected, "add.s32 %r7, %r1") and not has(idle, "add.s32 %r7, %r1")
    assert sum(fn.instructions[i].opcode == "ret" for i in elected.instructions) == 2


def test_lane_divergent_branches_make_no_roles():
    body = DISPATCH.replace("shr.u32 %r2, %r1, 7;", "and.b32 %r2, %r1, 1;")  # odd/even lanes
    fn = parse_module(kernel(body)).entry("k")
    (role,) = warp_roles(fn, (256, 1, 1))
    assert role.warps == tuple(range(8)) and not role.fixed_branches
    assert role.instructions == frozenset(range(len(fn.instructions)))


def test_roles_follow_the_block_shape():
    fn = parse_module(kernel(DISPATCH)).entry("k")
    # 128 threads: every warp is in warp group 0, so no warp consumes
    (role,) = warp_roles(fn, (128, 1, 1))
    assert role.warps == (0, 1, 2, 3)
    # tid.x counts along x only: a 64 x 4 block still has tid.x < 128 everywhere
    (role,) = warp_roles(fn, (64, 4, 1))
    assert role.threads == 256


def test_a_warp_index_from_a_parameter_is_not_resolved():
    body = DISPATCH.replace("mov.u32 %r1, %tid.x;", "ld.param.u32 %r1, [k_param_0];")
    fn = parse_module(kernel(body)).entry("k")
    assert len(warp_roles(fn, (256, 1, 1))) == 1


# ---- CUTLASS: WarpGroupRole/ProducerWarpRole of the kernel sources (see docstrings there)

# (fixture, threads per block (.maxntid), warp issuing the mainloop TMA loads, MMA warps)
CUTLASS = [
    # sm90_gemm_tma_warpspecialized_pingpong.hpp: Producer = warp group 0, Consumer0/1 = 1, 2;
    # ProducerWarpRole::Mainloop = 0
    ("cutlass_ws_gemm.pingpong_64x128x64.sm_90a.ptx", 384, 0, range(4, 12)),
    # sm90_gemm_tma_warpspecialized_cooperative.hpp: same roles, consumers share a tile
    ("cutlass_ws_gemm.cooperative_128x256x64.sm_90a.ptx", 384, 0, range(4, 12)),
    # sm90_gemm_tma_warpspecialized.hpp: Producer = 0, Consumer = 1; MainloopEpilogue = 0
    ("cutlass_ws_gemm.ws_64x128x64.sm_90a.ptx", 256, 0, range(4, 8)),
    # examples/88_hopper_fmha fmha_kernel_tma_warpspecialized.hpp: ProducerWarpRole::LoadKV = 1
    ("cutlass_fmha.cooperative_128x64x64.sm_90a.ptx", 384, 1, range(4, 12)),
]


def _entry(fixture: str) -> Function:
    return parse_module((NVCC_DIR / fixture).read_text()).functions[-1]


@pytest.mark.parametrize(("fixture", "threads", "load_warp", "mma_warps"), CUTLASS)
def test_cutlass_roles_separate_producer_and_consumers(fixture, threads, load_warp, mma_warps):
    fn = _entry(fixture)
    assert fn.tuning["maxntid"][0] == threads
    roles = warp_roles(fn, (threads, 1, 1))
    assert sorted(w for r in roles for w in r.warps) == list(range(threads // 32))

    def issues(role, predicate):
        return any(predicate(fn.instructions[i]) for i in role.instructions)

    def is_mma(ins):
        return ins.opcode == "wgmma" and ins.modifiers[0] == "mma_async"

    def is_tma_load(ins):  # global -> shared::cluster tensor copies
        return (
            ins.full_opcode.startswith("cp.async.bulk.tensor")
            and "global" in ins.modifiers[ins.modifiers.index("tensor") + 2 :][:2]
        )

    for role in roles:
        in_mma_group = set(role.warps) <= set(mma_warps)
        assert issues(role, is_mma) == in_mma_group, role.warps
        if issues(role, is_tma_load) and not in_mma_group:
            assert set(role.warps) <= set(range(4))  # loads come from the producer group
    (loader,) = [r for r in roles if load_warp in r.warps]
    assert issues(loader, is_tma_load)
    # no role runs the whole kernel: each path is modelled for the warps that take it
    assert all(len(r.instructions) < len(fn.instructions) for r in roles)
