"""The GPU side of ``kperf table --verify``: time one engine configuration of a block-scaled
fp8 GEMM with Triton (needs ``kperf[triton]``, torch and a CUDA GPU).

The kernel is the form the engines' w8a8 block-fp8 tables configure: C (M x N) = A (M x K,
fp8, one float32 scale per row and K block) times B^T (B: N x K, fp8, one scale per N block
and K block), tiles BLOCK_SIZE_M x BLOCK_SIZE_N x BLOCK_SIZE_K, program ids swizzled in groups
of GROUP_SIZE_M rows of tiles, ``num_warps`` and ``num_stages`` handed to the compiler. Each
K step stays inside one quantization block (BLOCK_SIZE_K divides the block's K, which
/tuning-table enforces). Timed by ``triton.testing.do_bench`` (milliseconds, reported in us).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from kperf_client.models import EngineConfig

#: triton.testing.do_bench reports milliseconds
US_PER_MS = 1000.0


def _torch() -> Any:
    # torch comes with the GPU setup, not with kperf: looked up at run time
    return importlib.import_module("torch")


def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def block_scaled_gemm(  # noqa: PLR0913 - the kernel's arguments
        a: Any,
        b: Any,
        c: Any,
        a_scale: Any,
        b_scale: Any,
        m: Any,
        n: Any,
        k: Any,
        group_n: Any,
        group_k: Any,
        BLOCK_SIZE_M: tl.constexpr,  # noqa: N803 - the engines' names
        BLOCK_SIZE_N: tl.constexpr,  # noqa: N803
        BLOCK_SIZE_K: tl.constexpr,  # noqa: N803
        GROUP_SIZE_M: tl.constexpr,  # noqa: N803
    ) -> None:
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(m, BLOCK_SIZE_M)
        tiles_n = tl.cdiv(n, BLOCK_SIZE_N)
        in_group = GROUP_SIZE_M * tiles_n
        first_m = (pid // in_group) * GROUP_SIZE_M
        rows = tl.minimum(tiles_m - first_m, GROUP_SIZE_M)
        pid_m = first_m + (pid % in_group) % rows
        pid_n = (pid % in_group) // rows
        rm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        rk = tl.arange(0, BLOCK_SIZE_K)
        scales_k = tl.cdiv(k, group_k)
        a_tile = a + rm[:, None] * k + rk[None, :]
        b_tile = b + rn[None, :] * k + rk[:, None]
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for step in range(0, tl.cdiv(k, BLOCK_SIZE_K)):
            left = k - step * BLOCK_SIZE_K
            x = tl.load(a_tile, mask=(rm[:, None] < m) & (rk[None, :] < left), other=0.0)
            w = tl.load(b_tile, mask=(rn[None, :] < n) & (rk[:, None] < left), other=0.0)
            block = (step * BLOCK_SIZE_K) // group_k
            sa = tl.load(a_scale + rm * scales_k + block, mask=rm < m, other=0.0)
            sb = tl.load(b_scale + (rn // group_n) * scales_k + block, mask=rn < n, other=0.0)
            acc += tl.dot(x, w) * sa[:, None] * sb[None, :]
            a_tile += BLOCK_SIZE_K
            b_tile += BLOCK_SIZE_K
        out = c + rm[:, None] * n + rn[None, :]
        tl.store(out, acc.to(c.dtype.element_ty), mask=(rm[:, None] < m) & (rn[None, :] < n))

    return block_scaled_gemm


class TritonBench:
    """Times configurations on this process's CUDA device (operands made once per shape)."""

    def __init__(self, block_shape: tuple[int, int] = (128, 128)) -> None:
        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError(
                "no CUDA GPU here: give --recorded FILE to verify against recorded timings"
            )
        self.block_n, self.block_k = block_shape
        self._kernel = _kernel()
        self._operands: dict[tuple[int, int, int], tuple[Any, ...]] = {}

    def _make(self, m: int, n: int, k: int) -> tuple[Any, ...]:
        torch = _torch()
        if (m, n, k) not in self._operands:
            fp8 = torch.float8_e4m3fn
            a = torch.randn(m, k, device="cuda").clamp(-4, 4).to(fp8)
            b = torch.randn(n, k, device="cuda").clamp(-4, 4).to(fp8)
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            scales_k = -(-k // self.block_k)
            a_scale = torch.rand(m, scales_k, device="cuda") + 0.5
            b_scale = torch.rand(-(-n // self.block_n), scales_k, device="cuda") + 0.5
            self._operands[(m, n, k)] = (a, b, c, a_scale, b_scale)
        return self._operands[(m, n, k)]

    def time_us(self, m: int, n: int, k: int, dtype: str, config: Mapping[str, int]) -> float:
        import triton
        import triton.testing

        if dtype != "fp8":
            raise ValueError(f"dtype: the bench times block-scaled fp8 GEMMs, not {dtype}")
        a, b, c, a_scale, b_scale = self._make(m, n, k)
        tiles = triton.cdiv(m, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"])

        def launch() -> None:
            self._kernel[(tiles,)](
                a,
                b,
                c,
                a_scale,
                b_scale,
                m,
                n,
                k,
                self.block_n,
                self.block_k,
                **{name: config[name] for name in EngineConfig.model_fields},
            )

        return float(triton.testing.do_bench(launch)) * US_PER_MS
