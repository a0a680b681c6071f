"""Address strides: hand-written cases and a property test against coefficient arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.ptx import parse_module, tid_x_stride_bytes
from perfmodel.ptx.affine import InstructionIndexError, address_form
from tests.perfmodel.ptx.conftest import kernel

DECLS = ".reg .b32 %r<40>;\n.reg .b64 %rd<40>;\n.reg .f32 %f<4>;\n.reg .pred %p<3>;\n"
PROLOGUE = "ld.param.u64 %rd1, [k_param_0];\ncvta.to.global.u64 %rd2, %rd1;\nmov.u32 %r1, %tid.x;\n"


def stride_of_last(body: str) -> int | None:
    fn = parse_module(kernel(DECLS + PROLOGUE + body)).entry(None)
    return tid_x_stride_bytes(fn, len(fn.instructions) - 1)


CASES = [
    ("mul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd4, %rd2, %rd3;\nld.global.f32 %f1, [%rd4];", 4),
    (
        "mov.u32 %r2, %ctaid.x;\nmov.u32 %r3, %ntid.x;\nmul.lo.s32 %r4, %r2, %r3;\n"
        "shl.b32 %r5, %r1, 1;\nadd.s32 %r6, %r4, %r5;\nmul.wide.s32 %rd3, %r6, 8;\n"
        "add.s64 %rd4, %rd2, %rd3;\nld.global.f64 %f1, [%rd4+8];",
        16,
    ),
    ("ld.global.f32 %f1, [%rd2];", 0),
    (
        "ld.param.u32 %r2, [k_param_0+8];\nmul.lo.s32 %r3, %r1, %r2;\nmul.wide.s32 %rd3, %r3, 4;\n"
        "add.s64 %rd4, %rd2, %rd3;\nld.global.f32 %f1, [%rd4];",
        None,
    ),
    (
        "mul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd4, %rd2, %rd3;\nld.global.u32 %r2, [%rd4];\n"
        "mul.wide.u32 %rd5, %r2, 4;\nadd.s64 %rd6, %rd2, %rd5;\nld.global.f32 %f1, [%rd6];",
        None,
    ),
    (
        "and.b32 %r2, %r1, 7;\nmul.wide.u32 %rd3, %r2, 4;\nadd.s64 %rd4, %rd2, %rd3;\n"
        "ld.global.f32 %f1, [%rd4];",
        None,
    ),
    (
        "neg.s32 %r2, %r1;\nmul.wide.s32 %rd3, %r2, 4;\nadd.s64 %rd4, %rd2, %rd3;\n"
        "st.global.f32 [%rd4], %f1;",
        -4,
    ),
    (
        "mul.lo.s32 %r2, %r1, 132;\nmov.u32 %r3, tile;\nadd.s32 %r4, %r3, %r2;\n"
        "ld.shared.f32 %f1, [%r4];",
        132,
    ),
    (
        "mul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd10, %rd2, %rd3;\nL:\nld.global.f32 %f1, [%rd10];\n"
        "add.s64 %rd10, %rd10, 4096;\n@%p1 bra L;\nld.global.f32 %f1, [%rd10];",
        4,
    ),
    (
        "mul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd10, %rd2, %rd3;\nL:\nld.global.f32 %f1, [%rd10];\n"
        "add.s64 %rd10, %rd10, %rd3;\n@%p1 bra L;\nld.global.f32 %f1, [%rd10];",
        None,
    ),
    (
        "ld.global.u32 %r2, [%rd2];\nadd.s32 %r3, %r2, %r1;\nmul.wide.s32 %rd3, %r3, 4;\n"
        "add.s64 %rd4, %rd2, %rd3;\nld.global.f32 %f1, [%rd4];",
        4,
    ),
    (
        "mov.u32 %r2, %laneid;\nmul.wide.u32 %rd3, %r2, 2;\nadd.s64 %rd4, %rd2, %rd3;\n"
        "ld.global.u16 %r3, [%rd4];",
        2,
    ),
]
CASE_IDS = [
    "a[tid.x] float",  # consecutive 4-byte elements
    "a[bx*bdx + 2*tid.x] double via shl",  # shl by 1 then 8-byte elements
    "a[0] broadcast",  # same address for all threads
    "a[tid.x*n] runtime stride",  # coefficient is a parameter: unknown
    "a[b[tid.x]] gather",  # data dependent
    "a[tid.x & 7]",  # not affine
    "a[-tid.x] reversed",  # negative stride
    "shared tile[tid.x*33]",  # padded shared-memory row
    "loop pointer + uniform bump",  # loop-carried pointer keeps its stride
    "loop pointer + thread bump",  # loop-carried pointer with a thread-dependent bump
    "a[tid.x + b[0]]",  # value loaded from a uniform address is uniform
    "laneid halves",  # %laneid counts like tid.x within a warp
]


@pytest.mark.parametrize(("body", "stride"), CASES, ids=CASE_IDS)
def test_stride_cases(body, stride):
    assert stride_of_last(".shared .align 4 .b8 tile[4224];\n" + body) == stride


def test_non_memory_and_out_of_range():
    fn = parse_module(kernel(DECLS + PROLOGUE)).entry(None)
    assert tid_x_stride_bytes(fn, 2) is None  # mov: not a memory instruction
    with pytest.raises(InstructionIndexError, match="out of range"):
        tid_x_stride_bytes(fn, 3)


def test_address_form_keeps_tid_y():
    body = (
        "mov.u32 %r2, %tid.y;\nshl.b32 %r3, %r2, 6;\nshl.b32 %r4, %r1, 2;\n"
        "add.s32 %r5, %r3, %r4;\nld.shared.f32 %f1, [%r5+12];"
    )
    fn = parse_module(kernel(DECLS + PROLOGUE + body)).entry(None)
    form = address_form(fn, len(fn.instructions) - 1)
    assert form is not None
    assert (form.const, dict(form.coefs)) == (12, {"tid.x": 4, "tid.y": 64})


# An address built by a random chain of operations on tid.x; the expected coefficient is
# tracked with plain integer arithmetic, independently of the analysis.
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("addc"), st.integers(-100, 100)),
        st.tuples(st.just("mulc"), st.integers(-8, 8)),
        st.tuples(st.just("shl"), st.integers(0, 4)),
        st.tuples(st.just("addu"), st.just(0)),  # + %ctaid.x
        st.tuples(st.just("subu"), st.just(0)),  # - %ntid.x
        st.tuples(st.just("mad"), st.integers(-5, 5)),  # * k + %ctaid.y
        st.tuples(st.just("muly"), st.just(0)),  # * %tid.y: not affine
    ),
    max_size=8,
)


@settings(max_examples=120, deadline=None)
@given(ops=_OPS, elem=st.sampled_from([1, 2, 4, 8, 16]))
def test_stride_property(ops, elem):
    lines = [
        "mov.u32 %r2, %ctaid.x;",
        "mov.u32 %r3, %ntid.x;",
        "mov.u32 %r4, %ctaid.y;",
        "mov.u32 %r5, %tid.y;",
    ]
    cur = "%r1"
    coef: int | None = 1
    for n, (op, k) in enumerate(ops):
        dst = f"%r{10 + n}"
        if op == "addc":
            lines.append(f"add.s32 {dst}, {cur}, {k};")
        elif op == "mulc":
            lines.append(f"mul.lo.s32 {dst}, {cur}, {k};")
            coef = None if coef is None else coef * k
        elif op == "shl":
            lines.append(f"shl.b32 {dst}, {cur}, {k};")
            coef = None if coef is None else coef << k
        elif op == "addu":
            lines.append(f"add.s32 {dst}, %r2, {cur};")
        elif op == "subu":
            lines.append(f"sub.s32 {dst}, {cur}, %r3;")
        elif op == "mad":
            lines.append(f"mad.lo.s32 {dst}, {cur}, {k}, %r4;")
            coef = None if coef is None else coef * k
        elif op == "muly":
            lines.append(f"mul.lo.s32 {dst}, {cur}, %r5;")
            if coef != 0:
                coef = None  # tid.x * tid.y
        cur = dst
    lines += [
        f"mul.wide.s32 %rd3, {cur}, {elem};",
        "add.s64 %rd4, %rd2, %rd3;",
        "ld.global.u8 %r39, [%rd4];",
    ]
    expected = None if coef is None else coef * elem
    got = stride_of_last("\n".join(lines))
    if coef == 0 and any(op == "muly" for op, _ in ops):
        # 0 * tid.y after the thread part vanished: uniform in tid.x either way
        assert got in (0, None)
    else:
        assert got == expected


def test_long_definition_chain():
    # 3000 dependent adds of a constant (deeper than Python's default recursion limit if
    # evaluated naively): the stride is still that of tid.x
    chain = [f"add.s32 %r{i + 2}, %r{i + 1}, 3;" for i in range(3000)]
    body = "\n".join(
        [
            ".reg .b32 %r<3002>;",
            *chain,
            "mul.wide.s32 %rd3, %r3001, 4;",
            "add.s64 %rd4, %rd2, %rd3;",
            "ld.global.f32 %f1, [%rd4];",
        ]
    )
    assert stride_of_last(body) == 4
