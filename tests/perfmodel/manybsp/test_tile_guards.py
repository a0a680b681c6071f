"""Block classes of a tile loop whose bounds check holds in part of the iterations: the
warp-iterations that run the guarded code, and the warps that run it, checked against a
straight-line interpretation of the PTX of every thread."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from device_profiles import get_profile
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel
from perfmodel.ptx import Function, parse_module
from perfmodel.ptx.block_classes import BlockClass, block_classes
from perfmodel.ptx.linear import LinearValues
from tests.perfmodel.ptx_interpreter import run_thread

PTX = (
    Path(__file__).resolve().parents[2] / "fixtures" / "ptx" / "nvcc" / "tile_guard.sm_80.ptx"
).read_text()
MODULE = parse_module(PTX)
TRIP = 4  #: rows per thread (the tile loop's trip count in tile_guard.cu)
N_K = 2


def _args(kernel: str, m: int) -> dict[str, float]:
    return {f"{kernel}_param_2": m, f"{kernel}_param_3": N_K}


def _guard(fn: Function, kernel: str) -> int:
    """Index of the row check's branch: the guarded ``bra`` after the ``setp`` that compares
    with m (the register ``ld.param`` loads from parameter 2)."""
    param = f"[{kernel}_param_2]"
    (m,) = [i.defs[0] for i in fn.instructions if i.opcode == "ld" and i.operands[-1].text == param]
    for k, ins in enumerate(fn.instructions):
        if ins.opcode == "setp" and any(o.text == m for o in ins.operands[1:]):
            bra = fn.instructions[k + 1]
            assert bra.opcode == "bra" and bra.guard == ins.defs[0]
            return k + 1
    raise AssertionError("no row check")


def _executions(
    fn: Function,
    block: tuple[int, int, int],
    grid: tuple[int, int, int],
    by: int,
    args: dict[str, float],
) -> list[Counter[int]]:
    """Per thread of block (0, by, 0), in linear order: how often each instruction ran."""
    return [
        run_thread(
            fn,
            tid=(t % block[0], t // block[0], 0),
            ctaid=(0, by, 0),
            ntid=block,
            nctaid=grid,
            args={k: int(v) for k, v in args.items()},
        ).at
        for t in range(block[0] * block[1] * block[2])
    ]


def _model(classes: tuple[BlockClass, ...], guard: int, warps: int) -> tuple[int, int]:
    """(warp-iterations running the guarded code, warps running it) over the grid."""
    iterations = active = 0
    for c in classes:
        if guard in c.iterations_run:
            run, _ = c.iterations_run[guard]
            iterations += c.blocks * run
            active += c.blocks * (c.active_warps or warps)
        elif guard in c.instructions and not c.fixed_branches.get(guard, False):
            iterations += c.blocks * warps * TRIP
            active += c.blocks * warps
    return iterations, active


@pytest.mark.parametrize("kernel", ["tile_rows_adjacent", "tile_rows_strided"])
@pytest.mark.parametrize(
    ("block", "m"), [((8, 4, 1), 37), ((4, 16, 1), 70), ((32, 2, 1), 9), ((2, 24, 1), 50)]
)
def test_warp_iterations_behind_a_tile_row_check_match_a_straight_line_run(
    kernel: str, block: tuple[int, int, int], m: int
) -> None:
    fn = MODULE.entry(kernel)
    # a grid sized by the block, not the tile (as Kernel Tuner sizes it): most blocks idle
    grid = (1, math.ceil(m / block[1]), 1)
    args = _args(kernel, m)
    classes = block_classes(fn, block, grid, LinearValues(fn, block, grid, args))
    guard = _guard(fn, kernel)
    n_t = block[0] * block[1]
    warps = math.ceil(n_t / 32)
    iterations = active = 0
    for by in range(grid[1]):
        # the first instruction the guard skips: once per iteration run
        lanes = [at[guard + 1] for at in _executions(fn, block, grid, by, args)]
        for w in range(warps):
            # the guard holds for a prefix of each thread's rows, so a warp runs the
            # iterations of its longest prefix
            most = max(lanes[32 * w : 32 * w + 32])
            iterations += most
            active += most > 0
    assert _model(classes, guard, warps) == (iterations, active)


def test_idle_warps_leave_the_prediction() -> None:
    """A block class whose warps are partly past the data is evaluated on its running
    warps only: with every row inside, the same grid takes longer. (Counted whole, the
    partly filled blocks ran every row: the same time.)"""
    a100 = device_from_profile(get_profile("a100"))
    kernel = "tile_rows_adjacent"
    block, grid = (2, 256, 1), (4 * 108, 2, 1)

    def cycles(m: int) -> float:
        req = PredictRequest(PTX, a100, grid, block, kernel, 32, kernel_args=_args(kernel, m))
        return predict_kernel(req).estimate.kernel_exec_cycle

    # 256 rows of threads x 4 rows each: m = 2048 fills every row; m = 1040 leaves the second
    # row of blocks with 4 of 16 warps running (rows 1024-1039) and the first row full
    assert cycles(1040) < cycles(2048)


UNROLLED = parse_module(
    (
        Path(__file__).resolve().parents[2]
        / "fixtures"
        / "ptx"
        / "nvcc"
        / "tile_guard_unrolled.sm_80.ptx"
    ).read_text()
)


def _row_checks(fn: Function, kernel: str) -> list[int]:
    """Indices of every row check's branch (one per unrolled row): a guarded ``bra`` after a
    ``setp`` that compares with m."""
    param = f"[{kernel}_param_2]"
    (m,) = [i.defs[0] for i in fn.instructions if i.opcode == "ld" and i.operands[-1].text == param]
    checks = []
    for k, ins in enumerate(fn.instructions[:-1]):
        bra = fn.instructions[k + 1]
        if ins.opcode == "setp" and any(o.text == m for o in ins.operands[1:]):
            if bra.opcode == "bra" and bra.guard == ins.defs[0]:
                checks.append(k + 1)
    return checks


@pytest.mark.parametrize("kernel", ["tile_rows_unrolled_adjacent", "tile_rows_unrolled_strided"])
@pytest.mark.parametrize(
    ("block", "m"), [((8, 4, 1), 37), ((4, 16, 1), 70), ((32, 2, 1), 9), ((2, 24, 1), 50)]
)
def test_warps_behind_unrolled_row_checks_match_a_straight_line_run(
    kernel: str, block: tuple[int, int, int], m: int
) -> None:
    """An unrolled tile loop's row checks are guards outside any loop: per check, the warps
    of the grid in which some thread runs the row, and per block the warps that run any row
    (the class's warps), as a straight-line run of every thread counts them."""
    fn = UNROLLED.entry(kernel)
    grid = (1, math.ceil(m / block[1]), 1)
    args = _args(kernel, m)
    classes = block_classes(fn, block, grid, LinearValues(fn, block, grid, args))
    checks = _row_checks(fn, kernel)
    assert len(checks) >= 3  # the rows of the n_k > 0 path and of the n_k <= 0 path
    n_t = block[0] * block[1]
    warps = math.ceil(n_t / 32)
    per_check = dict.fromkeys(checks, 0)
    any_row = 0
    for by in range(grid[1]):
        runs = _executions(fn, block, grid, by, args)
        for w in range(warps):
            lanes = runs[32 * w : 32 * w + 32]
            rows = [any(at[g + 1] for at in lanes) for g in checks]
            for g, ran in zip(checks, rows, strict=True):
                per_check[g] += ran
            any_row += any(rows)
    model = dict.fromkeys(checks, 0)
    model_warps = 0
    for c in classes:
        runs_any = False
        for g in checks:
            if g in c.iterations_run:
                model[g] += c.blocks * c.iterations_run[g][0]
                runs_any = True
            elif g in c.instructions and not c.fixed_branches.get(g, False):
                model[g] += c.blocks * warps
                runs_any = True
        model_warps += c.blocks * (c.active_warps or warps) if runs_any else 0
    assert model == per_check
    assert model_warps == any_row
