"""Time the PTX front end on a 20,000-instruction module: parse, CFG and natural loops.

The module repeats the body of the nvcc-generated tiled matmul (two nested loops, barriers,
global and shared loads) with fresh labels until it holds at least 20,000 instructions, in a
single kernel, so the CFG and dominator computations see hundreds of loops. Prints medians over
repeats; the address-stride analysis of every memory instruction is timed separately.

Run: .venv/bin/python bench/bench_ptx_parse.py [--instructions 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodel.ptx import build_cfg, find_loops, parse_module, tid_x_stride_bytes  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "ptx" / "nvcc" / "matmul_tiled.sm_75.ptx"


def build_module(min_instructions: int) -> tuple[str, int]:
    """Module text and its instruction count (one kernel, repeated matmul bodies)."""
    text = FIXTURE.read_text()
    start = text.index("{", text.index(".entry matmul_tiled")) + 1
    end = text.index("\n}", start)
    body = text[start:end]
    decls = "".join(re.findall(r"^\s*\.(?:reg|shared)[^\n]*\n", body, re.M))
    code = re.sub(r"^\s*\.(?:reg|shared)[^\n]*\n", "", body, flags=re.M)
    code = code.replace("\tret;", "")
    per_copy = sum(
        1
        for line in code.splitlines()
        if line.strip()
        and not line.strip().endswith(":")
        and not line.strip().startswith((".", "//"))
    )
    copies = -(-min_instructions // per_copy)
    parts = [re.sub(r"(\$L__BB0_\d+)", rf"\1_c{c}", code) for c in range(copies)]
    head = text[: text.index(".visible .entry matmul_tiled")]
    params = ".param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u32 p3"
    module = head + f".visible .entry big({params})\n{{\n{decls}" + "".join(parts) + "\tret;\n}\n"
    return module, copies * per_copy + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instructions", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    text, expected = build_module(args.instructions)
    front: list[float] = []
    strides: list[float] = []
    n_instr = n_loops = n_blocks = 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        module = parse_module(text)
        fn = module.entry(None)
        blocks = build_cfg(fn)
        loops = find_loops(fn, blocks)
        t1 = time.perf_counter()
        for i, ins in enumerate(fn.instructions):
            if ins.state_space is not None:
                tid_x_stride_bytes(fn, i)
        t2 = time.perf_counter()
        front.append(t1 - t0)
        strides.append(t2 - t1)
        n_instr, n_blocks, n_loops = len(fn.instructions), len(blocks), len(loops)
    if n_instr != expected:
        raise SystemExit(f"built {n_instr} instructions, expected {expected}")
    print(
        f"command: .venv/bin/python bench/bench_ptx_parse.py --instructions {args.instructions} "
        f"--repeats {args.repeats}"
    )
    print(f"module: {n_instr} instructions, {len(text)} bytes, {n_blocks} blocks, {n_loops} loops")
    print(
        f"parse + CFG + loops: median {statistics.median(front) * 1e3:.1f} ms "
        f"(min {min(front) * 1e3:.1f}, max {max(front) * 1e3:.1f}) over {args.repeats} repeats"
    )
    print(
        f"tid.x strides of all memory instructions: median "
        f"{statistics.median(strides) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
