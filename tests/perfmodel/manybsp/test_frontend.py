"""PTX front end of the predictor: classes, level-1 spans, trip counts, overrides, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_profiles import DeviceProfile, get_profile
from perfmodel.errors import ModelInputError, PTXSyntaxError, UnknownKernel
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel
from perfmodel.manybsp.classify import classify
from perfmodel.ptx import parse_module
from tests.perfmodel.manybsp.test_properties import kernel_ptx

DEV = device_from_profile(get_profile("gtx-760"))
NVCC_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "ptx" / "nvcc"


def _one(line: str) -> str:
    ptx = f""".version 7.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p)
{{
\t.reg .pred %p<3>; .reg .b32 %r<9>; .reg .f32 %f<9>; .reg .f64 %fd<9>; .reg .b64 %rd<9>;
\t{line};
\tret;
}}
"""
    c = classify(parse_module(ptx).entry(None).instructions[0])
    assert c is not None
    return c.class_key + ("!" if c.fallback_reason else "")


@pytest.mark.parametrize(
    ("instruction", "expected"),
    [
        ("add.f32 %f1, %f2, %f3", "alu"),  # Table 1-5 SPs rows
        ("mad.lo.s32 %r1, %r2, %r3, %r4", "alu"),
        ("setp.lt.s32 %p1, %r1, %r2", "alu_half_rate"),  # Table 1-6: T = 16 on Maxwell
        ("shl.b32 %r1, %r2, 1", "alu_half_rate"),
        ("fma.rn.f32 %f1, %f2, %f3, %f4", "fma_f32"),
        ("mov.u32 %r1, %tid.x", "special_register"),
        ("mov.u32 %r1, %nctaid.x", "alu"),  # Table 1-5: 16 cycles, not 32
        ("cvt.f64.f32 %fd1, %f1", "cvt_to_64bit"),
        ("cvt.rn.f32.f64 %f1, %fd1", "cvt_from_64bit"),
        ("cvta.to.global.u64 %rd1, %rd2", "cvta"),
        ("add.f64 %fd1, %fd2, %fd3", "dp_arith"),  # DPU
        ("fma.rn.f64 %fd1, %fd2, %fd3, %fd4", "dp_fma"),
        ("div.rn.f32 %f1, %f2, %f3", "sfu_div"),  # SFU
        ("rcp.rn.f32 %f1, %f2", "sfu_rcp"),
        ("sqrt.rn.f32 %f1, %f2", "sfu_sqrt"),
        ("ex2.approx.f32 %f1, %f2", "sfu_rcp!"),  # documented fallback, warned
        ("ld.global.f32 %f1, [%rd1]", "ld_global"),  # LDST, comm
        ("st.global.f32 [%rd1], %f1", "st_global"),
        ("ld.shared.f32 %f1, [%rd1]", "ld_shared"),
        ("st.shared.f32 [%rd1], %f1", "st_shared"),
        ("ld.param.u64 %rd1, [p]", "alu"),  # Table 1-5: ld.param on SPs
        ("atom.global.add.u32 %r1, [%rd1], 1", "ld_global!"),
        ("shfl.sync.down.b32 %r1, %r2, 1, 31, -1", "alu!"),
        ("popc.b32 %r1, %r2", "alu_half_rate!"),
        ("bar.sync 0", "bar_sync"),
        ("@%p1 bra $L1", "branch"),
        ("bra.uni $L1", "branch_uniform"),
    ],
)
def test_classification_table(instruction: str, expected: str) -> None:
    if "bra" in instruction:
        instruction = instruction + ";\n$L1:\n\tadd.s32 %r1, %r1, 1"
    assert _one(instruction) == expected


def _req(ptx: str, **kw: object) -> PredictRequest:
    base: dict[str, object] = {"ptx": ptx, "device": DEV, "grid": (4, 1, 1)}
    base.update(block=(128, 1, 1), registers_per_thread=16)
    base.update(kw)
    return PredictRequest(**base)  # type: ignore[arg-type]


def test_unknown_loop_label_names_the_field() -> None:
    with pytest.raises(ModelInputError) as info:
        predict_kernel(_req(kernel_ptx(), loop_trip_counts={"NOPE": 3}))
    assert info.value.field == "loop_trip_counts.NOPE" and "LOOP" in info.value.reason


def test_negative_trip_count_is_refused() -> None:
    with pytest.raises(ModelInputError) as info:
        predict_kernel(_req(kernel_ptx(), loop_trip_counts={"LOOP": -1}))
    assert info.value.field == "loop_trip_counts.LOOP"


def test_unknown_trip_count_defaults_to_one_with_a_warning() -> None:
    result = predict_kernel(_req(kernel_ptx()))
    assert any("LOOP" in w and "assuming 1" in w for w in result.warnings)
    # before the loop, the loop, after it: three level-1 supersteps, each run once
    assert [s.iterations for s in result.level1] == [1, 1, 1]
    with_trips = predict_kernel(_req(kernel_ptx(), loop_trip_counts={"LOOP": 5}))
    assert [s.iterations for s in with_trips.level1] == [1, 5, 1]


def test_memory_override_must_name_a_memory_line() -> None:
    with pytest.raises(ModelInputError) as info:
        predict_kernel(_req(kernel_ptx(), memory_transactions={1: 4}))
    assert info.value.field == "memory_transactions.1"


def test_override_replaces_the_inferred_n_ma() -> None:
    ptx = kernel_ptx()
    line = next(i + 1 for i, t in enumerate(ptx.splitlines()) if "ld.global" in t)
    result = predict_kernel(_req(ptx, memory_transactions={line: 7}))
    k = next(i for i, c in enumerate(result.costs) if c.line == line)
    assert (result.costs[k].n_ma, result.n_ma_inferred[k]) == (7, False)


def test_block_larger_than_the_device_allows() -> None:
    with pytest.raises(ModelInputError) as info:
        predict_kernel(_req(kernel_ptx(), block=(32, 32, 2)))
    assert info.value.field == "launch.block"


def test_registers_that_do_not_fit_an_sm() -> None:
    with pytest.raises(ModelInputError) as info:
        predict_kernel(_req(kernel_ptx(), block=(1024, 1, 1), registers_per_thread=63 * 2))
    assert info.value.field == "resources.registers_per_thread"


def test_not_ptx_names_line_and_column() -> None:
    with pytest.raises(PTXSyntaxError) as info:
        predict_kernel(_req("int main() { return 0; }"))
    assert (info.value.line, info.value.column) == (1, 1)


def test_unknown_entry() -> None:
    with pytest.raises(UnknownKernel):
        predict_kernel(_req(kernel_ptx(), kernel="other"))


def test_registers_required_without_ptxas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)  # as if ptxas were absent
    with pytest.raises(ModelInputError) as info:
        predict_kernel(_req(kernel_ptx(), registers_per_thread=None))
    assert info.value.field == "resources.registers_per_thread"
    assert "ptxas is not on PATH" in str(info.value)


@pytest.mark.nvcc
def test_registers_from_ptxas_when_present() -> None:
    import shutil

    if shutil.which("ptxas") is None:
        pytest.skip("ptxas not on PATH")
    result = predict_kernel(_req(kernel_ptx(), registers_per_thread=None))
    assert result.registers_source.startswith("ptxas -v")
    assert 1 <= result.registers_per_thread <= 255


@pytest.mark.parametrize("path", sorted(NVCC_DIR.glob("*.ptx")), ids=lambda p: p.name)
def test_nvcc_modules_are_analysed(path: Path) -> None:
    """Checked-in nvcc output (sm_75..sm_90, cp.async, mma, shfl, atomics, f64): every entry
    is predicted; opcodes without a table row are costed by the fallback and warned about."""
    text = path.read_text()
    for entry in parse_module(text).entries:
        result = predict_kernel(_req(text, kernel=entry, block=(256, 1, 1)))
        assert result.estimate.kernel_exec_cycle > DEV.device.block_launch_overhead_cycles
        assert len(result.costs) == len(result.rows) == len(result.class_keys) > 0
        for cost, key in zip(result.costs, result.class_keys, strict=True):
            if key in ("alu", "fma_f32") and cost.opcode.startswith(("shfl", "mma", "wmma")):
                assert any(w.startswith(f"line {cost.line}:") for w in result.warnings)


_SCALARS = (
    "warp_size n_ws n_du issue_cycle mem_lat_cycles mu max_threads_per_sm registers_per_sm "
    "shared_memory_per_sm_bytes segment_bytes warp_launch_overhead_cycles "
    "block_launch_overhead_cycles"
).split()


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(_SCALARS),
    st.floats(min_value=1e-3, max_value=1e7, allow_nan=False),
    st.floats(min_value=1e-3, max_value=64),
    st.lists(st.integers(1, 1024), min_size=1, max_size=3),
)
def test_inline_figures_never_crash(
    name: str, value: float, units: float, bar_threads: list[int]
) -> None:
    """Any schema-valid inline profile either predicts or raises a ModelInputError naming the
    figure (a 422), never another exception (a 500)."""
    raw = get_profile("gtx-760").model_dump()
    mb = raw["many_bsp"]
    mb[name]["value"] = value
    mb["instruction_classes"]["ld_shared"]["units_per_ws"] = units
    mb["bar_sync_overhead"] = [
        {"threads_per_block": t, "overhead_cycles": 100.0, "source": "test"} for t in bar_threads
    ]
    profile = DeviceProfile.model_validate(raw)
    try:
        figs = device_from_profile(profile, field_prefix="device_params")
        result = predict_kernel(_req(kernel_ptx(), device=figs, loop_trip_counts={"LOOP": 3}))
    except ModelInputError as exc:
        assert exc.field.startswith(("device_params.", "launch.", "resources."))
    else:
        assert result.estimate.kernel_exec_cycle >= 0
