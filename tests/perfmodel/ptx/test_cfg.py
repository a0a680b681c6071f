"""Basic blocks, natural loops and trip counts; trip counts are checked against a simulation."""

from __future__ import annotations

import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.ptx import build_cfg, find_loops, parse_module
from perfmodel.ptx.cfg import dominators
from tests.perfmodel.ptx.conftest import kernel

DECLS = ".reg .b32 %r<9>;\n.reg .pred %p<4>;\n"


def fn_of(body: str):
    return parse_module(kernel(DECLS + body)).entry(None)


def test_blocks_and_edges_of_if_then_else():
    fn = fn_of(
        """
        setp.eq.s32 %p1, %r1, 0;
        @%p1 bra ELSE;
        add.s32 %r2, %r1, 1;
        bra.uni JOIN;
    ELSE:
        sub.s32 %r2, %r1, 1;
    JOIN:
        ret;
    """
    )
    blocks = build_cfg(fn)
    assert [(b.start, b.end, b.label) for b in blocks] == [
        (0, 2, None),
        (2, 4, None),
        (4, 5, "ELSE"),
        (5, 6, "JOIN"),
    ]
    # guarded branch: target and fall-through; unconditional branch: target only
    assert [set(b.successors) for b in blocks] == [{2, 1}, {3}, {3}, set()]
    assert [set(b.predecessors) for b in blocks] == [set(), {0}, {0}, {1, 2}]
    assert dominators(blocks) == [None, 0, 0, 0]
    assert find_loops(fn, blocks) == ()


NESTED = """
        mov.u32 %r1, 0;
    OUTER:
        mov.u32 %r2, 10;
    INNER:
        add.s32 %r3, %r3, %r2;
        add.s32 %r2, %r2, -2;
        setp.gt.s32 %p1, %r2, 0;
        @%p1 bra INNER;
        add.s32 %r1, %r1, 1;
        setp.lt.u32 %p2, %r1, 8;
        @%p2 bra OUTER;
        ret;
"""


def test_nested_loops():
    fn = fn_of(NESTED)
    blocks = build_cfg(fn)
    outer, inner = find_loops(fn, blocks)
    assert (outer.header_label, outer.depth, outer.parent) == ("OUTER", 1, None)
    assert (inner.header_label, inner.depth, inner.parent) == ("INNER", 2, "OUTER")
    assert inner.blocks < outer.blocks
    # lines: body starts on line 7; DECLS take 2 lines, NESTED starts with a blank line
    assert (outer.first_line, outer.last_line) == (12, 20)
    assert (inner.first_line, inner.last_line) == (14, 17)
    # inner: 10, 8, 6, 4, 2 -> 5 iterations; outer: 0..7 -> 8
    assert (outer.inferred_trip_count, inner.inferred_trip_count) == (8, 5)


@pytest.mark.parametrize(
    "body",
    [
        # bound from a register: not a constant
        "mov.u32 %r1, 0;\nL:\nadd.s32 %r1, %r1, 1;\nsetp.lt.s32 %p1, %r1, %r5;\n@%p1 bra L;\nret;",
        # counter stepped by a register
        "mov.u32 %r1, 0;\nL:\nadd.s32 %r1, %r1, %r6;\nsetp.lt.s32 %p1, %r1, 9;\n@%p1 bra L;\nret;",
        # initial value loaded from memory
        "ld.param.u32 %r1, [k_param_0];\nL:\nadd.s32 %r1, %r1, 1;\n"
        "setp.lt.s32 %p1, %r1, 9;\n@%p1 bra L;\nret;",
        # a second exit (break) makes the constant bound only an upper bound
        "mov.u32 %r1, 0;\nL:\nsetp.eq.s32 %p2, %r7, 3;\n@%p2 bra OUT;\nadd.s32 %r1, %r1, 1;\n"
        "setp.lt.s32 %p1, %r1, 9;\n@%p1 bra L;\nOUT:\nret;",
        # float comparison
        "mov.u32 %r1, 0;\nL:\nadd.s32 %r1, %r1, 1;\nsetp.lt.f32 %p1, %r1, 9;\n@%p1 bra L;\nret;",
        # never terminates (counts away from the bound)
        "mov.u32 %r1, 0;\nL:\nadd.s32 %r1, %r1, -1;\nsetp.lt.s32 %p1, %r1, 9;\n@%p1 bra L;\nret;",
    ],
)
def test_trip_count_unknown(body):
    fn = fn_of(body)
    (loop,) = find_loops(fn, build_cfg(fn))
    assert loop.inferred_trip_count is None


_CMP = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}
_CAP = 5000


def simulate_bottom(init, step, cmp, bound, negated, step_first):
    x, count = init, 0
    while count < _CAP:
        count += 1
        if step_first:
            x += step
        cond = _CMP[cmp](x, bound)
        if not step_first:
            x += step
        if cond == negated:  # the back edge is not taken
            return count
    return None


def simulate_top(init, step, cmp, bound):
    x, count = init, 0
    while count < _CAP:
        if _CMP[cmp](x, bound):
            return count
        x += step
        count += 1
    return None


@settings(max_examples=150, deadline=None)
@given(
    init=st.integers(-40, 40),
    step=st.integers(-4, 4),
    cmp=st.sampled_from(sorted(_CMP)),
    bound=st.integers(-40, 40),
    negated=st.booleans(),
    step_first=st.booleans(),
    swap=st.booleans(),
)
def test_bottom_tested_trip_count_matches_simulation(
    init, step, cmp, bound, negated, step_first, swap
):
    swapped = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
    setp = (
        f"setp.{swapped[cmp]}.s32 %p1, {bound}, %r1;"
        if swap
        else f"setp.{cmp}.s32 %p1, %r1, {bound};"
    )
    add = f"add.s32 %r1, %r1, {step};"
    latch = [add, setp] if step_first else [setp, add]
    guard = "@!%p1" if negated else "@%p1"
    body = "\n".join(
        [
            f"mov.u32 %r1, {init};",
            "LOOP:",
            "st.global.u32 [%rd1], %r1;",
            *latch,
            f"{guard} bra LOOP;",
            "ret;",
        ]
    )
    fn = fn_of(body)
    (loop,) = find_loops(fn, build_cfg(fn))
    expected = simulate_bottom(init, step, cmp, bound, negated, step_first)
    if expected is None:
        assert loop.inferred_trip_count is None or loop.inferred_trip_count > _CAP
    else:
        assert loop.inferred_trip_count == expected


@settings(max_examples=80, deadline=None)
@given(
    init=st.integers(-40, 40),
    step=st.integers(-4, 4),
    cmp=st.sampled_from(sorted(_CMP)),
    bound=st.integers(-40, 40),
)
def test_top_tested_trip_count_matches_simulation(init, step, cmp, bound):
    body = "\n".join(
        [
            f"mov.u32 %r1, {init};",
            "HEAD:",
            f"setp.{cmp}.s32 %p1, %r1, {bound};",
            "@%p1 bra EXIT;",
            "st.global.u32 [%rd1], %r1;",
            f"add.s32 %r1, %r1, {step};",
            "bra.uni HEAD;",
            "EXIT:",
            "ret;",
        ]
    )
    fn = fn_of(body)
    (loop,) = find_loops(fn, build_cfg(fn))
    assert loop.header_label == "HEAD"
    expected = simulate_top(init, step, cmp, bound)
    if expected is None:
        assert loop.inferred_trip_count is None or loop.inferred_trip_count > _CAP
    else:
        assert loop.inferred_trip_count == expected


def test_empty_function_and_unreachable_code():
    assert build_cfg(fn_of("")) == ()
    fn = fn_of("ret;\nDEAD:\nbra.uni DEAD;")
    blocks = build_cfg(fn)
    assert len(blocks) == 2 and blocks[0].successors == ()
    assert find_loops(fn, blocks) == ()  # the self-loop is unreachable


def test_branch_table_successors():
    fn = fn_of("ts: .branchtargets A, B;\nbrx.idx %r1, ts;\nA:\nret;\nB:\nret;")
    blocks = build_cfg(fn)
    assert set(blocks[0].successors) == {1, 2}
