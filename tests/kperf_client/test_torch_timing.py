"""kperf calibrate --from-torch without a GPU: recorded torch.matmul timings become
configuration-less runs (median of the repeats), written as JSON lines kperf reads back."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from kperf_client import cli, torch_timing
from kperf_client.cli import main, read_runs

#: repeats recorded per shape (us); the median is the run's time
RECORDED = {
    shape: [40.0 + i, 10.0 + i, 11.0 + i, 12.0 + i, 10.5 + i]
    for i, shape in enumerate(torch_timing.STANDARD_SHAPES)
}


def _recorded(m: int, n: int, k: int, dtype: str) -> Sequence[float]:
    assert dtype == "tf32"
    return RECORDED[(m, n, k)]


def test_standard_shapes_span_small_large_and_skinny() -> None:
    shapes = torch_timing.STANDARD_SHAPES
    assert len(set(shapes)) == len(shapes) >= 16
    assert min(m * n * k for m, n, k in shapes) <= 256**3
    assert max(k for _, _, k in shapes) >= 65536  # split-K territory


def test_runs_are_the_median_of_the_repeats() -> None:
    runs = torch_timing.runs_from_timings(torch_timing.STANDARD_SHAPES, "tf32", _recorded)
    assert [(r["m"], r["n"], r["k"]) for r in runs] == list(torch_timing.STANDARD_SHAPES)
    assert runs[0]["measured_time_us"] == 11.0  # median of 40, 10, 11, 12, 10.5
    assert all("tile_m" not in r for r in runs)  # configuration-less
    with pytest.raises(ValueError, match="dtype"):
        torch_timing.runs_from_timings([(64, 64, 64)], "int8", _recorded)


def test_cli_from_torch_writes_runs_kperf_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "torch_matmul_timer", lambda: _recorded)
    path = tmp_path / "torch.jsonl"
    out, err = io.StringIO(), io.StringIO()
    argv = ["calibrate", "--from-torch", "--device", "h100", "--write", str(path)]
    assert main(argv, out, err) == 0, err.getvalue()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(torch_timing.STANDARD_SHAPES)
    assert {line["dtype"] for line in lines} == {"tf32"}
    model, runs, _ = read_runs(path, None, "h100")
    assert model == "gemm-ws" and len(runs) == len(lines)


def test_cli_from_torch_without_torch_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> torch_timing.Timer:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(cli, "torch_matmul_timer", missing)
    err = io.StringIO()
    assert main(["calibrate", "--from-torch", "--device", "h100"], io.StringIO(), err) == 2
    assert "torch" in err.getvalue()


def test_cli_from_torch_posts_the_runs_and_the_fit_matches_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # recorded timings: the L2-aware model's optimum on h100 (tf32) under figures it does not
    # know (MATH 20 % slower, launch 50 % longer), written to a file and read back by the timer
    from device_profiles.loader import get_profile
    from device_profiles.memory import memory_model_device
    from perfmodel.calibration.configless import LibraryRun, RunModel, scaled

    shapes = torch_timing.STANDARD_SHAPES[::3]  # 8 of them: a fast fit
    monkeypatch.setattr(torch_timing, "STANDARD_SHAPES", shapes)
    device = memory_model_device(get_profile("h100"), "tf32")
    truth = scaled(device.base, (-0.2, 0.0, 0.0, 0.0, 0.4, 0.0, 0.0, 0.0))
    recorded = tmp_path / "recorded.json"
    recorded.write_text(
        json.dumps(
            [
                [m, n, k, RunModel(LibraryRun(m, n, k, "tf32", 1.0), device, 0).predict_us(truth)]
                for m, n, k in shapes
            ]
        )
    )
    times = {(m, n, k): t for m, n, k, t in json.loads(recorded.read_text())}
    monkeypatch.setattr(cli, "torch_matmul_timer", lambda: lambda m, n, k, d: [times[m, n, k]])
    out, err = io.StringIO(), io.StringIO()
    argv = ["calibrate", "--from-torch", "--device", "h100", "--json"]
    assert main(argv, out, err) == 0, err.getvalue()
    answer = json.loads(out.getvalue())
    assert answer["configless_runs"] == list(range(len(shapes)))
    errors = sorted(abs(r["error_pct"]) for r in answer["residuals"])
    assert errors[len(errors) // 2] < 3.0
