"""The six Many-BSP worked examples (many-bsp-supplementary.txt §2-§7) as checked-in data.

`tests/fixtures/ptx/paper/cases.json` holds each section's launch, resources, loop iterations,
n_ma and published numbers; the tests and bench/load_test.py read it through this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PAPER_DIR = Path(__file__).resolve().parent / "fixtures" / "ptx" / "paper"
CASES: list[dict[str, Any]] = json.loads((PAPER_DIR / "cases.json").read_text())["cases"]
CASE_IDS = [c["id"] for c in CASES]


def paper_case(case_id: str) -> dict[str, Any]:
    return next(c for c in CASES if c["id"] == case_id)


def paper_http_body(case: dict[str, Any]) -> dict[str, Any]:
    """The POST /predict-kernel body of a worked example, n_ma as the paper gives it."""
    return {
        "ptx": (PAPER_DIR / case["ptx"]).read_text(),
        "device": case["device"],
        "launch": {"grid": case["grid"], "block": case["block"]},
        "resources": {
            "registers_per_thread": case["registers_per_thread"],
            "shared_bytes_per_block": case["shared_bytes_per_block"],
        },
        "loop_trip_counts": case["loop_trip_counts"],
        "memory_transactions": case["memory_transactions"],
    }


def large_answer_body(extra_instructions: int = 90_000) -> dict[str, Any]:
    """The hotspot example with ``extra_instructions`` more ``add.s32`` lines before its exit:
    1.9 MB of PTX (under the 2 MB limit) whose full answer is about 36 MB (90k instructions,
    90k level-2 supersteps): the reliability issue's "big answer". The added lines come after
    every line the example's n_ma overrides name, so those keep their meaning."""
    body = paper_http_body(paper_case("hotspot-gtx-760"))
    lines = body["ptx"].split("\n")
    exit_label = lines.index("BB0_13:")
    body["ptx"] = "\n".join(
        lines[:exit_label] + ["add.s32 %r9, %r9, 1;"] * extra_instructions + lines[exit_label:]
    )
    return body
