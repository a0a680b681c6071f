"""The ``kperf`` command line, in-process and against ``kperf serve`` on 127.0.0.1."""

from __future__ import annotations

import io
import json
import signal
import tempfile
from pathlib import Path

import pytest

from kperf_client.cli import main
from tests.app.service_helpers import (
    REPO,
    clean_environ,
    live_server,
    remove_server_log,
    start_server,
)

__all__ = ["clean_environ", "live_server"]

HOTSPOT = REPO / "tests" / "fixtures" / "ptx" / "paper" / "hotspot.ptx"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def table_rows(text: str) -> list[list[str]]:
    """Rows of the first table in ``text`` (after its dashed rule), split on whitespace."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line.replace(" ", "")) == {"-"})
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


@pytest.mark.parametrize("remote", [False, True], ids=["in-process", "uvicorn"])
def test_optimize_table_matches_json(remote: bool, request: pytest.FixtureRequest) -> None:
    url = ["--url", request.getfixturevalue("live_server")] if remote else []
    args = ["optimize", "--m", "2048", "--n", "1024", "--k", "512", "--device", "rtx-a6000"]
    code, table, _ = run(*args, *url)
    assert code == 0
    code, text, _ = run(*args, *url, "--json")
    assert code == 0
    document = json.loads(text)
    rows = [row for row in table_rows(table) if row[0].isdigit()]
    assert table.splitlines()[-1] == "figures: published; shortlist: explore"
    assert len(rows) == len(document["candidates"])
    for row, candidate in zip(rows, document["candidates"], strict=True):
        rank, tm, tn, tk, depth, group_m, split_k, time_us = row[:8]
        assert int(rank) == candidate["rank"]
        assert (int(tm), int(tn), int(tk), int(depth), int(group_m), int(split_k)) == (
            candidate["tile_m"],
            candidate["tile_n"],
            candidate["tile_k"],
            candidate["buffer_depth"],
            candidate["group_m"],
            candidate["split_k"],
        )
        assert float(time_us) == pytest.approx(candidate["predicted_time_us"], abs=0.05)
        assert float(row[9]) == pytest.approx(candidate["probability_best"], abs=0.005)


@pytest.mark.parametrize("model", ["paper", "async-copy"])
def test_optimize_table_shows_the_pipeline_model_and_residency(model: str) -> None:
    args = ["optimize", "--m", "4096", "--n", "4096", "--k", "4096", "--device", "h100"]
    args += ["--pipeline-model", model, "--top-k", "3"]
    code, table, _ = run(*args)
    assert code == 0
    code, text, _ = run(*args, "--json")
    document = json.loads(text)
    assert document["pipeline_model"] == model
    assert f"(fp16, {model}, {document['memory_model']})" in table.splitlines()[0]
    rows = [row for row in table_rows(table) if row[0].isdigit()]
    assert len(rows) == len(document["candidates"])
    for row, candidate in zip(rows, document["candidates"], strict=True):
        ctas, stages, in_flight, bound = row[-4:]
        assert (int(ctas), int(stages), int(in_flight), bound) == (
            candidate["ctas_per_sm"],
            candidate["stages"],
            candidate["stages_in_flight"],
            candidate["bound"],
        )


def test_devices_list_and_detail(live_server: str) -> None:
    code, table, _ = run("devices", "--url", live_server)
    assert code == 0
    ids = [row[0] for row in table_rows(table)]
    code, text, _ = run("devices", "--url", live_server, "--json")
    assert ids == [d["id"] for d in json.loads(text)["devices"]]
    code, detail, _ = run("devices", "rtx-a6000", "--url", live_server)
    assert code == 0 and "hardware.sm_count" in detail and "84" in detail


def test_devices_show_names_and_priors(live_server: str) -> None:
    """Uncertainty: the listing shows each calibrated profile's names; a profile's detail shows
    each figure's prior and whether its value is an estimate."""
    import httpx

    from tests.app.calibration_helpers import gemm_ws_runs

    answer = httpx.post(
        f"{live_server}/calibrate",
        json={"model": "gemm-ws", "base_device": "h100", "measurements": gemm_ws_runs()[:6],
              "name": "cli-named-gpu"},
        timeout=60,
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    code, table, _ = run("devices", "--url", live_server)
    rows = {row[0]: row for row in table_rows(table)}
    assert code == 0 and rows[answer.json()["device"]][1] == "cli-named-gpu"
    code, detail, _ = run("devices", "h100", "--url", live_server)
    line = next(x for x in detail.splitlines() if x.startswith("gemm_ws.t_init_us"))
    assert "(estimate)" in line and "x/ e^0.5" in line


def test_device_detail_names_what_to_calibrate(live_server: str) -> None:
    code, detail, _ = run("devices", "h100", "--url", live_server)
    assert code == 0 and "many-bsp: uncalibrated-estimates" in detail
    assert "many_bsp.mu" in detail
    assert "kperf calibrate runs.jsonl --model many-bsp --device h100" in detail


def test_errors_show_the_field_and_exit_1() -> None:
    code, out, err = run("optimize", "--m", "0", "--n", "1", "--k", "1", "--device", "rtx-a6000")
    assert code == 1 and out == ""
    assert "HTTP 422" in err and "  m: " in err
    code, out, _ = run("optimize", "--m", "1", "--n", "1", "--k", "1", "--device", "nope", "--json")
    assert code == 1
    assert json.loads(out)["errors"][0]["field"] == "device"


def test_batch_shows_progress_and_keeps_order(tmp_path: Path, live_server: str) -> None:
    problems = [{"m": 256 * (i + 1), "n": 512, "k": 512, "device": "rtx-a6000"} for i in range(5)]
    problems[3]["device"] = "nope"
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in problems) + "\n")
    code, out, err = run("batch", str(path), "--chunk-size", "2", "--url", live_server, "--json")
    assert code == 1  # one item failed
    assert "[2/5]" in err and "[4/5]" in err and "[5/5] solved, 1 failed" in err
    items = json.loads(out)["items"]
    assert [i["index"] for i in items] == [0, 1, 2, 3, 4]
    assert [i["status"] for i in items] == ["ok", "ok", "ok", "error", "ok"]
    assert items[3]["error"]["errors"][0]["field"] == "problems.1.device"  # within its chunk


def test_predict_table_and_json_agree(live_server: str) -> None:
    args = [
        "predict", str(HOTSPOT), "--device", "gtx-760", "--grid", "43,43", "--block", "16x16",
        "--registers-per-thread", "34", "--shared-bytes-per-block", "3072",
        "--trip-count", "BB0_4=2", "--url", live_server,
    ]  # fmt: skip
    code, table, _ = run(*args)
    assert code == 0
    code, text, _ = run(*args, "--json")
    document = json.loads(text)
    fields = {row[0]: row[1] for row in table_rows(table) if len(row) == 2}
    assert float(fields["predicted_cycles"]) == pytest.approx(document["predicted_cycles"])
    assert int(fields["n_b"]) == 43 * 43 and int(fields["n_t"]) == 256


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as info:
        run("predict", str(HOTSPOT), "--device", "gtx-760", "--grid", "a,b", "--block", "1")
    assert info.value.code == 2


def test_serve_takes_its_address_from_the_environment_and_exits_0_on_sigterm(
    tmp_path: Path,
) -> None:
    # as in the container: KPERF_HOST / KPERF_PORT, no flags; `docker stop` sends SIGTERM, and
    # a graceful stop is a success (exit 0, not 143 as uvicorn's re-raised signal would give)
    env = {"KPERF_LOG_LEVEL": "INFO", "KPERF_CACHE_PATH": str(tmp_path / "cache.sqlite3")}
    proc, url = start_server(env, address_in_env=True)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    port = url.rsplit(":", 1)[1]
    log = (Path(tempfile.gettempdir()) / f"kperf-test-server-{port}.log").read_text()
    remove_server_log(url)
    assert "service stopped" in log  # the lifespan shutdown ran: worker pool and cache closed


def test_batch_names_each_bad_line_and_sends_nothing(tmp_path: Path) -> None:
    # the JSON lines are read as `kperf sweep` reads them: comments skipped, lines numbered
    path = tmp_path / "problems.jsonl"
    path.write_text(
        "# shapes\n"
        '{"m": 256, "n": 256, "k": 256, "device": "rtx-a6000"}\n'
        '{"m": 256, "n": 256\n'
        '{"n": 256, "k": 256}\n'
    )
    code, out, err = run("batch", str(path))
    assert code == 2 and out == ""
    assert f"{path}:3: not JSON" in err
    assert f"{path}:4: missing m" in err
    assert "nothing sent" in err
