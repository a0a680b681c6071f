"""Mutated real PTX never crashes the front end: it parses, or fails with a located domain error."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.errors import AmbiguousKernel, PTXSyntaxError, UnknownKernel
from perfmodel.ptx import build_cfg, find_loops, parse_module, tid_x_stride_bytes
from tests.perfmodel.ptx.conftest import NVCC_DIR, kernel

SOURCES = [
    (NVCC_DIR / name).read_text()
    for name in (
        "matmul_tiled.sm_75.ptx",
        "reduce_shfl.sm_75.ptx",
        "sm80_mma.sm_80.ptx",
        "grammar.sm_90a.ptx",  # cluster directives, .extern/.weak .func, call prototypes
    )
]
# characters that matter to the grammar, plus some that never appear in PTX
ALPHABET = st.sampled_from(list(';{}[]()<>,.:@!%+-|=_"/*\n\t 0123456789abcfxyzLp$#\\\x00é'))


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SOURCES))
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["del_chars", "ins_chars", "del_line", "dup_line", "swap"]))
        if kind in ("del_chars", "ins_chars"):
            joined = "\n".join(lines)
            i = draw(st.integers(0, len(joined)))
            if kind == "del_chars":
                joined = joined[:i] + joined[i + draw(st.integers(1, 12)) :]
            else:
                joined = (
                    joined[:i]
                    + "".join(draw(st.lists(ALPHABET, min_size=1, max_size=6)))
                    + joined[i:]
                )
            lines = joined.split("\n")
        else:
            i = draw(st.integers(0, len(lines) - 1))
            if kind == "del_line":
                del lines[i]
            elif kind == "dup_line":
                lines.insert(i, lines[i])
            else:
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def exercise(text: str) -> None:
    module = parse_module(text)
    names = module.entries
    module.entry(names[0] if names else None)
    if len(names) > 1:
        module.entry(None)
    for fn in module.functions:
        blocks = build_cfg(fn)
        find_loops(fn, blocks)
        for i, ins in enumerate(fn.instructions):
            if ins.state_space is not None:
                tid_x_stride_bytes(fn, i)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated())
def test_mutations_fail_only_with_domain_errors(text):
    try:
        exercise(text)
    except PTXSyntaxError as err:
        n_lines = text.count("\n") + 1
        assert 1 <= err.line <= n_lines
        assert err.column >= 1
        assert f"line {err.line}" in str(err)
    except (UnknownKernel, AmbiguousKernel) as err:
        assert err.field == "kernel"


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text(text):
    try:
        exercise(text)
    except PTXSyntaxError as err:
        assert err.line >= 1 and err.column >= 1
    except (UnknownKernel, AmbiguousKernel):
        pass


# ---- nested scopes: random block trees against an independent visibility oracle

_NAMES = ("A", "B", "C")


@st.composite
def _block(draw: st.DrawFn, depth: int = 0) -> list[tuple[str, object]]:
    """Items of one { } block: ("label", name), ("bra", name), ("ins", None), ("block", [...])."""
    kinds = ["label", "bra", "ins"] + (["block"] if depth < 3 else [])
    items: list[tuple[str, object]] = []
    declared: set[str] = set()
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(kinds))
        if kind == "block":
            items.append(("block", draw(_block(depth + 1))))
        elif kind == "ins":
            items.append(("ins", None))
        else:
            name = draw(st.sampled_from(_NAMES))
            if kind == "label":
                if name in declared:  # one declaration per block (checked separately)
                    continue
                declared.add(name)
            items.append((kind, name))
    return items


def _render(
    items: list[tuple[str, object]],
    lines: list[str],
    chain: list[dict[str, int]],
    branches: list[tuple[int, list[dict[str, int]], str]],
) -> None:
    """Append the block's lines; record each branch with the scopes it sees (innermost last).

    A block's labels are collected before its branches are resolved (labels are visible in the
    whole block), so ``chain`` holds dicts that are filled while rendering."""
    own: dict[str, int] = {}
    chain = [*chain, own]
    for kind, arg in items:
        if kind == "label":
            lines.append(f"{arg}:")
            own[str(arg)] = len(lines) + 6  # the kernel body starts at line 7 (conftest)
        elif kind == "bra":
            lines.append(f"bra.uni {arg};")
            branches.append((len(lines) + 6, chain, str(arg)))
        elif kind == "ins":
            lines.append("add.s32 %r1, %r1, 1;")
        else:
            lines.append("{")
            _render(arg, lines, chain, branches)  # type: ignore[arg-type]
            lines.append("}")


@settings(max_examples=300, deadline=None)
@given(tree=_block())
def test_nested_scopes_resolve_like_the_isa_says(tree):
    lines = [".reg .b32 %r<2>;"]
    branches: list[tuple[int, list[dict[str, int]], str]] = []
    _render(tree, lines, [], branches)
    lines.append("ret;")
    text = kernel("\n".join(lines))
    expected: list[tuple[int, str | None]] = []
    for line, chain, name in branches:
        target = None
        for depth in range(len(chain) - 1, -1, -1):  # innermost block declaring the name
            if name in chain[depth]:
                decl = chain[depth][name]
                target = name if depth == 0 else f"{name}@{decl}"
                break
        expected.append((line, target))
    refused = [line for line, target in expected if target is None]
    if refused:
        with pytest.raises(PTXSyntaxError) as info:
            parse_module(text)
        assert info.value.line == refused[0]  # the first branch that cannot see its label
        assert info.value.column == text.splitlines()[refused[0] - 1].index("bra") + 1
        return
    fn = parse_module(text).entry("k")
    got = [(i.line, i.branch_target) for i in fn.instructions if i.opcode == "bra"]
    assert got == expected
    for _, target in expected:
        assert target in fn.label_index
    # the CFG and loop analysis accept whatever the blocks make (back edges across scopes)
    blocks = build_cfg(fn)
    assert sum(b.end - b.start for b in blocks) == len(fn.instructions)
    find_loops(fn, blocks)
