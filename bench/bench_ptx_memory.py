"""Peak memory and time of one /predict-kernel analysis of a 2 MB PTX module, worst cases.

The analysis costs memory and time per instruction, so the worst case at the byte limit is the
most statements the limit admits: one per ``BYTES_PER_STATEMENT`` bytes (app/convert/predict.py),
100,000 at 2 MB. Each shape fills 2 MB with such statements, each padded to that many bytes:

- ``alu``: ``or.b32`` with three register operands (the most operands a short statement holds);
- ``barrier``: ``bar.sync`` (each one a level-2 superstep);
- ``load``: strided global loads (n_ma inferred from the %tid.x stride of each);
- ``branches``: a chain of labels and branches (a basic block each);
- ``loops``: three-statement loops (padded to four statements' bytes), each its own natural
  loop with an unknown trip count;
- ``nested``: loops nested in one another, as deep as the module admits;
- ``reads``: one basic block of ``or.b32`` each reading the register the head defined, ended
  by a branch on their result (the thread-value walk finds each read's definition);
- ``guards``: a chain of branches all guarded by one predicate defined at the top (each
  branch's predicate found for the block classes).

Each run is a fresh interpreter that first answers a small module (imports and caches warm, as
in a worker), then answers the shape as the worker job does (``app.jobs.predict_job``: parse,
model, response encoding; registers given, so ptxas is not run) with the default ``detail``
(``auto``) or ``full``. Reported: the growth of the peak RSS over the warm process (ru_maxrss)
and wall and CPU time, medians over ``--repeats``; the body's size, or a refusal's 422 reason.
``--baseline-root`` runs the same children on another checkout (e.g. main) in the same run,
for the ratio.

Run: .venv/bin/python bench/bench_ptx_memory.py [--repeats 3] [--baseline-root ../main]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 2_000_000
#: statements per module: the cap of app/convert/predict.check_ptx_size at LIMIT_BYTES
BYTES_PER_STATEMENT = 20
STATEMENTS = LIMIT_BYTES // BYTES_PER_STATEMENT

HEAD = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
.reg .pred %p<3>;
.reg .b32 %r<22>;
.reg .b64 %rd<10>;
ld.param.u64 %rd1, [k_param_0];
mov.u32 %r1, %tid.x;
mul.wide.u32 %rd2, %r1, 4;
add.s64 %rd3, %rd1, %rd2;
"""
TAIL = "ret;\n}\n"


def _pad(line: str, statements: int) -> str:
    """``line`` padded with spaces to ``statements`` x BYTES_PER_STATEMENT bytes."""
    width = statements * BYTES_PER_STATEMENT
    if len(line) > width:
        raise ValueError(f"{line!r} is over {width} bytes")
    return line[:-1].ljust(width - 1) + "\n"


def _unit(shape: str, i: int) -> tuple[str, int]:
    """One repeat of ``shape``: its text and its statements."""
    if shape == "alu":
        return _pad("or.b32 %r2,%r2,%r3;\n", 1), 1
    if shape == "barrier":
        return _pad("bar.sync 0;\n", 1), 1
    if shape == "load":
        return _pad(f"ld.global.u32 %r{4 + i % 8},[%rd3+{4 * (i % 16)}];\n", 2), 1
    if shape == "branches":
        return _pad(f"B{i}:bra B{i + 1};\n", 1), 1
    if shape == "reads":
        return _pad("or.b32 %r2,%r2,%r1;\n", 1), 1
    if shape == "guards":
        return _pad(f"B{i}:@%p1 bra B{i + 1};\n", 2), 1
    if shape == "loops":
        text = f"L{i}:add.s32 %r2,%r2,1;\nsetp.lt.s32 %p1,%r2,9;\n@%p1 bra L{i};\n"
        return _pad(text, 4), 3  # a label, two operands and a guard: 4 statements' bytes
    raise ValueError(shape)


def _nested(i: int, n: int) -> tuple[str, int]:
    """The ``i``-th of ``2 n`` lines of ``n`` nested loops: headers, then latches innermost
    first."""
    if i < n:
        return _pad(f"N{i}:or.b32 %r2,%r2,1;\n", 2), 1
    return _pad(f"@%p1 bra N{2 * n - 1 - i};\n", 1), 1


SHAPES = ("alu", "barrier", "load", "branches", "loops", "nested", "reads", "guards")
#: statements a shape opens (first) and closes (last) with, besides HEAD and TAIL
_OPEN = {"guards": "setp.lt.s32 %p1,%r1,9;\n"}
_CLOSE = {"reads": "setp.lt.s32 %p1,%r2,9;\n@%p1 bra E;\nE:\n"}


def module(shape: str, limit_bytes: int = LIMIT_BYTES) -> str:
    """A module of ``shape`` with as many statements as ``limit_bytes`` admits, within it."""
    cap = limit_bytes // BYTES_PER_STATEMENT
    opening, closing = _OPEN.get(shape, ""), _CLOSE.get(shape, "")
    parts = [HEAD, opening]
    size = len(HEAD) + len(TAIL) + len(opening) + len(closing) + 16
    statements = sum(part.count(";") for part in (HEAD, TAIL, opening, closing))
    i = 0
    # nested: as many loops as the bytes and statements admit, each a header and a latch
    n = min(cap // 2, (limit_bytes - size) // (3 * BYTES_PER_STATEMENT))
    while True:
        if shape == "nested" and i == 2 * n:
            break
        text, count = _nested(i, n) if shape == "nested" else _unit(shape, i)
        if statements + count > cap or size + len(text) > limit_bytes - 16:
            break
        parts.append(text)
        size += len(text)
        statements += count
        i += 1
    if shape in ("branches", "guards"):
        parts.append(f"B{i}:\n")
    parts.append(closing)
    parts.append(TAIL)
    return "".join(parts)


#: run in a fresh interpreter whose cwd is the checkout measured
CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, ".")
from app.jobs import predict_job
from device_profiles import get_profile

shape_ptx, detail = sys.stdin.read(), sys.argv[1]
profile = get_profile("rtx-a6000").model_dump(mode="json")

def request(ptx):
    return {"ptx": ptx, "device": "rtx-a6000", "launch": {"grid": [1, 1, 1],
            "block": [128, 1, 1]}, "resources": {"registers_per_thread": 32}, "detail": detail}

warm = sys.argv[2]
predict_job(request(warm), profile, 2_000_000, 1 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
wall, cpu = time.perf_counter(), time.process_time()
try:
    answer = "%d B" % len(predict_job(request(shape_ptx), profile, 2_000_000, 1 << 20).body)
except ValueError as exc:  # a ModelInputError: the service's 422
    answer = "422: " + str(exc)[:60]
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"growth_bytes": peak - before, "wall_s": wall, "cpu_s": cpu,
                  "answer": answer, "warm_bytes": before}))
"""


def measure(ptx: str, detail: str = "auto", root: Path = ROOT, timeout_s: float = 600) -> dict:
    """One child's figures (``{"timeout": True}`` past ``timeout_s``)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, detail, module("alu", 2_000)],
            input=ptx,
            capture_output=True,
            text=True,
            cwd=root,
            timeout=timeout_s,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return {"timeout": True}
    figures: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


def _cell(runs: list[dict], key: str, scale: float, fmt: str) -> str:
    if any(r.get("timeout") for r in runs):
        return "timeout"
    return fmt.format(statistics.median(r[key] for r in runs) / scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--baseline-root", type=Path, default=None)
    ap.add_argument("--timeout-s", type=float, default=300)
    args = ap.parse_args()
    roots = [("this", ROOT)]
    if args.baseline_root is not None:
        roots.append(("baseline", args.baseline_root.resolve()))
    cases = [(shape, "auto") for shape in args.shapes.split(",")] + [("alu", "full")]
    print(
        f"command: .venv/bin/python bench/bench_ptx_memory.py --repeats {args.repeats}"
        + (f" --baseline-root {args.baseline_root}" if args.baseline_root else "")
    )
    columns = "shape | detail | checkout | bytes | statements | peak RSS growth | wall | CPU | body"
    print(f"| {columns} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape, detail in cases:
        ptx = module(shape)
        for name, root in roots:
            runs = []
            for _ in range(args.repeats):
                runs.append(measure(ptx, detail, root, args.timeout_s))
                if runs[-1].get("timeout"):
                    break
            print(
                f"| {shape} | {detail} | {name} | {len(ptx.encode())} | {ptx.count(';')} | "
                f"{_cell(runs, 'growth_bytes', 2**20, '{:.0f} MiB')} | "
                f"{_cell(runs, 'wall_s', 1, '{:.2f} s')} | {_cell(runs, 'cpu_s', 1, '{:.2f} s')} | "
                f"{'timeout' if runs[-1].get('timeout') else runs[-1]['answer']} |",
                flush=True,
            )
    print(f"load average after the runs: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
