"""Triton's vocabulary mapped onto kperf's (kperf_client.triton_configs), on real
``triton.Config`` objects; no service involved."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kperf_client.triton_configs import (
    Problem,
    Tiling,
    TritonNames,
    buffer_depth_of,
    dtype_of,
    measured_runs,
    median_ms,
    problem_from_key,
    problem_of,
    select_groups,
    tiling_and_params,
)

triton = pytest.importorskip("triton")

NAMES = TritonNames()


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("torch.float16", "fp16"),  # torch's str(tensor.dtype)
        ("torch.bfloat16", "bf16"),  # contains "float16": must not read as fp16
        ("torch.float32", "fp32"),
        ("torch.float8_e4m3fn", "fp8"),
        ("torch.float8_e5m2", "fp8"),
        (np.dtype(np.float16), "fp16"),  # numpy's dtype object
        (np.dtype(np.float32), "fp32"),
        ("fp16", "fp16"),  # triton.language's str(tl.float16)
        ("bf16", "bf16"),
        ("fp8e4nv", "fp8"),
        ("torch.int8", None),  # kperf has no integer GEMM
        ("torch.float64", None),
        (np.dtype(np.float64), None),
    ],
)
def test_dtype_names(dtype: object, expected: str | None) -> None:
    assert dtype_of(dtype) == expected


def test_a_configs_tiles_depth_and_params() -> None:
    config = triton.Config(
        {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8},
        num_stages=4,
        num_warps=8,
    )
    tiling, params = tiling_and_params(config.all_kwargs(), NAMES)  # type: ignore[misc]
    assert tiling == Tiling(128, 64, 32, 4)
    # everything else Triton passes the kernel (Config.all_kwargs), untouched
    expected = {k: v for k, v in config.all_kwargs().items() if not k.startswith("BLOCK")}
    del expected["num_stages"]
    assert params == expected and params["num_warps"] == 8 and params["GROUP_SIZE_M"] == 8


def test_the_short_names_and_configured_names() -> None:
    short = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16}, num_stages=2)
    assert tiling_and_params(short.all_kwargs(), NAMES)[0] == Tiling(64, 32, 16, 2)  # type: ignore[index]
    custom = triton.Config({"TM": 16, "TN": 16, "TK": 16, "DEPTH": 5}, num_stages=1)
    names = TritonNames(tile_m=("TM",), tile_n=("TN",), tile_k=("TK",), buffer_depth=("DEPTH",))
    tiling, params = tiling_and_params(custom.all_kwargs(), names)  # type: ignore[misc]
    assert tiling == Tiling(16, 16, 16, 5) and params["num_stages"] == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32},  # no tile_m
        {"BLOCK_SIZE_M": 0, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32},  # not positive
        {"BLOCK_SIZE_M": 64.0, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32},  # not an integer
        {"BLOCK_SIZE_M": True, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32},  # a bool is no size
    ],
)
def test_configs_kperf_cannot_judge(kwargs: dict[str, Any]) -> None:
    assert tiling_and_params(triton.Config(kwargs).all_kwargs(), NAMES) is None


def test_the_problem_of_a_call() -> None:
    a = np.zeros((2, 2), np.float16)
    args = {"a_ptr": a, "b_ptr": a, "c_ptr": np.zeros(1, np.float32), "M": 512, "N": 256}
    assert problem_of({**args, "K": np.int64(1024)}, NAMES, "fp32") == Problem(
        512, 256, 1024, "fp16"
    )
    # the first argument with a dtype decides, unless dtype_args says which
    names = TritonNames(dtype_args=("c_ptr",))
    assert problem_of({**args, "K": 1}, names, "fp16").dtype == "fp32"
    # no tensor argument: the default
    assert problem_of({"M": 1, "N": 2, "K": 3}, NAMES, "bf16") == Problem(1, 2, 3, "bf16")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"M": 1, "N": 2}, "K"),  # missing
        ({"M": 1, "N": 2, "K": 0}, "K"),
        ({"M": 1.5, "N": 2, "K": 3}, "M"),
        ({"M": 1, "N": 2, "K": 3, "a": np.zeros(1, np.int8)}, "a"),  # no kperf dtype
    ],
)
def test_a_call_without_a_gemm_is_refused_naming_the_argument(
    args: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=f"^{named}:"):
        problem_of(args, NAMES, "fp16")


def test_the_problem_of_an_autotuning_key() -> None:
    # Autotuner.run: the key arguments' values in the key's order, then str(arg.dtype) of
    # every argument with a dtype
    key = (1024, 512, 256, "torch.bfloat16", "torch.bfloat16", "torch.float32")
    assert problem_from_key(key, ["N", "M", "K"], NAMES, "fp16") == Problem(512, 1024, 256, "bf16")
    assert problem_from_key((8, 9, 10), ["M", "N", "K"], NAMES, "fp32").dtype == "fp32"
    with pytest.raises(ValueError, match="key_names"):
        problem_from_key((8, 9), ["M", "N"], NAMES, "fp16")


def _brute_force_selection(
    ranked: list[tuple[Tiling, float | None]], top_k: int | None, mass: float | None
) -> list[Tiling]:
    """The shortest prefix of the ranking meeting the stopping rule, by trying every length."""
    for length in range(1, len(ranked) + 1):
        prefix = ranked[:length]
        if top_k is not None and length == top_k:
            return [t for t, _ in prefix]
        if mass is not None and sum(p or 0.0 for _, p in prefix) >= mass:
            return [t for t, _ in prefix]
    return [t for t, _ in ranked]


@given(
    probabilities=st.lists(st.one_of(st.none(), st.floats(0, 1)), min_size=1, max_size=12),
    top_k=st.one_of(st.none(), st.integers(1, 14)),
    mass=st.one_of(st.none(), st.floats(0.01, 1)),
)
def test_selection_is_the_shortest_prefix_meeting_the_rule(
    probabilities: list[float | None], top_k: int | None, mass: float | None
) -> None:
    ranked = [(Tiling(16 * (i + 1), 16, 16, 2), p) for i, p in enumerate(probabilities)]
    kept = select_groups(ranked, top_k, mass)
    assert kept == _brute_force_selection(ranked, top_k, mass)
    assert 1 <= len(kept)


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        ([0.5, 0.4, 0.6], 0.5),  # quantiles (0.5, 0.2, 0.8): the median first
        ((0.25, 0.2, 0.3), 0.25),
        (0.125, 0.125),  # a custom do_bench's single number
        ([math.inf, math.inf, math.inf], None),  # a config that failed to compile or run
        (float("nan"), None),
        ([], None),
        (0.0, None),
    ],
)
def test_median_of_a_timing(timing: Any, expected: float | None) -> None:
    assert median_ms(timing) == expected


def test_measured_runs_one_per_tiling_its_fastest_in_us() -> None:
    problem = Problem(4096, 2048, 1024, "bf16")
    tiles = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64}
    timings = [
        (triton.Config(tiles, num_stages=3, num_warps=4), [0.30, 0.29, 0.31]),
        (triton.Config(tiles, num_stages=3, num_warps=8), [0.20, 0.19, 0.21]),  # same tiling
        (triton.Config(tiles, num_stages=4, num_warps=8), [0.25, 0.24, 0.26]),
        (triton.Config(tiles, num_stages=5, num_warps=8), [math.inf] * 3),  # failed: no run
        (triton.Config({"BLOCK": 64}), [0.1, 0.1, 0.1]),  # not a GEMM config: no run
    ]
    runs = measured_runs(problem, [(c.all_kwargs(), t) for c, t in timings], NAMES)
    by_depth = {run["buffer_depth"]: run for run in runs}
    assert sorted(by_depth) == [3, 4]
    assert by_depth[3]["measured_time_us"] == pytest.approx(200.0)  # ms -> us, the fastest
    assert by_depth[4]["measured_time_us"] == pytest.approx(250.0)
    for run in runs:
        assert (run["m"], run["n"], run["k"], run["dtype"]) == (4096, 2048, 1024, "bf16")
        assert (run["tile_m"], run["tile_n"], run["tile_k"]) == (128, 128, 64)


def test_every_config_of_a_product_maps_back_to_its_tiling() -> None:
    for m, n, k, depth in itertools.product((16, 64), (32, 128), (16, 256), (1, 8)):
        config = triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_stages=depth)
        assert tiling_and_params(config.all_kwargs(), NAMES)[0] == Tiling(m, n, k, depth)  # type: ignore[index]


@pytest.mark.parametrize(
    ("num_stages", "capability", "depth"),
    [
        (3, "7.5", 1),  # Turing: no cp.async, loads are not multi-buffered
        (5, "7.0", 1),
        (1, "8.6", 1),
        (2, "8.0", 1),  # sm_8x: num_stages - 1 buffers
        (4, "8.6", 3),
        (1, "9.0", 1),
        (3, "9.0", 3),  # sm_90 and later: num_stages buffers
        (4, "10.0", 4),
        (3, None, 3),  # unknown GPU: num_stages as given
        (3, "unknown", 3),
    ],
)
def test_buffer_depth_of_num_stages(num_stages: int, capability: str | None, depth: int) -> None:
    assert buffer_depth_of(num_stages, capability) == depth
    config = triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_stages=num_stages)
    mapped = tiling_and_params(config.all_kwargs(), NAMES, capability)
    assert mapped is not None and mapped[0].buffer_depth == depth
    # a depth given under another name is the depth itself
    names = TritonNames(buffer_depth=("DEPTH",))
    own = triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "DEPTH": num_stages})
    assert tiling_and_params(own.all_kwargs(), names, capability)[0].buffer_depth == num_stages  # type: ignore[index]


PAGE = Path(__file__).resolve().parents[2] / "docs" / "triton.md"


def readme_matmul_kernel(tmp_path: Path) -> Any:
    """The Triton page's matmul kernel, alone in a module (the rest of the example needs
    torch and a GPU): ``@triton.jit`` reads its source from a file."""
    section = PAGE.read_text(encoding="utf-8").split("# Triton: prune with kperf")[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    source = next((b for b in blocks if "def matmul_kernel" in b), None)
    assert source is not None, "the Triton page's example is gone"
    tree = ast.parse(source)
    (kernel,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "matmul_kernel"
    ]
    body = ast.get_source_segment(source, kernel)
    path = tmp_path / "readme_matmul.py"
    path.write_text(f"import triton\nimport triton.language as tl\n\n\n@triton.jit\n{body}\n")
    spec = importlib.util.spec_from_file_location("readme_matmul", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.matmul_kernel


@pytest.mark.parametrize(("capability", "num_stages"), [("7.5", 3), ("8.6", 4), ("9.0", 3)])
def test_the_compiler_allocates_buffer_depth_tiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capability: str, num_stages: int
) -> None:
    """Triton compiles the Triton page's kernel for the GPU (no GPU needed: its bundled ptxas) with
    the shared memory of buffer_depth_of(num_stages) A and B tiles of fp16."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # silences a 3.9 notice
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = readme_matmul_kernel(tmp_path)
    tm, tn, tk = 128, 128, 32
    pointers = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16"}
    sizes = dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "stride_cm"), "i32")
    # as Triton's JIT specializes a call with contiguous tensors: unit strides are constants,
    # the pointers and the other integers are multiples of 16
    unit = {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1}
    meta = {"BLOCK_SIZE_M": tm, "BLOCK_SIZE_N": tn, "BLOCK_SIZE_K": tk, "GROUP_SIZE_M": 8}
    constants = {**unit, **meta}
    signature = {**pointers, **sizes, **dict.fromkeys(constants, "constexpr")}
    signature = {name: signature[name] for name in kernel.arg_names}
    aligned = [kernel.arg_names.index(name) for name in (*pointers, *sizes)]
    source = ASTSource(
        kernel,
        signature,
        constexprs=constants,
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    major, minor = map(int, capability.split("."))
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", 10 * major + minor, 32),
        options={"num_stages": num_stages, "num_warps": 4},
    )
    tile_bytes = (tm * tk + tk * tn) * 2
    assert compiled.metadata.shared == buffer_depth_of(num_stages, capability) * tile_bytes
