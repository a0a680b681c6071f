"""load_*_jsonl: every bad line is refused with its 1-based line number and key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfmodel.calibration import (
    CalibrationInputError,
    GemmWsMeasurement,
    ManyBspMeasurement,
    MeasurementLineError,
    load_gemm_ws_jsonl,
    load_many_bsp_jsonl,
    load_measurements_jsonl,
)
from tests.paper_cases import PAPER_DIR, paper_case
from tests.perfmodel.manybsp.conftest import paper_request

GOOD: dict[str, Any] = {
    "m": 1024,
    "n": 512,
    "k": 2048,
    "dtype": "fp16",
    "tile_m": 128,
    "tile_n": 64,
    "tile_k": 32,
    "buffer_depth": 2,
    "measured_time_us": 81.5,
}


def _line(**change: Any) -> str:
    record = {**GOOD, **change}
    return json.dumps({k: v for k, v in record.items() if v is not ...})


def test_good_lines_become_measurements_blank_lines_and_meta_ignored(tmp_path: Path) -> None:
    lines = [_line(), "", _line(model="gemm-ws", tile_m=64, meta={"gpu": "x"}), "  "]
    expected = [
        GemmWsMeasurement(1024, 512, 2048, "fp16", 128, 64, 32, 2, 81.5),
        GemmWsMeasurement(1024, 512, 2048, "fp16", 64, 64, 32, 2, 81.5),
    ]
    assert load_gemm_ws_jsonl(lines) == expected
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert load_measurements_jsonl(path, "gemm-ws") == expected


@pytest.mark.parametrize(
    ("bad", "field", "says"),
    [
        ("{not json", "line 2", "not JSON"),
        ("[1, 2]", "line 2", "one JSON object"),
        (_line(tile_m=0), "line 2.tile_m", "at least 1"),
        (_line(buffer_depth=2.0), "line 2.buffer_depth", "whole number"),
        (_line(measured_time_us=-1), "line 2.measured_time_us", "> 0"),
        (_line(measured_time_us="fast"), "line 2.measured_time_us", "number"),
        (_line().replace("81.5", "NaN"), "line 2.measured_time_us", "finite"),
        (_line(dtype="int8"), "line 2.dtype", "fp16"),
        (_line(tile_K=32), "line 2.tile_K", "unknown key"),
        (_line(k=...), "line 2.k", "missing"),
        (_line(model="roofline"), "line 2.model", "unknown model"),
    ],
)
def test_a_bad_line_is_named_by_number_and_key(bad: str, field: str, says: str) -> None:
    with pytest.raises(MeasurementLineError) as info:
        load_gemm_ws_jsonl([_line(), bad, _line()])
    assert info.value.field == field and info.value.line == 2
    assert says in info.value.reason
    assert isinstance(info.value, CalibrationInputError)


def test_lines_of_the_other_model_are_skipped_and_a_file_of_only_them_refused() -> None:
    other = json.dumps({"model": "many-bsp", "ptx": "", "grid": [1, 1, 1]})
    assert len(load_gemm_ws_jsonl([other, _line()])) == 1
    with pytest.raises(CalibrationInputError) as info:
        load_gemm_ws_jsonl([other, other])
    assert info.value.field == "measurements"
    assert "no gemm-ws measurements" in info.value.reason and "2 of many-bsp" in info.value.reason
    with pytest.raises(CalibrationInputError, match="none"):
        load_gemm_ws_jsonl(["", ""])


def test_bad_calls_are_refused() -> None:
    with pytest.raises(TypeError, match="pathlib.Path"):
        load_gemm_ws_jsonl(_line())  # type: ignore[arg-type]  # a bare string
    with pytest.raises(CalibrationInputError) as info:
        load_measurements_jsonl([_line()], "roofline")
    assert info.value.field == "model"
    with pytest.raises(CalibrationInputError) as info:
        load_measurements_jsonl([_line()], "many-bsp")
    assert info.value.field == "device"


def _many_bsp_line(**change: Any) -> str:
    case = paper_case("knn-gtx-760")
    record = {
        "model": "many-bsp",
        "device": "gtx-760",
        "ptx": (PAPER_DIR / case["ptx"]).read_text(),
        "grid": case["grid"],
        "block": case["block"],
        "registers_per_thread": case["registers_per_thread"],
        "shared_bytes_per_block": case["shared_bytes_per_block"],
        "loop_trip_counts": case["loop_trip_counts"],
        "memory_transactions": case["memory_transactions"],
        "measured_cycles": case["published"]["measured_cycles"],
        **change,
    }
    return json.dumps(record)


def test_many_bsp_lines_build_the_paper_request() -> None:
    expected = paper_request(paper_case("knn-gtx-760"))
    (m,) = load_many_bsp_jsonl([_many_bsp_line()], expected.device)
    assert m == ManyBspMeasurement(expected, 7458.0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"grid": [168, 1]}, "line 1.grid"),
        ({"block": [256, 0, 1]}, "line 1.block.y"),
        ({"device": "940mx"}, "line 1.device"),
        ({"memory_transactions": {"x": 2}}, "line 1.memory_transactions.x"),
        ({"measured_cycles": 0}, "line 1.measured_cycles"),
        ({"ptx": 7}, "line 1.ptx"),
        ({"launch": {}}, "line 1.launch"),
    ],
)
def test_a_bad_many_bsp_line_is_named(change: dict[str, Any], field: str) -> None:
    device = paper_request(paper_case("knn-gtx-760")).device
    with pytest.raises(MeasurementLineError) as info:
        load_many_bsp_jsonl([_many_bsp_line(**change)], device)
    assert info.value.field == field
