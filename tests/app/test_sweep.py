"""``kperf sweep``: input parsing, the resume journal, retries, and a real interrupted sweep."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kperf_client.sweep import (
    BadLine,
    Journal,
    JournalLocked,
    Shape,
    Sweep,
    SweepOptions,
    read_shapes,
)
from tests.app.service_helpers import A6000, clean_environ, live_server

__all__ = ["clean_environ", "live_server"]

KPERF = [str(Path(sys.executable).with_name("kperf"))]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- input


def test_csv_lines_keep_their_file_line_numbers(tmp_path: Path) -> None:
    source = _write(
        tmp_path / "shapes.csv",
        "m,n,k,dtype,device,search_space\n"
        "1024,512,1024,fp16,rtx-a6000,\n"  # line 2: no search space
        "\n"  # line 3: blank, skipped
        "x,512,1024,fp16,rtx-a6000,\n"  # line 4: m is not a number
        '64,64,64,fp32,v100,"{""tile_m"": [64]}"\n'  # line 5: JSON cell
        "64,64\n",  # line 6: too few cells
    )
    parsed = read_shapes(source)
    assert [(type(p).__name__, p.line) for p in parsed] == [
        ("Shape", 2),
        ("BadLine", 4),
        ("Shape", 5),
        ("BadLine", 6),
    ]
    first, bad_m, with_space, short = parsed
    assert isinstance(first, Shape) and first.problem == {
        "m": 1024,
        "n": 512,
        "k": 1024,
        "dtype": "fp16",
        "device": "rtx-a6000",
    }
    assert isinstance(with_space, Shape)
    assert with_space.problem["search_space"] == {"tile_m": [64]}
    assert isinstance(bad_m, BadLine) and "'m'" in bad_m.reason
    assert isinstance(short, BadLine) and "2 cells" in short.reason


def test_jsonl_rejects_non_objects_and_missing_sizes(tmp_path: Path) -> None:
    source = _write(
        tmp_path / "shapes.jsonl",
        '{"m": 8, "n": 8, "k": 8, "device": "v100"}\n[1, 2, 3]\n{"m": 8, "n": 8}\n{broken\n',
    )
    parsed = read_shapes(source)
    reasons = {p.line: p.reason for p in parsed if isinstance(p, BadLine)}
    assert [p.line for p in parsed if isinstance(p, Shape)] == [1]
    assert set(reasons) == {2, 3, 4}
    assert "object" in reasons[2] and "missing k" in reasons[3] and "not JSON" in reasons[4]


def test_a_csv_without_the_size_columns_is_refused_at_its_header(tmp_path: Path) -> None:
    parsed = read_shapes(_write(tmp_path / "s.csv", "m,n,device\n1,2,v100\n"))
    assert len(parsed) == 1 and isinstance(parsed[0], BadLine) and parsed[0].line == 1


def test_the_same_problem_has_the_same_digest_whatever_its_key_order(tmp_path: Path) -> None:
    parsed = read_shapes(
        _write(tmp_path / "s.jsonl", '{"m": 1, "n": 2, "k": 3}\n{"k": 3, "n": 2, "m": 1}\n')
    )
    digests = {p.digest for p in parsed if isinstance(p, Shape)}
    assert len(digests) == 1


# ---------------------------------------------------------------------------- journal


def test_journal_drops_a_torn_last_line_and_remembers_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    whole = [{"line": n, "input_digest": f"d{n}", "status": "ok"} for n in (1, 2)]
    torn = '{"line": 3, "input_dig'
    path.write_text("".join(json.dumps(r) + "\n" for r in whole) + torn, encoding="utf-8")
    with Journal(path) as journal:
        assert journal.done == {(1, "d1"): "ok", (2, "d2"): "ok"}
        journal.record({"line": 3, "input_digest": "d3", "status": "error"})
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["line"] for line in lines] == [1, 2, 3]


def test_two_sweeps_cannot_write_one_output(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with Journal(path), pytest.raises(JournalLocked), Journal(path):
        pass


# ---------------------------------------------------------------------------- retries


def _shapes(count: int) -> list[Shape]:
    return [Shape(line=i + 1, problem={"m": 64 * (i + 1)}, digest=f"d{i}") for i in range(count)]


def _ok_items(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "items": [
            {"index": i, "status": "ok", "cache": "miss", "result": {"m": p["m"]}}
            for i, p in enumerate(body["problems"])
        ]
    }


def _run_sweep(tmp_path: Path, handler: Any, shapes: list[Shape], **options: Any) -> Any:
    settings = {"urls": ("http://sweep.test",), "backoff_base_s": 0.001, **options}

    async def main() -> Any:
        with Journal(tmp_path / "out.jsonl") as journal:
            sweep = Sweep(SweepOptions(**settings), journal, transport=httpx.MockTransport(handler))
            return await sweep.run(shapes), dict(journal.done)

    return asyncio.run(main())


def test_retry_after_is_honoured_and_every_shape_is_answered_once(tmp_path: Path) -> None:
    calls: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return httpx.Response(503, headers={"Retry-After": "0.3"}, json={"detail": "busy"})
        return httpx.Response(200, json=_ok_items(json.loads(request.content)))

    stats, done = _run_sweep(tmp_path, handler, _shapes(3), batch_size=3)
    assert calls[1] - calls[0] >= 0.3
    assert stats.retries == 1 and stats.answered == 3 and stats.failed == 0
    assert sorted(line for line, _ in done) == [1, 2, 3]


def test_a_422_naming_one_item_answers_it_and_resends_the_others(tmp_path: Path) -> None:
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        problems = json.loads(request.content)["problems"]
        sent.append(len(problems))
        bad = [i for i, p in enumerate(problems) if p["m"] == 128]
        if bad:
            errors = [{"field": f"problems.{bad[0]}.m", "reason": "too small"}]
            return httpx.Response(422, json={"status": 422, "title": "bad", "errors": errors})
        return httpx.Response(200, json=_ok_items({"problems": problems}))

    stats, done = _run_sweep(tmp_path, handler, _shapes(3), batch_size=3)
    assert sent == [3, 2]
    assert done == {(1, "d0"): "ok", (2, "d1"): "error", (3, "d2"): "ok"}
    record = [
        json.loads(line)
        for line in (tmp_path / "out.jsonl").read_text().splitlines()
        if json.loads(line)["line"] == 2
    ][0]
    assert record["error"]["errors"] == [{"field": "m", "reason": "too small"}]


def test_a_batch_out_of_retries_is_not_journalled(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    stats, done = _run_sweep(tmp_path, handler, _shapes(4), batch_size=2, retries=2)
    assert done == {} and stats.failed == 4 and stats.retries == 2 * 2


# ---------------------------------------------------------------------------- real service


def _sweep_command(source: Path, output: Path, url: str, *extra: str) -> list[str]:
    return [*KPERF, "sweep", str(source), "-o", str(output), "--url", url, "--json", *extra]


def test_a_sweep_killed_halfway_resumes_and_answers_every_shape_once(
    tmp_path: Path, live_server: str
) -> None:
    count = 40
    source = tmp_path / "shapes.jsonl"
    source.write_text(
        "".join(
            json.dumps({"m": 256 + 64 * i, "n": 512, "k": 512, "device": A6000}) + "\n"
            for i in range(count)
        ),
        encoding="utf-8",
    )
    output = tmp_path / "out.jsonl"
    first = subprocess.Popen(
        _sweep_command(source, output, live_server, "--batch-size", "2", "--concurrency", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("KPERF_")},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if output.exists() and len(output.read_text().splitlines()) >= 6:
                break
            time.sleep(0.02)
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    answered_first = len(output.read_text().splitlines())
    assert first.returncode == 3, stderr.decode()
    assert 6 <= answered_first < count

    second = subprocess.run(
        _sweep_command(source, output, live_server), capture_output=True, timeout=120
    )
    assert second.returncode == 0, second.stderr.decode()
    summary = json.loads(second.stdout)
    assert summary["skipped"] == answered_first
    assert summary["answered"] == count - answered_first
    lines = [json.loads(line)["line"] for line in output.read_text().splitlines()]
    assert sorted(lines) == list(range(1, count + 1))


def test_bad_lines_are_reported_by_number_and_the_rest_answered(
    tmp_path: Path, live_server: str
) -> None:
    source = _write(
        tmp_path / "shapes.jsonl",
        json.dumps({"m": 512, "n": 512, "k": 512, "device": A6000}) + "\n"
        "{oops\n"
        + json.dumps({"m": 512, "n": 512, "k": 512, "device": "no-such-gpu"})
        + "\n"
        + json.dumps({"m": 1024, "n": 512, "k": 512, "device": A6000})
        + "\n",
    )
    output = tmp_path / "out.jsonl"
    result = subprocess.run(
        _sweep_command(source, output, live_server), capture_output=True, timeout=120
    )
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert f"{source}:2:" in stderr and f"{source}:3:" in stderr and "no-such-gpu" in stderr
    records = {json.loads(r)["line"]: json.loads(r) for r in output.read_text().splitlines()}
    assert {n: r["status"] for n, r in records.items()} == {1: "ok", 3: "error", 4: "ok"}
    assert records[3]["error"]["errors"][0]["field"].endswith("device")
    assert json.loads(result.stdout)["lines_failed"] == [2, 3]
