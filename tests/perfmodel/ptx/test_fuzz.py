"""Mutated real PTX never crashes the front end: it parses, or fails with a located domain error."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.errors import AmbiguousKernel, PTXSyntaxError, UnknownKernel
from perfmodel.ptx import build_cfg, find_loops, parse_module, tid_x_stride_bytes
from tests.perfmodel.ptx.conftest import NVCC_DIR

SOURCES = [
    (NVCC_DIR / name).read_text()
    for name in ("matmul_tiled.sm_75.ptx", "reduce_shfl.sm_75.ptx", "sm80_mma.sm_80.ptx")
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
