"""``kperf table``: the file under the engine's name, a sweep that resumes, and the verify loop
against recorded timings of a device far from its profile (in-process service)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from app.convert.tuning_table import table_model
from app.schemas.tuning_table import TuningTableRequest
from kperf_client.cli import main
from kperf_client.client import KperfClient
from kperf_client.table_sweep import JOURNAL_NAME, read_table_shapes
from kperf_client.table_verify import RecordedBench, verify_table
from perfmodel.gemm_ws import GemmWsMachine
from solver.tuning_table import num_stages_for
from tests.gemm_ws_cases import A6000

SPACE = {"tile_m": [16, 64, 128], "tile_n": [64, 128], "tile_k": [64, 128], "buffer_depth": [2, 3]}


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out, err)
    return code, out.getvalue(), err.getvalue()


def test_one_table_is_written_under_the_loaders_name(tmp_path: Path) -> None:
    code, out, err = _run(
        ["table", "--n", "1536", "--k", "7168", "--dtype", "fp8", "--device", "h100",
         "--format", "sglang", "--m-values", "1,64,4096", "-o", str(tmp_path), "--json"]
    )  # fmt: skip
    assert code == 0, err
    answer = json.loads(out)
    name = (
        "N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"
    )
    assert answer["file_name"] == name
    written = json.loads((tmp_path / name).read_text(encoding="utf-8"))
    assert written == answer["file"] and list(written) == ["1", "64", "4096"]


def test_a_sweep_resumes_and_journals_bad_lines(tmp_path: Path) -> None:
    header, first = "n,k,m_values\n", '1536,7168,"[1, 256]"\n'
    shapes = tmp_path / "shapes.csv"
    shapes.write_text(header + first + '7168,x,\n4096,0,\n2048,7168,"[1, 256]"\n', encoding="utf-8")
    lines, bad = read_table_shapes(shapes, {"device": "h100"})
    assert [b[0] for b in bad] == [3] and len(lines) == 3
    out = tmp_path / "out"
    # a first run that stopped after the first line: the same line, the same content
    started = tmp_path / "started.csv"
    started.write_text(header + first, encoding="utf-8")
    code, _, err = _run(["table", "--sweep", str(started), "--device", "h100", "-o", str(out)])
    assert code == 0, err
    code, text, err = _run(
        ["table", "--sweep", str(shapes), "--device", "h100", "-o", str(out), "--json"]
    )
    assert code == 1, err  # line 3 unreadable, line 4 refused (k = 0)
    stats = json.loads(text)
    assert (stats["skipped"], stats["answered"], stats["errors"]) == (1, 2, 1)
    records = [json.loads(r) for r in (out / JOURNAL_NAME).read_text().splitlines()]
    by_line = {r["line"]: r for r in records}
    assert by_line[4]["status"] == "error" and by_line[4]["errors"][0][0].endswith("k")
    assert by_line[5]["status"] == "ok" and (out / by_line[5]["file_name"]).exists()
    # the rerun answers only what was refused (it may have been a transient mistake)
    code, text, _ = _run(
        ["table", "--sweep", str(shapes), "--device", "h100", "-o", str(out), "--json"]
    )
    assert json.loads(text)["skipped"] == 2


def _truth() -> dict[str, Any]:
    """The paper's A6000 figures moved far: loads 0.4x, MATH 2x, latency 3x."""
    machine = GemmWsMachine(**dataclasses.asdict(A6000))
    return dataclasses.asdict(machine) | {
        "load_throughput_elements_per_us": machine.load_throughput_elements_per_us * 0.4,
        "compute_throughput_macs_per_us": machine.compute_throughput_macs_per_us * 2.0,
        "load_startup_latency_us": machine.load_startup_latency_us * 3.0,
    }


def test_verify_reaches_the_true_optimum_timing_few(tmp_path: Path) -> None:
    keys, n, k = [1, 64, 512, 2048], 4096, 4096
    truth = TuningTableRequest.model_validate(
        {"n": n, "k": k, "dtype": "fp16", "device_params": _truth(), "m_values": keys,
         "search_space": SPACE, "format": "json", "pipeline_model": "paper"}
    )  # fmt: skip
    model = table_model(truth, None)
    times = model.times(keys)
    recorded = tmp_path / "runs.jsonl"
    with open(recorded, "w", encoding="utf-8") as f:
        for i, t in enumerate(model.tilings):
            for m in keys:
                engine = {"BLOCK_SIZE_M": t.tile_m, "BLOCK_SIZE_N": t.tile_n,
                          "BLOCK_SIZE_K": t.tile_k, "GROUP_SIZE_M": 1, "num_warps": 4,
                          "num_stages": num_stages_for(t.buffer_depth, "8.6")}  # fmt: skip
                run = {"m": m, "n": n, "k": k, "dtype": "fp16", **engine}
                f.write(json.dumps(run | {"measured_time_us": times[m][i] / 1000}) + "\n")
    bench = RecordedBench.from_file(recorded)
    body = {"n": n, "k": k, "dtype": "fp16", "device": "rtx-a6000", "m_values": keys,
            "search_space": SPACE, "format": "json", "pipeline_model": "paper"}  # fmt: skip

    async def loop() -> Any:
        async with KperfClient(settings={"workers": 1, "cache_path": None}) as client:
            return await verify_table(client, body, bench, rounds=3)

    result = asyncio.run(loop())
    assert result.device != "rtx-a6000"  # the runs were posted and the device refit
    for m in keys:
        optimum = min(times[m]) / 1000
        assert result.best_time_us[m] <= optimum * 1.03, m
        assert bench.time_us(m, n, k, "fp16", result.file[str(m)]) == result.best_time_us[m]
    assert result.runs <= len(model.tilings) * len(keys) // 2
