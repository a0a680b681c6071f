"""What a 2 MB PTX module may cost a worker: the statement limit, the loop-nesting limit, the
peak memory of the worst module the limits admit, and answers encoded a chunk at a time that
equal the whole answer's encoding."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.convert import predict as predict_convert
from app.convert.predict import (
    BYTES_PER_STATEMENT,
    MAX_PTX_BYTES,
    PTXTooLarge,
    check_ptx_size,
    encode_view,
    to_core,
    to_response,
)
from app.schemas.predict import PredictKernelRequest
from bench.bench_ptx_memory import measure, module
from perfmodel.errors import ModelInputError
from perfmodel.manybsp import predict_kernel
from perfmodel.ptx import build_cfg, find_loops, parse_module
from perfmodel.ptx.cfg import MAX_LOOP_DEPTH, MAX_MEAN_LOOP_DEPTH
from tests.paper_cases import large_answer_body, paper_case, paper_http_body

#: the stated bound on the peak RSS one /predict-kernel analysis adds to a worker (README,
#: "Limits"); the test holds the worst module the limits admit 20 % below it
BOUND_BYTES = 300 * 10**6
MARGIN = 0.8


def test_statements_past_the_limit_are_refused_before_parsing() -> None:
    cap = MAX_PTX_BYTES // BYTES_PER_STATEMENT
    check_ptx_size("ret;" * cap)
    with pytest.raises(PTXTooLarge) as info:
        check_ptx_size("ret;" * (cap + 1))
    assert f"{cap + 1} statements" in str(info.value) and str(cap) in str(info.value)
    # the big answer (90,000 added instructions in 1.9 MB) is still admitted
    check_ptx_size(large_answer_body()["ptx"])


def test_loops_nested_too_deep_are_a_422() -> None:
    def nest(depth: int, straight_blocks: int = 0) -> str:
        heads = "".join(f"N{i}:\nadd.s32 %r2, %r2, 1;\n" for i in range(depth))
        latches = "".join(f"@%p1 bra N{i};\n" for i in reversed(range(depth)))
        after = "".join(f"S{i}:\nadd.s32 %r2, %r2, 1;\n" for i in range(straight_blocks))
        return (
            ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n"
            ".reg .pred %p<2>;\n.reg .b32 %r<3>;\n" + heads + latches + after + "ret;\n}\n"
        )

    def loops(text: str) -> int:
        fn = parse_module(text).entry(None)
        return len(find_loops(fn, build_cfg(fn)))

    # depth d over ~2d blocks: a mean depth of about d / 2
    assert loops(nest(MAX_MEAN_LOOP_DEPTH)) == MAX_MEAN_LOOP_DEPTH
    with pytest.raises(ModelInputError) as info:
        loops(nest(4 * MAX_MEAN_LOOP_DEPTH))
    assert info.value.field == "ptx" and "not modelled" in info.value.reason
    # shallow on average (straight code after the nest) but deeper than the maximum
    depth = MAX_LOOP_DEPTH + 20
    with pytest.raises(ModelInputError) as info:
        loops(nest(depth, straight_blocks=depth * depth // MAX_MEAN_LOOP_DEPTH))
    assert f"nest {depth} deep at most" in info.value.reason


HOTSPOT = paper_http_body(paper_case("hotspot-gtx-760"))


@pytest.mark.parametrize(
    "view",
    [
        {},
        {"detail": "full"},
        {"detail": "summary"},
        {"list_offset": 7, "list_limit": 50},
        {"list_offset": 290},
    ],
)
@pytest.mark.parametrize("limit", [1 << 20, 4096])
def test_chunked_encoding_equals_the_whole_answer(
    monkeypatch: pytest.MonkeyPatch, view: dict[str, Any], limit: int
) -> None:
    """The lists built and encoded 7 items at a time from the analysis give the answer the
    whole model's own encoding gives (sliced as the view asks)."""
    monkeypatch.setattr(predict_convert, "_CHUNK", 7)
    request = PredictKernelRequest.model_validate({**HOTSPOT, **view})
    core = to_core(request)
    result = predict_kernel(core)
    whole = to_response(result, core.device.clock_mhz)
    chunked = json.loads(
        encode_view(to_response(result, core.device.clock_mhz, lists=False), request, limit, result)
    )
    expected = whole.model_dump(mode="json")
    start = request.list_offset
    stop = None if request.list_limit is None else start + request.list_limit
    lists = ("instructions", "level1_supersteps", "level2_supersteps")
    for name in lists:
        expected[name] = expected[name][start:stop]
    full_size = len(json.dumps(expected, separators=(",", ":")))
    if request.detail == "summary" or (request.detail == "auto" and full_size > limit):
        assert chunked["lists"]["detail"] == "summary"
        for name in lists:
            expected[name] = []
    else:
        assert chunked["lists"]["detail"] == "full"
    expected["lists"] = chunked["lists"]
    assert chunked == expected
    assert chunked["lists"]["offset"] == start


@pytest.mark.slow
def test_the_worst_2mb_module_stays_within_the_memory_bound() -> None:
    """bench/bench_ptx_memory.py's costliest admitted shape (2 MB of three-operand ALU
    statements, one per 20 bytes; bench/RESULTS.md): its analysis, with the default detail,
    adds at most 80 % of the stated bound to a warm worker's peak RSS (measured: ~170 MB)."""
    figures = measure(module("alu"), "auto")
    assert figures["answer"].endswith(" B"), figures
    assert figures["growth_bytes"] <= MARGIN * BOUND_BYTES, figures
