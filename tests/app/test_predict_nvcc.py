"""POST /predict-kernel answers 200 for every entry of every checked-in nvcc fixture (sm_75 to
sm_90a, CUTLASS warp-specialized kernels included) on a profile that serves Many-BSP, says when
Hopper instructions are uncosted, and reports warp-specialized kernels per warp role."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.nvcc_entries import NVCC_DIR, REGISTERS_PER_THREAD, entries

ENTRIES = entries()


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, cache_path=None, cache_memory_items=0)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def body(fixture: str, entry: str, block: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "ptx": (NVCC_DIR / fixture).read_text(),
        "kernel": entry,
        "device": "940mx",  # 255 registers per thread: room for the sm_90a kernels
        "launch": {"grid": [132, 1, 1], "block": list(block)},
        "resources": {"registers_per_thread": REGISTERS_PER_THREAD},
    }


def test_the_fixtures_include_sm_75_to_sm_90a_and_two_cutlass_gemms() -> None:
    files = {f for f, _, _ in ENTRIES}
    targets = {f.rsplit(".", 2)[-2] for f in files}
    assert {"sm_75", "sm_80", "sm_90", "sm_90a"} <= targets
    assert sum(f.startswith("cutlass_ws_gemm.") for f in files) >= 2


@pytest.mark.parametrize(("fixture", "entry", "block"), ENTRIES, ids=lambda v: str(v)[:40])
def test_every_entry_is_predicted(client: TestClient, fixture, entry, block) -> None:
    r = client.post("/predict-kernel", json=body(fixture, entry, block))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["kernel"] == entry and out["predicted_cycles"] > 0
    text = (NVCC_DIR / fixture).read_text().splitlines()
    for row in out["instructions"]:
        assert row["opcode"] in text[row["line"] - 1]  # lines point into the submitted text
        if row["instruction_class"] == "uncosted":
            # never a silent zero: null figures and a warning naming the opcode
            assert row["latency_cycles"] is None and row["throughput_per_ws"] is None
            assert any(w.startswith(f"uncosted: {row['opcode']} ") for w in out["warnings"]), row[
                "opcode"
            ]
    if "wgmma.mma_async" in "\n".join(text):
        assert any(w.startswith("uncosted: wgmma.mma_async") for w in out["warnings"])


@pytest.mark.parametrize(
    "fixture",
    sorted(p.name for p in NVCC_DIR.glob("cutlass_*.sm_90a.ptx")),
)
def test_warp_specialized_kernels_report_each_role(client: TestClient, fixture: str) -> None:
    ((_, entry, block),) = [e for e in ENTRIES if e[0] == fixture]
    out = client.post("/predict-kernel", json=body(fixture, entry, block)).json()
    roles = out["warp_roles"]
    assert len(roles) >= 2
    assert sorted(w for r in roles for w in r["warps"]) == list(range(block[0] // 32))
    (bound,) = [r for r in roles if r["bounds_kernel"]]
    assert bound["predicted_cycles"] == out["predicted_cycles"]
    assert bound["predicted_cycles"] == max(r["predicted_cycles"] for r in roles)
    for r in roles:
        assert r["threads"] == 32 * len(r["warps"])
        assert r["instructions"] >= r["uncosted_instructions"]
        for step in r["level1_supersteps"]:
            assert step["start_line"] <= step["end_line"]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not on PATH")
def test_cutlass_kernel_with_registers_from_ptxas(client: TestClient) -> None:
    fixture = "cutlass_ws_gemm.pingpong_64x128x64.sm_90a.ptx"
    ((_, entry, block),) = [e for e in ENTRIES if e[0] == fixture]
    request = body(fixture, entry, block)
    del request["resources"]
    r = client.post("/predict-kernel", json=request)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["registers_source"] == "ptxas -v (sm_90a)"  # its own target, no fallback
    # 384 threads must fit the 940MX's 65,536 registers per SM
    assert 1 <= out["registers_per_thread"] <= 65536 // 384
