"""Time parse + Many-BSP prediction of a 20,000-instruction PTX module (target:
median <= 1 s). Run: ``.venv/bin/python bench/bench_predict.py [--instructions N] [--repeats R]``.

The module is the MM kernel of many-bsp-supplementary.txt Table 4-1 with its unrolled loop
body (two loads, a barrier, 32 shared loads + FMAs, a barrier) repeated until the kernel holds
the requested number of instructions, plus a strided global access every block so that n_ma
inference and the affine analysis run too.
"""

from __future__ import annotations

import argparse
import statistics
import time

from device_profiles import get_profile
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel


def build_module(target_instructions: int) -> str:
    head = [
        ".version 7.0",
        ".target sm_70",
        ".address_size 64",
        ".shared .align 4 .b8 As[4096];",
        ".visible .entry big(.param .u64 big_param_0, .param .u64 big_param_1)",
        "{",
        "\t.reg .pred %p<4>;",
        "\t.reg .b32 %r<64>;",
        "\t.reg .f32 %f<200>;",
        "\t.reg .b64 %rd<64>;",
        "\tld.param.u64 %rd1, [big_param_0];",
        "\tld.param.u64 %rd2, [big_param_1];",
        "\tcvta.to.global.u64 %rd3, %rd1;",
        "\tmov.u32 %r1, %tid.x;",
        "\tmul.wide.u32 %rd4, %r1, 4;",
        "\tadd.s64 %rd5, %rd3, %rd4;",
        "\tmov.u64 %rd6, As;",
        "\tadd.s64 %rd7, %rd6, %rd4;",
        "\tmov.f32 %f1, 0f00000000;",
        "\tmov.u32 %r2, 0;",
    ]
    body: list[str] = []
    n = len(head) - 6
    block = 0
    while n < target_instructions - 4:
        body.append(f"L{block}:")
        body += [
            f"\tld.global.f32 %f2, [%rd5+{4 * block % 4096}];",
            "\tst.shared.f32 [%rd7], %f2;",
            "\tbar.sync 0;",
        ]
        for k in range(32):
            body += [
                f"\tld.shared.f32 %f{3 + k}, [%rd7+{128 * k}];",
                f"\tfma.rn.f32 %f1, %f{3 + k}, %f{3 + k}, %f1;",
            ]
        body += [
            "\tbar.sync 0;",
            "\tadd.s32 %r2, %r2, 1;",
            "\tsetp.lt.s32 %p1, %r2, 4;",
            f"\t@%p1 bra L{block};",
        ]
        n += 3 + 64 + 4
        block += 1
    tail = ["\tst.global.f32 [%rd5], %f1;", "\tret;", "}"]
    return "\n".join(head + body + tail) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instructions", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target-s", type=float, default=1.0, help="median must not exceed")
    args = parser.parse_args()
    ptx = build_module(args.instructions)
    device = device_from_profile(get_profile("gtx-760"))
    request = PredictRequest(
        ptx=ptx,
        device=device,
        grid=(1024, 1, 1),
        block=(256, 1, 1),
        registers_per_thread=32,
    )
    times = []
    result = None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        result = predict_kernel(request)
        times.append(time.perf_counter() - t0)
    assert result is not None
    print(
        f"instructions={len(result.costs)} level1_supersteps={len(result.level1)} "
        f"repeats={args.repeats} median_s={statistics.median(times):.3f} "
        f"min_s={min(times):.3f} max_s={max(times):.3f} "
        f"predicted_cycles={result.estimate.kernel_exec_cycle:.0f}"
    )
    median = statistics.median(times)
    verdict = "PASS" if median <= args.target_s else "FAIL"
    print(f"{verdict}: median {median:.3f} s vs target {args.target_s:.3f} s")
    if median > args.target_s:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
