"""``kperf calibrate --model many-bsp --from-kernel-tuner CACHE.json``: a tuning recorded in the
test becomes Many-BSP runs, posted, and the calibrated profile holds the figures it was timed on.

The tuning: a kernel scaling 65,536 floats, ``block_size_x`` in 32..1024 and ``tile_size_x``
elements per thread, launched with ``grid_div_x = [block_size_x, tile_size_x]``. Its "measured"
times are the core's Many-BSP cycles of each configuration's PTX on the a100 profile with a
hidden mu and launch overheads (tests/app/calibration_helpers), divided by the clock: the
calibration must give those figures back. The PTX comes from a folder the test writes
(straight-line PTX generated here, and ptxas reports: no CUDA toolkit needed), and, where nvcc
is on PATH, from the CUDA source built by the command, checked against nvcc run here with the
defines as ``-D`` flags. Launches are computed here by ceil-division, not by kperf_client.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from device_profiles.loader import PROFILE_DIR
from perfmodel.calibration import predict_many_bsp_cycles
from perfmodel.manybsp import DeviceFigures
from tests.app.calibration_helpers import TRUE_MANY_BSP, core_request, true_many_bsp_figures
from tests.app.service_helpers import clean_environ, live_server
from tests.app.test_cli import run

__all__ = ["clean_environ", "live_server"]

N = 65536
A100_CLOCK_MHZ = 1410.0  # device_profiles/a100.json hardware.clock_mhz
CONFIGS = [(bx, t) for bx in (32, 64, 128, 256, 512, 1024) for t in (1, 2, 4)]
#: fewer for the nvcc test, which compiles each twice (the recipe here, the command)
NVCC_CONFIGS = [(bx, t) for bx in (32, 256, 1024) for t in (1, 2, 4)]
SOURCE = """extern "C" __global__ void scale(const float *in, float *out, int n) {
    int i = (blockIdx.x * block_size_x + threadIdx.x) * tile_size_x;
    #pragma unroll loop_unroll_factor_t
    for (int t = 0; t < tile_size_x; t++) {
        if (i + t < n) {
            out[i + t] = in[i + t] * 3.0f + 1.0f;
        }
    }
}
"""
REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'scale' for 'sm_80'
ptxas info    : Function properties for scale
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used {registers} registers, used 0 barriers, 372 bytes cmem[0]
"""


def straight_line_ptx(tile: int) -> str:
    """The kernel's PTX for ``tile`` elements per thread, unrolled, bounds checks left out."""
    body = []
    for t in range(tile):
        body += [
            f"\tld.global.f32 \t%f{t}, [%rd6+{4 * t}];",
            f"\tfma.rn.f32 \t%f{tile + t}, %f{t}, 0f40400000, 0f3F800000;",
            f"\tst.global.f32 \t[%rd7+{4 * t}], %f{tile + t};",
        ]
    return "\n".join(
        [
            ".version 8.0",
            ".target sm_80",
            ".address_size 64",
            "",
            ".visible .entry scale(",
            "\t.param .u64 scale_param_0,",
            "\t.param .u64 scale_param_1,",
            "\t.param .u32 scale_param_2",
            ")",
            "{",
            "\t.reg .b32 \t%r<5>;",
            f"\t.reg .f32 \t%f<{2 * tile}>;",
            "\t.reg .b64 \t%rd<8>;",
            "",
            "\tld.param.u64 \t%rd1, [scale_param_0];",
            "\tld.param.u64 \t%rd2, [scale_param_1];",
            "\tcvta.to.global.u64 \t%rd3, %rd1;",
            "\tcvta.to.global.u64 \t%rd4, %rd2;",
            "\tmov.u32 \t%r1, %ctaid.x;",
            "\tmov.u32 \t%r2, %ntid.x;",
            "\tmov.u32 \t%r3, %tid.x;",
            "\tmad.lo.s32 \t%r4, %r1, %r2, %r3;",
            f"\tmul.wide.s32 \t%rd5, %r4, {4 * tile};",
            "\tadd.s64 \t%rd6, %rd3, %rd5;",
            "\tadd.s64 \t%rd7, %rd4, %rd5;",
            *body,
            "\tret;",
            "}",
            "",
        ]
    )


def truth() -> DeviceFigures:
    return true_many_bsp_figures(json.loads((PROFILE_DIR / "a100.json").read_text()))


def expected_launch(bx: int, tile: int) -> dict[str, list[int]]:
    return {"grid": [math.ceil(N / (bx * tile)), 1, 1], "block": [bx, 1, 1]}


def configuration_of(run: dict[str, Any]) -> tuple[int, int]:
    """(block_size_x, tile_size_x) of a run: each pair has its own (block, grid)."""
    bx, grid = run["launch"]["block"][0], run["launch"]["grid"][0]
    return bx, N // (bx * grid)


def true_cycles(ptx: str, bx: int, tile: int, registers: int, figures: DeviceFigures) -> float:
    launch = {
        "ptx": ptx,
        "kernel": "scale",
        "launch": expected_launch(bx, tile),
        "resources": {"registers_per_thread": registers, "shared_bytes_per_block": 0},
    }
    return predict_many_bsp_cycles(figures, core_request(launch, figures))


def write_cache(path: Path, times_ms: dict[tuple[int, int], float], unclosed: bool) -> Path:
    """A Kernel Tuner cache as Kernel Tuner writes it while tuning: a header, then one line per
    configuration timed (``times_ms`` 's keys); closed (``}\\n}``) once the tuning ended. Two
    more configurations failed."""
    keys = ["block_size_x", "tile_size_x", "loop_unroll_factor_t"]
    header = {
        "device_name": "NVIDIA A100-PCIE-40GB",
        "kernel_name": "scale",
        "problem_size": [N],
        "tune_params_keys": keys,
        "tune_params": {
            "block_size_x": [32, 64, 128, 256, 512, 1024],
            "tile_size_x": [1, 2, 4],
            "loop_unroll_factor_t": [0],
        },  # fmt: skip
        "objective": "time",
        "cache": {},
    }
    text = json.dumps(header, indent="")[:-3]
    entries: list[tuple[tuple[int, int], dict[str, Any]]]
    entries = [((bx, t), {"block_size_x": bx, "tile_size_x": t, "loop_unroll_factor_t": 0,
                          "time": times_ms[(bx, t)]}) for bx, t in times_ms]  # fmt: skip
    entries += [((bx, 8), {"block_size_x": bx, "tile_size_x": 8, "loop_unroll_factor_t": 0,
                           "time": failure}) for bx, failure in ((32, "InvalidConfig"),
                                                                  (64, 1e20))]  # fmt: skip
    for (bx, t), entry in entries:
        text += "\n" + json.dumps({f"{bx},{t},0": entry})[1:-1] + ","
    if not unclosed:
        text = text[:-1] + "}\n}"
    path.write_text(text)
    return path


def check_runs(runs_file: Path, ptx_of: dict[tuple[int, int], str], times_ms: dict[Any, float],
               registers_of: dict[tuple[int, int], int]) -> list[dict[str, Any]]:  # fmt: skip
    """The runs the command wrote (and sent): each a drawn configuration of the cache with its
    own PTX, Kernel Tuner's launch, its ptxas registers and its time in cycles at the clock."""
    runs = [json.loads(line) for line in runs_file.read_text().splitlines()]
    seen = set()
    for r in runs:
        bx, tile = configuration_of(r)
        seen.add((bx, tile))
        assert r["model"] == "many-bsp" and r["kernel"] == "scale"
        assert r["ptx"] == ptx_of[(bx, tile)]
        assert r["launch"] == expected_launch(bx, tile)
        assert r["resources"] == {"registers_per_thread": registers_of[(bx, tile)],
                                  "shared_bytes_per_block": 0}  # fmt: skip
        assert r["measured_cycles"] == pytest.approx(times_ms[(bx, tile)] * 1e3 * A100_CLOCK_MHZ)
    assert len(seen) == len(runs)
    return runs


def check_fit(answer: dict[str, Any], count: int, floor_bound: bool = True) -> None:
    """The hidden figures recovered; without a run the throughput floor bounds, its efficiency
    is undetermined and stays at its prior median."""
    assert answer["base_device"] == "a100" and answer["model"] == "many-bsp"
    assert answer["measurement_count"] == count
    fitted = {f["name"]: f for f in answer["fitted"]}
    for name, value in TRUE_MANY_BSP.items():
        if name == "throughput_efficiency" and not floor_bound:
            assert not fitted[name]["identifiable"], fitted[name]
            assert fitted[name]["value"] == pytest.approx(fitted[name]["prior"]["median"])
            continue
        assert fitted[name]["identifiable"], fitted[name]
        assert fitted[name]["value"] == pytest.approx(value, rel=0.02)


def test_prebuilt_ptx_calibrates_to_the_hidden_figures(tmp_path: Path) -> None:
    figures = truth()
    folder = tmp_path / "ptx"
    folder.mkdir()
    ptx_of, registers_of, times_ms = {}, {}, {}
    for bx, t in CONFIGS:
        ptx_of[(bx, t)] = straight_line_ptx(t)
        registers_of[(bx, t)] = 8 + 2 * t
        (folder / f"{bx}_{t}_0.ptx").write_text(ptx_of[(bx, t)])
        (folder / f"{bx}_{t}_0.ptxas.txt").write_text(REPORT.format(registers=8 + 2 * t))
        cycles = true_cycles(ptx_of[(bx, t)], bx, t, registers_of[(bx, t)], figures)
        times_ms[(bx, t)] = cycles / A100_CLOCK_MHZ / 1e3
    cache = write_cache(tmp_path / "cache.json", times_ms, unclosed=True)
    runs_file = tmp_path / "runs.jsonl"
    code, out, err = run(
        "calibrate", "--model", "many-bsp", "--device", "a100", "--from-kernel-tuner", str(cache),
        "--ptx-dir", str(folder), "--grid-div-x", "block_size_x,tile_size_x",
        "--configurations", "12", "--seed", "3", "--write-runs", str(runs_file),
        "--folds", "0", "--time-limit-s", "120", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert f"12 of 18 configurations of {cache} (2 failed ones left out)" in err
    check_runs(runs_file, ptx_of, times_ms, registers_of)
    check_fit(json.loads(out), 12)


def _skip_without_nvcc() -> None:
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc/ptxas not on PATH")


def nvcc_recipe(tmp_path: Path, bx: int, tile: int) -> tuple[str, int]:
    """PTX and registers of one configuration, built here: pragma line removed (Kernel Tuner's
    rule for a 0 unroll factor), the defines as -D flags."""
    cu = tmp_path / "recipe.cu"
    cu.write_text(SOURCE.replace("    #pragma unroll loop_unroll_factor_t\n", ""))
    grid = math.ceil(N / bx)  # grid_size_x: problem size over the default divisor
    ptx = tmp_path / "recipe.ptx"
    flags = [f"-Dblock_size_x={bx}", f"-Dtile_size_x={tile}", f"-Dgrid_size_x={grid}"]
    subprocess.run(["nvcc", "-ptx", "-arch=sm_80", *flags, "-Dgrid_size_y=1", "-Dgrid_size_z=1",
                    "-Dblock_size_y=1", "-Dblock_size_z=1", "-Dkernel_tuner=1", str(cu), "-o",
                    str(ptx)], check=True, capture_output=True)  # fmt: skip
    report = subprocess.run(["ptxas", "-v", "-arch=sm_80", str(ptx), "-o", str(tmp_path / "o")],
                            check=True, capture_output=True, text=True).stderr  # fmt: skip
    return ptx.read_text(), int(re.findall(r"Used (\d+) registers", report)[0])


def _code(ptx: str) -> list[str]:
    return [line for line in ptx.splitlines()
            if line.strip() and not line.lstrip().startswith(("//", ".file", ".loc"))]  # fmt: skip


@pytest.mark.nvcc
def test_source_built_with_nvcc_is_posted_and_calibrated(tmp_path: Path, live_server: str) -> None:
    _skip_without_nvcc()
    figures = truth()
    ptx_of, registers_of, times_ms = {}, {}, {}
    for bx, t in NVCC_CONFIGS:
        ptx_of[(bx, t)], registers_of[(bx, t)] = nvcc_recipe(tmp_path, bx, t)
        cycles = true_cycles(ptx_of[(bx, t)], bx, t, registers_of[(bx, t)], figures)
        times_ms[(bx, t)] = cycles / A100_CLOCK_MHZ / 1e3
    cache = write_cache(tmp_path / "cache.json", times_ms, unclosed=False)
    source = tmp_path / "scale.cu"
    source.write_text(SOURCE)
    runs_file = tmp_path / "runs.jsonl"
    code, out, err = run(
        "calibrate", "--model", "many-bsp", "--device", "a100", "--from-kernel-tuner", str(cache),
        "--source", str(source), "--grid-div-x", "block_size_x,tile_size_x",
        "--ptx-cache", str(tmp_path / "built"), "--write-runs", str(runs_file),
        "--folds", "0", "--time-limit-s", "120", "--url", live_server, "--json",
    )  # fmt: skip
    assert code == 0, err
    runs = [json.loads(line) for line in runs_file.read_text().splitlines()]
    for r in runs:  # the command's PTX is the recipe's, up to comments and debug lines
        assert _code(r["ptx"]) == _code(ptx_of[configuration_of(r)])
        ptx_of[configuration_of(r)] = r["ptx"]
    check_runs(runs_file, ptx_of, times_ms, registers_of)
    answer = json.loads(out)
    # 65,536 elements in at most 2,048 blocks: no run reaches the throughput floor
    check_fit(answer, len(NVCC_CONFIGS), floor_bound=False)
    # the service recorded exactly the runs sent, for the calibrated device
    code, listed, err = run("measurements", "list", answer["device"], "--url", live_server)
    assert code == 0, err
    fields = ("model", "ptx", "kernel", "launch", "resources", "measured_cycles")

    def key(r: dict[str, Any]) -> str:
        return json.dumps({name: r.get(name) for name in fields}, sort_keys=True)

    recorded = [json.loads(line) for line in listed.splitlines()]
    assert sorted(map(key, recorded)) == sorted(map(key, runs))


def test_bad_invocations_say_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = write_cache(tmp_path / "cache.json", dict.fromkeys(CONFIGS, 1.0), unclosed=False)
    base = ["calibrate", "--device", "a100", "--from-kernel-tuner", str(cache)]
    code, _, err = run(*base)
    assert code == 2 and "pass --source" in err
    code, _, err = run("calibrate", str(cache), "--device", "a100", "--from-kernel-tuner",
                       str(cache))  # fmt: skip
    assert code == 2 and "either a runs file, --from-kernel-tuner" in err
    code, _, err = run(*base, "--model", "gemm-ws", "--ptx-dir", str(tmp_path))
    assert code == 2 and "--model many-bsp" in err
    (tmp_path / "not-a-cache.json").write_text('{"cache": {}}')
    code, _, err = run("calibrate", "--device", "a100", "--from-kernel-tuner",
                       str(tmp_path / "not-a-cache.json"), "--ptx-dir", str(tmp_path))  # fmt: skip
    assert code == 2 and "tune_params_keys" in err
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = run(*base, "--source", str(tmp_path / "scale.cu"))
    assert code == 2 and "nvcc is not on PATH" in err
