"""Scopes of { } blocks (PTX ISA: labels and .reg variables of a block are local to it).

Expected values are written from the PTX text of each case (which declaration a name can see),
not read back from the parser.
"""

from __future__ import annotations

import pytest

from perfmodel.errors import PTXSyntaxError
from perfmodel.ptx import build_cfg, find_loops, parse_module
from tests.perfmodel.ptx.conftest import kernel

# CUTLASS's barrier wait (cutlass/arch/barrier.h, ClusterBarrier::wait), as nvcc 13 emits it
# inside a kernel: every copy declares P1 and the labels LAB_WAIT and DONE again.
WAIT = """\
{
.reg .pred P1;
LAB_WAIT:
mbarrier.try_wait.parity.shared::cta.b64 P1, [%r1], %r2, %r3;
@P1 bra DONE;
bra LAB_WAIT;
DONE:
}"""


def body_lines(text: str) -> list[str]:
    return text.splitlines()


def line_of(text: str, needle: str, occurrence: int = 0) -> int:
    """1-based line of the ``occurrence``-th line equal to ``needle`` (stripped)."""
    hits = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.strip() == needle]
    return hits[occurrence]


def test_cutlass_wait_blocks_reuse_labels_and_predicates():
    text = kernel(f".reg .b32 %r<4>;\n{WAIT}\nadd.s32 %r1, %r1, 1;\n{WAIT}\nret;")
    fn = parse_module(text).entry("k")
    first = line_of(text, "LAB_WAIT:", 0)
    second = line_of(text, "LAB_WAIT:", 1)
    # each block's labels and predicate are its own
    assert f"LAB_WAIT@{first}" in fn.label_index and f"LAB_WAIT@{second}" in fn.label_index
    p1 = line_of(text, ".reg .pred P1;", 0)
    p2 = line_of(text, ".reg .pred P1;", 1)
    waits = [i for i in fn.instructions if i.opcode == "mbarrier"]
    assert [w.defs for w in waits] == [(f"P1@{p1}",), (f"P1@{p2}",)]
    # each "@P1 bra DONE" reads its block's P1 and jumps to its block's DONE
    guarded = [i for i in fn.instructions if i.opcode == "bra" and i.guard]
    done = [line_of(text, "DONE:", k) for k in (0, 1)]
    assert [(g.guard, g.branch_target) for g in guarded] == [
        (f"P1@{p1}", f"DONE@{done[0]}"),
        (f"P1@{p2}", f"DONE@{done[1]}"),
    ]
    # the back edges make two spin loops, one per block, keyed by their own header
    loops = find_loops(fn, build_cfg(fn))
    assert sorted(lp.header_label for lp in loops) == [f"LAB_WAIT@{first}", f"LAB_WAIT@{second}"]


# (body, name of the label the branch must reach: "name@<line of its declaration line>" is
# computed by the test from the text; None for a function-scope label)
@pytest.mark.parametrize(
    ("body", "target_decl"),
    [
        # a nested block sees the labels of the function body, declared before or after it
        ("{\nbra.uni OUT;\n}\nOUT:\nret;", "OUT:"),
        ("OUT:\n{\nbra.uni OUT;\n}\nret;", "OUT:"),
        # an inner label of the same name shadows the outer one
        ("L:\n{\nL:\nbra.uni L;\n}\nret;", "L:#1"),
        # two levels deep: the label of the middle block is visible in the inner one
        ("{\nM:\n{\nbra.uni M;\n}\n}\nret;", "M:"),
        # a label declared after the nested block closes, in the enclosing block
        ("{\n{\nbra.uni AFTER;\n}\nAFTER:\nret;\n}", "AFTER:"),
    ],
    ids=["outer-after", "outer-before", "shadowing", "two-levels", "enclosing-after"],
)
def test_branch_resolves_to_innermost_visible_label(body, target_decl):
    text = kernel(body)
    fn = parse_module(text).entry("k")
    (bra,) = [i for i in fn.instructions if i.opcode == "bra"]
    name, _, nth = target_decl.partition("#")
    decl_line = line_of(text, name, int(nth or 0))
    label = name[:-1]
    # function-scope labels keep their names; nested ones carry their declaration line
    expected = f"{label}@{decl_line}" if _inside_block(text, decl_line) else label
    assert bra.branch_target == expected
    assert expected in fn.label_index


def _inside_block(text: str, line: int) -> bool:
    """Independent brace count: is ``line`` inside a { } block of the kernel body?"""
    lines = text.splitlines()
    start = lines.index("{")  # the body's own brace (conftest.kernel)
    depth = 0
    for ln in lines[start + 1 : line - 1]:
        depth += ln.count("{") - ln.count("}")
    return depth > 0


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        # sibling blocks: the second cannot see the first's label
        ("{\nIN:\nret;\n}\n{\nbra.uni IN;\n}\nret;", "bra.uni IN;"),
        # the function body cannot see a nested label
        ("{\nIN:\nret;\n}\nbra.uni IN;", "bra.uni IN;"),
        # guarded branch into a block closed before it
        (".reg .pred %p;\n{\nX:\nret;\n}\n@%p bra X;\nret;", "@%p bra X;"),
    ],
    ids=["sibling", "outer-to-inner", "guarded"],
)
def test_branch_to_a_label_of_another_block_is_refused_at_the_branch(body, needle):
    text = kernel(body)
    with pytest.raises(PTXSyntaxError) as info:
        parse_module(text)
    err = info.value
    assert err.line == line_of(text, needle)
    assert err.column == text.splitlines()[err.line - 1].index("bra") + 1
    assert "another { } block" in err.message


@pytest.mark.parametrize(
    "body",
    [
        "L:\nret;\nL:\nret;",  # twice in the function body
        "{\nL:\nret;\nL:\nret;\n}",  # twice in one nested block
    ],
    ids=["function-scope", "nested"],
)
def test_label_defined_twice_in_one_block_is_refused(body):
    text = kernel(body)
    with pytest.raises(PTXSyntaxError) as info:
        parse_module(text)
    assert info.value.line == line_of(text, "L:", 1)


def test_sibling_and_nested_redefinitions_are_accepted():
    text = kernel("L:\n{\nL:\n{\nL:\nret;\n}\n}\n{\nL:\nret;\n}\nret;")
    fn = parse_module(text).entry("k")
    decls = [i + 1 for i, ln in enumerate(text.splitlines()) if ln == "L:"]
    assert set(fn.label_index) == {"L"} | {f"L@{n}" for n in decls[1:]}


def test_registers_of_a_block_shadow_and_do_not_leak():
    text = kernel(
        ".reg .b32 %r<3>;\n.reg .pred p;\n"
        "{\n.reg .pred p;\n.reg .b32 %r<2>;\n"
        "setp.eq.s32 p, %r1, 0;\nmov.b32 %r2, %r1;\n}\n"
        "setp.eq.s32 p, %r1, 1;\nret;"
    )
    fn = parse_module(text).entry("k")
    inner_p = line_of(text, ".reg .pred p;", 1)
    inner_r = line_of(text, ".reg .b32 %r<2>;")
    setp_in, mov_in, setp_out = fn.instructions[:3]
    # inside: p and %r1 are the block's; %r2 is not declared there (%r<2> is %r0, %r1)
    assert setp_in.defs == (f"p@{inner_p}",)
    assert setp_in.uses == (f"%r1@{inner_r}",)
    assert mov_in.defs == ("%r2",) and mov_in.uses == (f"%r1@{inner_r}",)
    # after the block: the function's own p and %r1
    assert setp_out.defs == ("p",) and setp_out.uses == ("%r1",)


def test_unbalanced_block_braces_are_refused():
    with pytest.raises(PTXSyntaxError):
        parse_module(kernel("{\nret;"))
