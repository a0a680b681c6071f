"""The BLOCK data structure and level-2 supersteps (eq. 6-9) against Tables 2-2 and 2-3."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfmodel.manybsp import PredictResult, predict_kernel
from perfmodel.manybsp.block import analyse_block, warps_per_scheduler
from perfmodel.manybsp.types import (
    FunctionalUnit,
    InstructionCost,
    InstructionKind,
    Level1Span,
    ManyBspDevice,
)
from tests.perfmodel.manybsp.conftest import CASES, paper_request, paper_result

GTX760 = ManyBspDevice(
    warp_size=32, n_sm=6, n_ws=4, n_du=8, issue_cycle=1, mem_lat_cycles=191,
    warp_launch_overhead_cycles=10, block_launch_overhead_cycles=553, max_threads_per_sm=2048,
    registers_per_sm=65536, shared_memory_per_sm_bytes=49152, mu=3.36,
)  # fmt: skip

HOTSPOT_760 = next(c for c in CASES if c["id"] == "hotspot-gtx-760")


def _table_2_2_result() -> PredictResult:
    """Hotspot on the GTX 760 with the LDST throughput Table 2-2 itself uses (T_i = 16, the
    uncontended figure of Table 1-5; the profile carries the contended 8 of Table 4-2)."""
    req = paper_request(HOTSPOT_760)
    classes = tuple(
        (k, replace(v, throughput_per_ws=16.0) if k in ("ld_shared", "st_shared") else v)
        for k, v in req.device.classes
    )
    return predict_kernel(replace(req, device=replace(req.device, classes=classes)))


# Table 2-3, level-2 supersteps 1-13 and 111-119: <first Inst#, last Inst#, comp, comm>
TABLE_2_3 = [
    (1, 16, 49, 0), (17, 18, 21, 0), (19, 19, 19, 0), (20, 21, 21, 0), (22, 23, 21, 0),
    (24, 25, 21, 0), (26, 28, 23, 0), (29, 29, 19, 0), (30, 32, 23, 0), (33, 33, 19, 0),
    (34, 34, 19, 0), (35, 35, 19, 0), (36, 36, 19, 0),
    (183, 183, 4, 0), (184, 184, 19, 0), (185, 185, 19, 0), (186, 187, 6, 0),
    (188, 189, 21, 0), (190, 190, 19, 0), (191, 194, 22, 0), (195, 195, 19, 0),
    (196, 196, 4, 764),
]  # fmt: skip


@pytest.mark.parametrize("row", TABLE_2_3, ids=lambda r: f"{r[0]}~{r[1]}")
def test_level2_supersteps_of_table_2_3(row: tuple[int, int, int, int]) -> None:
    result = _table_2_2_result()
    line = [c.line for c in result.costs]
    first, last, comp, comm = row
    found = [s for s in result.level2 if s.start == first - 1]
    assert len(found) == 1
    assert (line[found[0].end], found[0].comp_cycles, found[0].comm_cycles) == (
        line[last - 1],
        comp,
        comm,
    )


def _alu(consumer: int | None, latency: float = 16) -> InstructionCost:
    return InstructionCost(
        line=0, opcode="add.s32", fu=FunctionalUnit.SP, kind=InstructionKind.COMPUTE,
        units_per_ws=32, throughput_per_ws=32, latency_cycles=latency, consumer=consumer,
    )  # fmt: skip


def _sfu(consumer: int | None, latency: float) -> InstructionCost:
    return InstructionCost(
        line=0, opcode="rcp.rn.f32", fu=FunctionalUnit.SFU, kind=InstructionKind.COMPUTE,
        units_per_ws=16, throughput_per_ws=16, latency_cycles=latency, consumer=consumer,
    )  # fmt: skip


def test_eq8_wait_of_table_2_2_row_59() -> None:
    """div.rn (139) read 4 rows later, 3 rcp issues (4 cycles each) between: eq. (8) leaves
    141 - 12 = 129 cycles of sync, as Table 2-2 row 59 prints."""
    costs = [_sfu(4, 139), _sfu(None, 419), _sfu(None, 419), _sfu(None, 419), _alu(None)]
    analysis = analyse_block(costs, [Level1Span(0, 4, 1)], 256, GTX760)
    assert analysis.rows[0].fu_cycles[2] == 139 + 2  # latency + (w - 1) x 32/T
    assert analysis.rows[0].sync_cycles == 129
    assert analysis.level2[0].comp_cycles == 4 + 141  # eq. (9): issue + busiest unit


def test_dependent_next_instruction_ends_the_superstep() -> None:
    """d = 1: the next row waits the producer's occupancy; it opens a superstep with its
    latency exposed ("16+1")."""
    costs = [_alu(1), _alu(None)]
    analysis = analyse_block(costs, [Level1Span(0, 1, 1)], 256, GTX760)
    assert [r.sync_cycles for r in analysis.rows] == [17, 0]
    assert [(s.start, s.end) for s in analysis.level2] == [(0, 0), (1, 1)]
    assert analysis.rows[1].fu_cycles[0] == 17


def test_independent_rows_share_one_superstep_and_issue_back_to_back() -> None:
    costs = [_alu(None) for _ in range(5)]
    analysis = analyse_block(costs, [Level1Span(0, 4, 1)], 256, GTX760)
    assert len(analysis.level2) == 1
    # eq. (9): 2 + max(4 x 2 issue cycles, 17 + 4 x 2 SP occupancy)
    assert analysis.level2[0].comp_cycles == 2 + max(8, 17 + 8)


@pytest.mark.parametrize(("n_t", "w"), [(32, 1), (128, 1), (129, 2), (256, 2), (1024, 8)])
def test_w_eq_6(n_t: int, w: int) -> None:
    assert warps_per_scheduler(n_t, GTX760) == w


def test_spans_must_tile_the_table() -> None:
    with pytest.raises(ValueError, match="tile"):
        analyse_block([_alu(None), _alu(None)], [Level1Span(1, 1, 1)], 256, GTX760)


def test_eq8_stall_leaves_the_next_row_warm_where_the_device_tables_say_so() -> None:
    """The rows of test_eq8_wait_of_table_2_2_row_59 on a device whose tables hide the latency
    after an eq. (8) stall (940MX, Table 5-2 row 60 "8"): the first rcp occupies its unit
    w x 32/T_i and shares the superstep of the other two."""
    costs = [_sfu(4, 139), _sfu(None, 419), _sfu(None, 419), _sfu(None, 419), _alu(None)]
    warm = replace(GTX760, latency_exposed_after_eq8_stall=False)
    cold = analyse_block(costs, [Level1Span(0, 4, 1)], 256, GTX760)
    analysis = analyse_block(costs, [Level1Span(0, 4, 1)], 256, warm)
    assert cold.rows[1].fu_cycles[2] == 419 + 2  # Table 2-2 row 60 "419+2"
    assert analysis.rows[1].fu_cycles[2] == 2 * 2  # w x 32/T_i
    assert [(s.start, s.end) for s in analysis.level2] == [(0, 0), (1, 4)]
    # eq. (9): 4 + max(issue 4 + 4 + 2, SFU 4 + 4 + 4)
    assert analysis.level2[1].comp_cycles == 4 + 12


# Level-2 supersteps the device-dependent readings govern (docs/model-notes.md, "Many-BSP",
# contradiction 7): <first Inst#, last Inst#, published comp>.
DEVICE_READINGS = [
    # eq. (8) stall of div.rn (row 59), then rcp: Table 2-3 #29-30 (exposed), 5-3 #29-30 (not)
    ("hotspot-gtx-760", (59, 59, 145)), ("hotspot-gtx-760", (60, 64, 433)),
    ("hotspot-940mx", (59, 59, 149)), ("hotspot-940mx", (60, 64, 32)),
    # cvt.f64.f32 / add.f64 / sub.f64 on the 940MX at 12 cycles for w = 2 (Table 5-3)
    ("hotspot-940mx", (78, 80, 23)), ("hotspot-940mx", (92, 94, 23)),
    ("hotspot-940mx", (143, 143, 76)), ("hotspot-940mx", (153, 153, 14)),
    ("hotspot-940mx", (154, 154, 76)), ("hotspot-940mx", (159, 159, 14)),
    ("hotspot-940mx", (160, 160, 76)), ("hotspot-940mx", (161, 161, 161)),
    # mov %ctaid after the loop's exit branch: Table 4-3 #56 (exposed), Table 7-3 #57 (hidden)
    ("mm-gtx-760", (145, 145, 47)), ("mm-940mx", (145, 145, 16)),
]  # fmt: skip


@pytest.mark.parametrize(("case_id", "row"), DEVICE_READINGS, ids=lambda v: str(v))
def test_level2_supersteps_governed_by_device_readings(
    case_id: str, row: tuple[int, int, int]
) -> None:
    result = paper_result(next(c for c in CASES if c["id"] == case_id))
    first, last, comp = row
    found = [s for s in result.level2 if s.start == first - 1]
    assert len(found) == 1
    assert (found[0].end + 1, found[0].comp_cycles) == (last, comp)
