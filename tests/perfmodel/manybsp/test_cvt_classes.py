"""Which row costs each PTX cvt form, and how the finer conversion rows fall back.

The classes follow the PTX ISA's type families (cvt names the destination type first) and
the Programming Guide's throughput rows: integer -> integer, conversions from and to 64-bit
types, 8/16/32-bit integer -> f32 (its own row where a profile measured it), and the other
float <-> integer / float <-> float conversions.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_profiles import default_profiles, get_profile
from perfmodel.manybsp import DeviceFigures, PredictRequest, device_from_profile, predict_kernel
from perfmodel.manybsp.classify import classify
from perfmodel.manybsp.frontend import ClassFigures
from perfmodel.manybsp.types import FunctionalUnit, InstructionCost
from perfmodel.ptx import parse_module

INTEGERS = ("u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64")
FLOATS = ("f16", "f32", "f64")
CVT_CLASSES = {"cvt", "cvt_int", "cvt_int_to_f32", "cvt_to_64bit", "cvt_from_64bit"}


def _bits(ty: str) -> int:
    return int(ty[1:])


def _register(ty: str) -> str:
    if ty == "f32":
        return "%f1"
    if ty == "f64":
        return "%fd1"
    return {8: "%rs1", 16: "%rs1", 32: "%r1", 64: "%rd1"}[_bits(ty)]


def _rounding(dest: str, src: str) -> list[str]:
    """The rounding modifier the PTX ISA asks of the form (none for exact conversions)."""
    if src in FLOATS and dest in INTEGERS:
        return ["rzi"]
    if dest in FLOATS and (src in INTEGERS or _bits(dest) < _bits(src)):
        return ["rn"]
    return []


def _ptx(body: str) -> str:
    return f""".version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p)
{{
\t.reg .pred %p<3>; .reg .b16 %rs<9>; .reg .b32 %r<9>; .reg .f32 %f<9>;
\t.reg .f64 %fd<9>; .reg .b64 %rd<9>;
{body}
\tret;
}}
"""


def _class_of(dest: str, src: str, extra: tuple[str, ...] = ()) -> tuple[str, str | None]:
    opcode = ".".join(["cvt", *_rounding(dest, src), *extra, dest, src])
    line = f"\t{opcode} {_register(dest)}, {_register(src)};"
    c = classify(parse_module(_ptx(line)).entry(None).instructions[0])
    assert c is not None
    return c.class_key, c.fallback_reason


types = st.sampled_from(INTEGERS + FLOATS)


@settings(max_examples=200, deadline=None)
@given(dest=types, src=types, ftz=st.booleans())
def test_integer_to_f32_is_exactly_the_new_row(dest: str, src: str, ftz: bool) -> None:
    extra = ("ftz",) if ftz and "f32" in (dest, src) and src in FLOATS else ()
    key, reason = _class_of(dest, src, extra)
    assert key in CVT_CLASSES and reason is None
    # the row is the I2F family: an f32 result of an integer no wider than 32 bits
    assert (key == "cvt_int_to_f32") == (dest == "f32" and src in INTEGERS and _bits(src) <= 32)


@pytest.mark.parametrize("src", ["u8", "u16", "u32", "s8", "s16", "s32"])
def test_the_reverse_conversion_stays_on_the_conversion_row(src: str) -> None:
    # f32 -> integer (F2I) was not measured: it keeps the Programming Guide's row
    assert _class_of("f32", src)[0] == "cvt_int_to_f32"
    assert _class_of(src, "f32")[0] == "cvt"


@pytest.mark.parametrize(
    ("dest", "src", "expected"),
    [
        ("f64", "s32", "cvt_to_64bit"),  # Table 1-2: from and to 64-bit types, DPU rate
        ("f32", "s64", "cvt_from_64bit"),
        ("f32", "u64", "cvt_from_64bit"),
        ("f16", "s32", "cvt"),  # not an f32 result
        ("f32", "f16", "cvt"),
        ("u32", "u16", "cvt_int"),
        ("u64", "u32", "cvt_int"),
    ],
)
def test_neighbouring_forms_keep_their_rows(dest: str, src: str, expected: str) -> None:
    assert _class_of(dest, src)[0] == expected


KERNEL = _ptx(
    "\tld.param.u64 %rd1, [p];\n"
    "\tmov.u32 %r1, %tid.x;\n"
    "\tcvt.rn.f32.u16 %f1, %rs1;\n"
    "\tcvt.rzi.u32.f32 %r2, %f1;\n"
    "\tadd.s32 %r3, %r2, %r1;"
)
I2F_LINE, F2I_LINE = (
    1 + KERNEL.splitlines().index(f"\t{ins};")
    for ins in ("cvt.rn.f32.u16 %f1, %rs1", "cvt.rzi.u32.f32 %r2, %f1")
)


def _conversions(figures: DeviceFigures) -> tuple[tuple[str, InstructionCost], ...]:
    """(class key, cost) of KERNEL's integer -> f32 and f32 -> integer conversions."""
    result = predict_kernel(
        PredictRequest(KERNEL, figures, grid=(4, 1, 1), block=(128, 1, 1), registers_per_thread=8)
    )
    assert not [w for w in result.warnings if f"line {I2F_LINE}:" in w or f"line {F2I_LINE}:" in w]
    rows = {c.line: (k, c) for k, c in zip(result.class_keys, result.costs, strict=True)}
    return rows[I2F_LINE], rows[F2I_LINE]


def _figures(cost: InstructionCost) -> tuple[object, ...]:
    return (cost.fu, cost.units_per_ws, cost.throughput_per_ws, cost.latency_cycles)


@pytest.mark.parametrize("device_id", sorted(default_profiles()))
def test_without_a_row_it_costs_what_the_conversion_row_costs(device_id: str) -> None:
    figures = device_from_profile(get_profile(device_id))
    own = figures.class_map()
    (i2f_key, i2f), (f2i_key, f2i) = _conversions(figures)
    if "cvt_int_to_f32" in own:
        assert i2f_key == "cvt_int_to_f32"
        return
    assert i2f_key == f2i_key == ("cvt" if "cvt" in own else "alu")
    assert _figures(i2f) == _figures(f2i)


@settings(max_examples=30, deadline=None)
@given(
    device_id=st.sampled_from(sorted(default_profiles())),
    per_scheduler=st.floats(0.5, 32.0),
    latency=st.integers(1, 40),
)
def test_a_row_of_its_own_costs_only_the_integer_to_f32_conversion(
    device_id: str, per_scheduler: float, latency: int
) -> None:
    base = device_from_profile(get_profile(device_id))
    row = ClassFigures(FunctionalUnit.SP, 16, per_scheduler, float(latency))
    figures = dataclasses.replace(
        base,
        classes=(*(c for c in base.classes if c[0] != "cvt_int_to_f32"), ("cvt_int_to_f32", row)),
    )
    (i2f_key, i2f), (_, f2i) = _conversions(figures)
    assert i2f_key == "cvt_int_to_f32"
    assert _figures(i2f) == (FunctionalUnit.SP, 16, per_scheduler, float(latency))
    assert _figures(f2i) == _figures(_conversions(base)[1][1])  # the reverse one unchanged
