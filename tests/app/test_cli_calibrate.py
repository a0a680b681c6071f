"""``kperf calibrate``, ``kperf measurements add|list`` and ``kperf recalibrate``, against
``kperf serve`` on 127.0.0.1 and in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.app.calibration_helpers import gemm_ws_runs, paper_launches
from tests.app.service_helpers import clean_environ, live_server
from tests.app.test_cli import run, table_rows

__all__ = ["clean_environ", "live_server"]

RUNS = gemm_ws_runs()


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
    return path


def test_calibrate_record_and_recalibrate(tmp_path: Path, live_server: str) -> None:
    url = ["--url", live_server]
    # the core bench's lines carry model and meta keys: both accepted
    first = write_lines(tmp_path / "runs.jsonl", [{"model": "gemm-ws", "meta": {"i": i}, **r}
                                                  for i, r in enumerate(RUNS[:20])])  # fmt: skip
    code, out, err = run("calibrate", str(first), "--model", "gemm-ws", "--device", "rtx-a6000",
                         "--name", "cli-gpu", *url, "--json")  # fmt: skip
    assert code == 0, err
    made = json.loads(out)
    assert made["name"] == "cli-gpu" and made["measurement_count"] == 20
    assert "note:" not in err  # a server keeps what it makes
    # the table shows the same figures
    code, table, _ = run("calibrate", str(first), "--device", "rtx-a6000", *url)
    assert code == 0 and f"already there: {made['device']}" in table
    rows = {row[0]: row for row in table_rows(table)}
    for figure in made["fitted"]:
        assert float(rows[figure["name"]][1]) == float(f"{figure['value']:.6g}")
    code, out, _ = run("devices", "cli-gpu", *url, "--json")
    assert json.loads(out)["id"] == made["device"]

    more = write_lines(tmp_path / "more.jsonl", ["", *RUNS[20:]])
    code, out, err = run("measurements", "add", str(more), "--device", "cli-gpu", *url)
    assert code == 0, err
    assert f"recorded {len(RUNS) - 20} gemm-ws runs for {made['device']} ({len(RUNS)}" in out
    assert out.rstrip().endswith("refit with: kperf recalibrate cli-gpu")  # the name moves
    code, out, _ = run("measurements", "list", "cli-gpu", *url)
    listed = [json.loads(line) for line in out.splitlines()]
    assert [{k: v for k, v in r.items() if k != "model"} for r in listed] == sorted(
        RUNS[:20], key=lambda r: json.dumps(r, sort_keys=True, separators=(",", ":"))
    ) + RUNS[20:]

    code, out, err = run("recalibrate", "cli-gpu", *url, "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["measurement_count"] == len(RUNS) and again["name"] == "cli-gpu"
    assert again["device"] != made["device"]
    code, out, _ = run("devices", "cli-gpu", *url, "--json")
    assert json.loads(out)["id"] == again["device"]  # the name moved with the refit


def test_errors_name_the_line(tmp_path: Path, live_server: str) -> None:
    lines = [dict(r) for r in RUNS[:10]]
    lines[3]["measured_time_us"] = -1.0
    path = write_lines(tmp_path / "bad.jsonl", ["", *lines])  # run 3 is on line 5
    code, out, err = run("calibrate", str(path), "--device", "rtx-a6000", "--url", live_server)
    assert code == 1 and out == ""
    assert f"  {path}:5 measured_time_us: " in err
    good = write_lines(tmp_path / "good.jsonl", RUNS[:2])
    code, _, err = run("measurements", "add", str(good), "--device", "nope", "--url", live_server)
    assert code == 1 and "  device: unknown device 'nope'" in err
    broken = write_lines(tmp_path / "broken.jsonl", [RUNS[0], "{not json"])
    code, _, err = run("calibrate", str(broken), "--device", "rtx-a6000", "--url", live_server)
    assert code == 2 and f"{broken}:2: not JSON" in err
    empty = write_lines(tmp_path / "empty.jsonl", [""])
    code, _, err = run("measurements", "add", str(empty), "--device", "rtx-a6000")
    assert code == 2 and "no measurement lines" in err


def test_flat_kernel_lines_and_the_in_process_note(tmp_path: Path) -> None:
    """Many-BSP lines in the core loader's flat form (grid, block, registers at the top)."""
    flat = []
    for launch in paper_launches()[:4]:
        line = {"model": "many-bsp", "device": "gtx-760", "ptx": launch["ptx"],
                "grid": launch["launch"]["grid"], "block": launch["launch"]["block"],
                **launch["resources"], "loop_trip_counts": launch["loop_trip_counts"],
                "memory_transactions": launch["memory_transactions"],
                "measured_cycles": 4.0e5}  # fmt: skip
        flat.append(line)
    path = write_lines(tmp_path / "kernels.jsonl", [*flat, RUNS[0]])  # a gemm-ws line: skipped
    code, out, err = run("measurements", "add", str(path), "--device", "gtx-760", "--json")
    assert code == 0, err
    assert json.loads(out)["added"] == 4 and json.loads(out)["model"] == "many-bsp"
    assert "nothing made here is kept" in err
    wrong = write_lines(tmp_path / "wrong.jsonl", flat)
    code, _, err = run("measurements", "add", str(wrong), "--device", "940mx")
    assert code == 2 and f"{wrong}:1: the run is on device 'gtx-760'" in err


def test_the_pipeline_model_option_is_sent_and_recorded(tmp_path: Path, live_server: str) -> None:
    url = ["--url", live_server, "--json", "--folds", "0", "--time-limit-s", "60"]
    runs = write_lines(tmp_path / "runs.jsonl", RUNS[:12])
    code, out, err = run("calibrate", str(runs), "--device", "rtx-a6000",
                         "--pipeline-model", "async-copy", *url)  # fmt: skip
    assert code == 0, err
    made = json.loads(out)
    assert made["pipeline_model"] == "async-copy"
    code, out, err = run("recalibrate", made["device"], "--pipeline-model", "paper", *url)
    assert code == 0, err
    assert json.loads(out)["pipeline_model"] == "paper"
