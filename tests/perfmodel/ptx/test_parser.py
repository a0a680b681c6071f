"""Parser: one case per construct nvcc (or a hand writer) puts in a module."""

from __future__ import annotations

import pytest

from perfmodel.errors import AmbiguousKernel, PTXSyntaxError, UnknownKernel
from perfmodel.ptx import Instruction, parse_module
from tests.perfmodel.ptx.conftest import HEADER, kernel


def only(body: str) -> Instruction:
    fn = parse_module(kernel(".reg .b32 %r<9>;\n.reg .pred %p<3>;\n" + body)).entry(None)
    assert len(fn.instructions) == 1
    return fn.instructions[0]


@pytest.mark.parametrize(
    ("text", "opcode", "modifiers", "kinds", "defs", "uses"),
    [
        # plain three-operand ALU instruction
        ("add.s32 %r1, %r2, %r3;", "add", ("s32",), ("register",) * 3, ("%r1",), ("%r2", "%r3")),
        # load with a state space, cache qualifier and a displacement
        (
            "ld.global.nc.f32 %r1, [%rd8+4];",
            "ld",
            ("global", "nc", "f32"),
            ("register", "address"),
            ("%r1",),
            ("%rd8",),
        ),
        # store: the address's register is read, nothing is written
        (
            "st.shared.u32 [%r2], %r3;",
            "st",
            ("shared", "u32"),
            ("address", "register"),
            (),
            ("%r2", "%r3"),
        ),
        # vector destination of a vector load
        (
            "ld.global.v2.f32 {%r1, %r2}, [%rd1];",
            "ld",
            ("global", "v2", "f32"),
            ("vector", "address"),
            ("%r1", "%r2"),
            ("%rd1",),
        ),
        # special register source
        ("mov.u32 %r1, %tid.x;", "mov", ("u32",), ("register", "special"), ("%r1",), ("%tid.x",)),
        # float immediates in hex form
        ("mov.f32 %r1, 0f3F800000;", "mov", ("f32",), ("register", "immediate"), ("%r1",), ()),
        # negative immediate and duplicated source (uses are listed once)
        (
            "mad.lo.s32 %r1, %r2, %r2, -1;",
            "mad",
            ("lo", "s32"),
            ("register",) * 3 + ("immediate",),
            ("%r1",),
            ("%r2",),
        ),
        # setp with a predicate pair destination p|q
        (
            "setp.lt.s32 %p1|%p2, %r1, 4;",
            "setp",
            ("lt", "s32"),
            ("register", "register", "immediate"),
            ("%p1", "%p2"),
            ("%r1",),
        ),
        # barrier with no destination
        ("bar.sync 0;", "bar", ("sync",), ("immediate",), (), ()),
        # atomics return the old value and read address and operand
        (
            "atom.global.add.u32 %r1, [%rd2], %r3;",
            "atom",
            ("global", "add", "u32"),
            ("register", "address", "register"),
            ("%r1",),
            ("%rd2", "%r3"),
        ),
        # modifiers with '::' (PTX 7.x+ qualifiers)
        (
            "ld.shared::cta.u32 %r1, [%r2];",
            "ld",
            ("shared::cta", "u32"),
            ("register", "address"),
            ("%r1",),
            ("%r2",),
        ),
        # cp.async: both addresses are read; a size immediate
        (
            "cp.async.ca.shared.global [%r1], [%rd2], 16;",
            "cp",
            ("async", "ca", "shared", "global"),
            ("address", "address", "immediate"),
            (),
            ("%r1", "%rd2"),
        ),
        # shuffle with a value|predicate destination pair
        (
            "shfl.sync.down.b32 %r1|%p1, %r2, 16, 31, -1;",
            "shfl",
            ("sync", "down", "b32"),
            ("register", "register") + ("immediate",) * 3,
            ("%r1", "%p1"),
            ("%r2",),
        ),
        # ret: no operands at all
        ("ret;", "ret", (), (), (), ()),
    ],
)
def test_instruction_table(text, opcode, modifiers, kinds, defs, uses):
    ins = only(text)
    assert ins.opcode == opcode
    assert ins.modifiers == modifiers
    assert ins.full_opcode == ".".join((opcode, *modifiers))
    assert tuple(o.kind for o in ins.operands) == kinds
    assert ins.defs == defs
    assert ins.uses == uses
    assert ins.text == text.rstrip(";")


@pytest.mark.parametrize(
    ("text", "space"),
    [
        ("ld.global.nc.f32 %r1, [%rd1];", "global"),  # explicit space
        ("ld.f32 %r1, [%rd1];", "generic"),  # no space named: generic addressing
        ("st.shared::cta.u32 [%r1], %r2;", "shared"),  # '::cta' refinement reported as shared
        ("cp.async.ca.shared.global [%r1], [%rd2], 16;", "global"),  # copy: the source space
        ("ld.param.u64 %rd1, [k_param_0];", "param"),  # kernel parameter
        ("cp.async.commit_group;", None),  # memory opcode without an access
        ("add.s32 %r1, %r2, 1;", None),  # not a memory instruction
    ],
)
def test_state_space(text, space):
    assert only(text).state_space == space


@pytest.mark.parametrize(
    ("text", "guard", "negated", "target"),
    [
        ("@%p1 bra $L__BB0_2;", "%p1", False, "$L__BB0_2"),  # guarded branch
        ("@!%p1 bra $L__BB0_2;", "%p1", True, "$L__BB0_2"),  # negated guard
        ("bra.uni $L__BB0_2;", None, False, "$L__BB0_2"),  # unconditional, .uni
    ],
)
def test_guards_and_branches(text, guard, negated, target):
    body = f".reg .pred %p<3>;\n{text}\n$L__BB0_2:\nret;"
    fn = parse_module(kernel(body)).entry(None)
    ins = fn.instructions[0]
    assert (ins.guard, ins.guard_negated, ins.branch_target, ins.is_branch) == (
        guard,
        negated,
        target,
        True,
    )
    assert ins.operands[0].kind == "label"
    assert fn.label_index == {"$L__BB0_2": 1}
    assert fn.instructions[1].labels == ("$L__BB0_2",)
    if guard is not None:
        assert guard in ins.uses


def test_line_and_column_of_opcode():
    # the body starts on line 7 (see conftest.kernel); the opcode follows a guard and a tab
    fn = parse_module(kernel(".reg .pred %p<2>;\n\t@%p1 bra \tL1;\nL1:\n  ret;")).entry(None)
    assert (fn.instructions[0].line, fn.instructions[0].column) == (8, 7)
    assert (fn.instructions[1].line, fn.instructions[1].column) == (10, 3)


def test_address_offsets():
    # "+-12" is how nvcc writes a negative displacement
    fn = parse_module(
        kernel(
            "ld.global.f32 %f1, [%rd2+-12];\nld.global.f32 %f1, [%rd2+0x10];\nld.f32 %f1, [tab+8];"
        )
    ).entry(None)
    assert [i.operands[1].offset for i in fn.instructions] == [-12, 16, 8]
    assert [i.operands[1].registers for i in fn.instructions] == [("%rd2",), ("%rd2",), ()]


def test_comments_strings_and_directives_ignored():
    body = """
    .reg .b32 %r<3>; // trailing comment with ; and {
    /* block comment
       over lines ; } */
    .loc 1 5 3
    .pragma "nounroll";
    mov.u32 %r1, 1; /* inline */ add.s32 %r2, %r1, 1;
    """
    fn = parse_module(kernel(body)).entry(None)
    assert [i.opcode for i in fn.instructions] == ["mov", "add"]
    # both on line 13 of the text; the comment did not shift columns
    assert [i.line for i in fn.instructions] == [13, 13]
    assert fn.instructions[1].column == 34


def test_file_directive_with_slashes_in_string():
    text = HEADER + '.file 1 "C://dir/x.cu"\n.visible .entry k()\n{\nret;\n}\n'
    assert parse_module(text).entry("k").instructions[0].opcode == "ret"


def test_scoped_call_block_and_func():
    text = (
        HEADER
        + ".func (.param .b32 func_retval0) f(.param .b32 f_param_0)\n{\n"
        + ".reg .b32 %r<3>;\nld.param.b32 %r1, [f_param_0];\n"
        + "st.param.b32 [func_retval0], %r1;\nret;\n}\n"
        + ".visible .entry k(.param .u32 k_param_0)\n.maxntid 128, 1, 1\n.minnctapersm 2\n{\n"
        + ".reg .b32 %r<4>;\nld.param.u32 %r1, [k_param_0];\n"
        + "{ // callseq 0\n.reg .b32 temp_param_reg;\n.param .b32 param0;\n"
        + "st.param.b32 [param0], %r1;\n.param .b32 retval0;\n"
        + "call.uni (retval0),\nf,\n(\nparam0\n);\nld.param.b32 %r2, [retval0];\n"
        + "} // callseq 0\nret;\n}\n"
    )
    m = parse_module(text)
    assert [f.name for f in m.functions] == ["f", "k"]
    assert [f.is_entry for f in m.functions] == [False, True]
    k = m.entry(None)
    assert k.params == ("k_param_0",)
    assert k.tuning == {"maxntid": (128, 1, 1), "minnctapersm": (2,)}
    call = next(i for i in k.instructions if i.opcode == "call")
    assert [o.text for o in call.operands][1] == "f"
    assert call.line == 23  # a call spread over lines is located by its opcode
    assert "temp_param_reg" in k.register_declarations


@pytest.mark.parametrize(
    ("decls", "shared", "local"),
    [
        # two demoted 16x16 float tiles
        (".shared .align 4 .b8 a[1024];\n.shared .align 4 .b8 b[1024];", 2048, 0),
        # typed, multi-dimensional, vector element
        (".shared .align 16 .v4 .f32 v[2][8];", 256, 0),
        # alignment padding between a 1-byte and an 8-byte variable
        (".shared .u8 c;\n.shared .align 8 .f64 d;", 16, 0),
        # extern dynamic shared memory has no static size
        (".extern .shared .align 16 .b8 dyn[];", 0, 0),
        # local depot
        (".local .align 8 .b8 __local_depot0[40];", 0, 40),
    ],
)
def test_declared_bytes(decls, shared, local):
    fn = parse_module(kernel(decls + "\nret;")).entry(None)
    assert (fn.shared_bytes, fn.local_bytes) == (shared, local)


def test_module_scope_shared_counts_for_functions_using_it():
    text = (
        HEADER
        + ".shared .align 4 .b8 buf[512];\n.global .align 4 .u32 g[3] = {1, 2, 3};\n"
        + ".visible .entry uses()\n{\n.reg .b32 %r<2>;\nmov.u32 %r1, buf;\nret;\n}\n"
        + ".visible .entry ignores()\n{\nret;\n}\n"
    )
    m = parse_module(text)
    assert m.module_shared_bytes == 512
    assert m.entry("uses").shared_bytes == 512
    assert m.entry("ignores").shared_bytes == 0


def test_register_declarations():
    fn = parse_module(
        kernel(".reg .pred %p<4>;\n.reg .b32 %r<30>;\n.reg .f32 %f<8>, %g<2>;\n.reg .b64 x;\nret;")
    ).entry(None)
    assert fn.register_declarations == {"%p": 4, "%r": 30, "%f": 8, "%g": 2, "x": 1}


def test_module_directives():
    m = parse_module(".version 7.8\n.target sm_86, debug\n.address_size 64\n")
    assert (m.version, m.target, m.address_size, m.functions) == ("7.8", "sm_86", 64, ())
    # .address_size defaults to 32 (PTX ISA)
    assert parse_module(".version 6.4\n.target sm_61\n").address_size == 32


def test_entry_selection():
    two = HEADER + ".entry a()\n{\nret;\n}\n.entry b()\n{\nret;\n}\n"
    m = parse_module(two)
    assert m.entry("b").name == "b"
    with pytest.raises(AmbiguousKernel) as amb:
        m.entry(None)
    assert amb.value.entries == ("a", "b")
    with pytest.raises(UnknownKernel) as unk:
        m.entry("c")
    assert unk.value.entries == ("a", "b") and "a, b" in str(unk.value)
    with pytest.raises(UnknownKernel):
        parse_module(HEADER).entry(None)


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        # not PTX at all
        ("int main() { return 0; }", 1, 1, "directive"),
        # empty text
        ("", 1, 1, "empty"),
        # missing .target
        (".version 8.0\n", 1, 1, ".target"),
        # a statement before .version
        (".target sm_80\n.version 8.0\n", 1, 1, ".version"),
        # bad .version value
        (".version eight\n.target sm_80\n", 1, 1, "major.minor"),
        # unterminated block comment, reported where it starts
        (HEADER + "/* never closed\n", 5, 1, "block comment"),
        # garbage operand inside a kernel (line 7 is the first body line)
        (kernel("add.s32 %r1, %r2 %r3;"), 7, 1, "cannot read operand"),
        # instruction without ';' before the closing brace
        (kernel("ret"), 7, 1, "';'"),
        # unbalanced brackets in an address
        (kernel("ld.global.f32 %f1, [%rd1;"), 7, 1, "unbalanced"),
        # unknown directive in a body
        (kernel(".bogus 1;"), 7, 1, ".bogus"),
        # duplicated label
        (kernel("L:\nret;\nL:\nret;"), 9, 1, "twice"),
        # unclosed function body
        (HEADER + ".entry k()\n{\nret;\n", 6, 1, "never closed"),
        # the same kernel defined twice
        (HEADER + ".entry k()\n{\nret;\n}\n.entry k()\n{\nret;\n}\n", 9, 8, "twice"),
        # junk between the parameter list and the body
        (HEADER + ".entry k() int x\n{\nret;\n}\n", 5, 8, "unexpected text"),
        # C code inside a body
        (kernel("  x = x + 1;"), 7, 3, "cannot read operand"),
        # a branch to a label the function never declares (ptxas refuses it)
        (kernel("bra L9;\nret;"), 7, 1, "'L9' is not a label"),
        # ... including a label of another function
        (
            HEADER + ".entry a()\n{\nA:\nret;\n}\n.entry b()\n{\n\tbra.uni A;\n}\n",
            12,
            2,
            "'A' is not a label",
        ),
    ],
)
def test_syntax_errors_name_line_and_column(text, line, column, fragment):
    with pytest.raises(PTXSyntaxError) as err:
        parse_module(text)
    assert (err.value.line, err.value.column) == (line, column)
    assert fragment in str(err.value)
    assert err.value.field == "ptx"


# Written in the style of CUDA 8-10 nvcc output for sm_30/sm_61 (BBn_m labels, .s32 registers,
# 32-bit addresses); the CUDA 13 on this machine cannot target those architectures any more.
OLD_STYLE = """//
// Generated by NVIDIA NVVM Compiler
//
.version 6.0
.target sm_30
.address_size 32

	// .globl	_Z5scalePfi

.visible .entry _Z5scalePfi(
	.param .u32 _Z5scalePfi_param_0,
	.param .u32 _Z5scalePfi_param_1
)
.reqntid 128, 1, 1
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<3>;
	.reg .s32 	%r<9>;


	ld.param.u32 	%r2, [_Z5scalePfi_param_0];
	ld.param.u32 	%r3, [_Z5scalePfi_param_1];
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %ctaid.x;
	mov.u32 	%r6, %tid.x;
	mad.lo.s32 	%r1, %r4, %r5, %r6;
	setp.ge.s32	%p1, %r1, %r3;
	@%p1 bra 	BB0_2;

	cvta.to.global.u32 	%r7, %r2;
	shl.b32 	%r8, %r1, 2;
	add.s32 	%r9, %r7, %r8;
	ld.global.f32 	%f1, [%r9];
	add.f32 	%f2, %f1, %f1;
	st.global.f32 	[%r9], %f2;

BB0_2:
	ret;
}
"""


def test_old_nvcc_style_module():
    m = parse_module(OLD_STYLE)
    assert (m.version, m.target, m.address_size) == ("6.0", "sm_30", 32)
    fn = m.entry("_Z5scalePfi")
    assert fn.tuning == {"reqntid": (128, 1, 1)}
    assert fn.params == ("_Z5scalePfi_param_0", "_Z5scalePfi_param_1")
    assert fn.label_index == {"BB0_2": 14}
    assert fn.instructions[7].branch_target == "BB0_2"
    # old nvcc separated some opcodes from their operands by a tab only
    assert fn.instructions[6].operands[0].text == "%p1"


def test_module_level_declarations_and_sections():
    text = (
        HEADER
        + ".extern .func (.param .b32 func_retval0) vprintf(.param .b64 a, .param .b64 b);\n"
        + ".weak .func w()\n{\nret;\n}\n"
        + ".const .align 4 .b8 table[8] = {1, 0, 0, 0, 2, 0, 0, 0};\n"
        + ".global .align 8 .u64 ptrs[2] = {generic(table), 0};\n"
        + ".extern .shared .align 16 .b8 dyn[];\n"
        + ".visible .entry k()\n{\n.reg .b64 %rd<3>;\n.reg .b32 %r<3>;\n"
        + "prototype_0 : .callprototype ()_ (.param .b32 _);\n"
        + "mov.u64 %rd1, dyn;\nld.const.u32 %r1, [table+4];\n"
        + "{\n.reg .pred p;\nsetp.eq.u32 p, %r1, 2;\n@p bra.uni DONE;\n}\n"
        + "DONE:\nret;\n}\n"
        + '.section .debug_str\n{\n$L__info_string0:\n.b8 107 0 // "k"\n}\n'
    )
    m = parse_module(text)
    assert [f.name for f in m.functions] == ["w", "k"]
    k = m.entry(None)
    assert k.shared_bytes == 0  # only the dynamically sized extern array is used
    # a register declared in a nested scope without '%' is still a register; it is named by
    # the line of its declaration (scoped names, perfmodel/ptx/scopes.py)
    p = f"p@{text.splitlines().index('.reg .pred p;') + 1}"
    setp, bra = k.instructions[2], k.instructions[3]
    assert setp.defs == (p,) and bra.guard == p and bra.uses == (p,)
    # the prototype label does not name a code position
    assert k.label_index == {"DONE": 4}
    assert k.instructions[1].operands[1].offset == 4


def test_garbage_collector_state_is_restored():
    import gc

    assert gc.isenabled()
    parse_module(HEADER)
    with pytest.raises(PTXSyntaxError):
        parse_module("not ptx")
    assert gc.isenabled()
    gc.disable()
    try:
        parse_module(HEADER)
        assert not gc.isenabled()  # a caller's choice is left alone
    finally:
        gc.enable()
