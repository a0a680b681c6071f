"""Launch-evaluated analysis: loop trip counts from ``kernel_args``, guards that send whole
blocks out, and the lanes of a warp's access, each checked against a brute-force reference
(a straight-line interpretation of the PTX, or a count over the lanes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from device_profiles import get_profile
from perfmodel.errors import ModelInputError
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel
from perfmodel.manybsp.memory import warp_access
from perfmodel.ptx import build_cfg, find_loops, parse_module
from perfmodel.ptx.block_classes import block_classes
from perfmodel.ptx.linear import LinearForm, LinearValues
from tests.perfmodel.ptx_interpreter import run_thread

PTX = (
    Path(__file__).resolve().parents[2] / "fixtures" / "ptx" / "nvcc" / "kernel_args.sm_80.ptx"
).read_text()
MODULE = parse_module(PTX)
SUM = MODULE.entry("strided_sum")
GUARD = MODULE.entry("guarded_scale")
N, K = "strided_sum_param_2", "strided_sum_param_3"
#: instructions guarded_scale runs up to its bounds check's branch (3 ld.param, 3 mov, mad,
#: setp, bra): a thread that runs more went past the guard
GUARD_PATH = 9


def _trip_counts(n: int, k: int) -> dict[str, int | None]:
    values = LinearValues(SUM, (32, 1, 1), (4, 1, 1), {N: n, K: k})

    def uniform(f: LinearForm) -> int | None:
        return f.const if f.known and not f.coefs else None

    loops = find_loops(
        SUM,
        build_cfg(SUM),
        lambda r: uniform(values.register(r)),
        lambda ins, at: uniform(values.definition(ins, at)),
    )
    return {lp.header_label: lp.inferred_trip_count for lp in loops}


@pytest.mark.parametrize("n", range(1, 23))
@pytest.mark.parametrize("k", [1, 3])
def test_trip_counts_from_arguments_match_a_straight_line_run(n: int, k: int) -> None:
    # nvcc unrolls the n-loop by 4: a main loop of n // 4 and a remainder loop of n % 4
    run = run_thread(
        SUM, tid=(5, 0, 0), ctaid=(1, 0, 0), ntid=(32, 1, 1), nctaid=(4, 1, 1), args={N: n, K: k}
    )
    counts = _trip_counts(n, k)
    assert set(counts) == {"$L__BB0_3", "$L__BB0_6"}
    for header, count in counts.items():
        if run.label_visits[header]:  # a loop the thread enters: header runs per entry
            assert count == run.label_visits[header], (header, n)


@pytest.mark.parametrize("n", [4, 7, 13])
def test_predicted_instruction_count_is_the_interpreted_one(n: int) -> None:
    a100 = device_from_profile(get_profile("a100"))
    req = PredictRequest(
        ptx=PTX,
        device=a100,
        grid=(4, 1, 1),
        block=(32, 1, 1),
        kernel="strided_sum",
        registers_per_thread=24,
        kernel_args={N: n, K: 2},
    )
    result = predict_kernel(req)
    assert not [w for w in result.warnings if "trip count unknown" in w]
    run = run_thread(
        SUM, tid=(0, 0, 0), ctaid=(0, 0, 0), ntid=(32, 1, 1), nctaid=(4, 1, 1), args={N: n, K: 2}
    )
    assert result.estimate.l == run.executed


def test_a_loop_still_unbounded_names_the_parameter_it_needs() -> None:
    a100 = device_from_profile(get_profile("a100"))
    req = PredictRequest(PTX, a100, (4, 1, 1), (32, 1, 1), "strided_sum", 24)
    warnings = [w for w in predict_kernel(req).warnings if "trip count unknown" in w]
    assert warnings and all(f"kernel_args.{N}" in w for w in warnings)
    assert any("$L__BB0_3" in w for w in warnings)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"n": 3}, "kernel_args.n"),  # no such parameter
        ({N: 2.5}, f"kernel_args.{N}"),  # read as .u32
        ({N: "3"}, f"kernel_args.{N}"),
        ({N: True}, f"kernel_args.{N}"),
    ],
)
def test_bad_kernel_args_name_the_field(args: dict[str, object], field: str) -> None:
    a100 = device_from_profile(get_profile("a100"))
    req = PredictRequest(PTX, a100, (4, 1, 1), (32, 1, 1), "strided_sum", 24, kernel_args=args)  # type: ignore[arg-type]
    with pytest.raises(ModelInputError) as err:
        predict_kernel(req)
    assert err.value.field == field


@pytest.mark.parametrize(("n", "grid"), [(100, 10), (1, 3), (320, 10), (33, 40)])
def test_block_classes_count_the_blocks_a_straight_line_run_sends_out(n: int, grid: int) -> None:
    args = {"guarded_scale_param_1": n}
    out = 0
    for b in range(grid):
        reached = [
            run_thread(
                GUARD,
                tid=(t, 0, 0),
                ctaid=(b, 0, 0),
                ntid=(32, 1, 1),
                nctaid=(grid, 1, 1),
                args=args,
            ).executed
            > GUARD_PATH
            for t in range(32)
        ]
        out += not any(reached)
    values = LinearValues(GUARD, (32, 1, 1), (grid, 1, 1), args)
    classes = block_classes(GUARD, (32, 1, 1), (grid, 1, 1), values)
    full = len(GUARD.instructions)
    short = sum(c.blocks for c in classes if len(c.instructions) < full - 1)
    assert short == out
    assert sum(c.blocks for c in classes) == grid


@pytest.mark.parametrize("words", [0, 1, 2, 3, 4, 8, 16, 32, 33])
def test_bank_conflicts_of_a_word_stride_are_its_gcd_with_32(words: int) -> None:
    form = LinearForm(0, {"tid.x": 4 * words})
    access = warp_access(form, 4, (32, 1, 1), 32, 128, 32)
    assert access.bank_degree == (1 if words == 0 else math.gcd(words, 32))


@pytest.mark.parametrize(("stride", "width"), [(4, 4), (8, 4), (1, 1), (16, 16), (0, 4), (128, 4)])
def test_sectors_and_lines_of_a_strided_warp_are_counted_lane_by_lane(
    stride: int, width: int
) -> None:
    form = LinearForm(0, {"tid.x": stride})
    access = warp_access(form, width, (32, 1, 1), 32, 128, 32)
    touched = {b for lane in range(32) for b in range(lane * stride, lane * stride + width)}
    assert access.sectors == len({b // 32 for b in touched})
    assert access.lines == len({b // 128 for b in touched})


def test_a_2d_block_narrower_than_a_warp_counts_its_rows() -> None:
    # block 8 x 4: a warp covers 4 rows of 8 lanes, rows 1024 bytes apart
    form = LinearForm(0, {"tid.x": 4, "tid.y": 1024})
    access = warp_access(form, 4, (8, 4, 1), 32, 128, 32)
    assert (access.lines, access.sectors) == (4, 4)
