"""bench/measure_gemm.py on a CPU: argument handling, the plan, and that what it writes is
what the calibration loader reads (the GPU timing is replaced by a fake)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import measure_gemm
from perfmodel.calibration import GemmWsMeasurement, load_gemm_ws_jsonl


def test_the_module_imports_without_torch_or_triton() -> None:
    code = "import sys, bench.measure_gemm; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        ([], "--out is required"),
        (["--out", "x.jsonl", "--pairs", "0"], "--pairs must be at least 1"),
        (["--out", "x.jsonl", "--warmup", "-1"], "--warmup must be at least 0"),
        (["--out", "x.jsonl", "--dtype", "fp8"], "invalid choice"),
        (["--dry-run", "--min-dim", "512", "--max-dim", "256"], "--max-dim must be at least"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        measure_gemm.parse_args(argv)
    assert exit_info.value.code == 2
    assert complaint in capsys.readouterr().err


def test_the_plan_is_deterministic_distinct_and_fits_shared_memory() -> None:
    first = measure_gemm.plan(240, seed=3, dtype="fp16", shared_memory_bytes=101376)
    assert first == measure_gemm.plan(240, seed=3, dtype="fp16", shared_memory_bytes=101376)
    assert len(set(first)) == 240
    for c in first:
        assert (c.tile_m * c.tile_k + c.tile_k * c.tile_n) * 2 * c.stages <= 101376
        assert 256 <= min(c.m, c.n, c.k) and max(c.m, c.n, c.k) <= 8192
        assert c.num_warps == (8 if c.tile_m * c.tile_n >= 128 * 128 else 4)
    assert {c.stages for c in first} == set(measure_gemm.STAGES)
    with pytest.raises(ValueError, match="shared memory"):
        measure_gemm.plan(10, seed=0, dtype="fp32", shared_memory_bytes=100)


def test_a_record_reads_back_as_the_measurement_it_describes() -> None:
    config = measure_gemm.Config(1024, 2048, 4096, 128, 64, 32, 3, 4)
    line = measure_gemm.format_record(config, "bf16", [0.5, 0.7, 0.6], {"gpu": "test"})
    (m,) = load_gemm_ws_jsonl([line])
    assert m == GemmWsMeasurement(1024, 2048, 4096, "bf16", 128, 64, 32, 3, 600.0)
    meta = json.loads(line)["meta"]
    assert meta == {"num_warps": 4, "repeats": 3, "min_us": 500.0, "max_us": 700.0, "gpu": "test"}


def test_a_run_with_a_fake_gpu_writes_a_file_the_loader_reads(tmp_path: Path) -> None:
    out = tmp_path / "gemm.jsonl"
    args = measure_gemm.parse_args(["--out", str(out), "--pairs", "12", "--repeats", "3"])

    def fake_time(
        config: measure_gemm.Config, dtype: str, repeats: int, warmup: int
    ) -> list[float]:
        if config.tile_m == 256 and config.tile_n == 256:
            raise RuntimeError("out of resources")  # skipped, as the compiler's refusals are
        return [config.m * config.n * config.k / 1e12] * repeats

    written = measure_gemm.run(args, fake_time, lambda: ({"gpu": "fake"}, 101376))
    loaded = load_gemm_ws_jsonl(out)
    assert len(loaded) == written >= 1
    for m in loaded:
        assert m.measured_time_us == pytest.approx(m.m * m.n * m.k / 1e9)
        assert m.dtype == "fp16"


def test_dry_run_prints_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert measure_gemm.main(["--dry-run", "--pairs", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert set(json.loads(lines[0])) == {
        "m", "n", "k", "tile_m", "tile_n", "tile_k", "stages", "num_warps"
    }  # fmt: skip
