"""Where a certified cache miss spends its time, in process, per Table 1 problem (paper space).

Usage: python -m bench.bench_miss_parts [--repeats N]

Each round solves a new problem (T_INIT moved by a microsecond fraction, as the HTTP bench's
misses are) and times, interleaved: the certificate check as it was (a fresh solver, the whole
encoding parsed, the claim built through the Python API) and as it is (this thread's Z3
session, solver/z3_session.py), then the parts of the optimize job: the exact scorer, the
certificate (bounds, encoding, check; both certificate columns include them), the explore
shortlist, the whole job (request in, encoded answer out). Medians in ms. Last, in a fresh
interpreter: the service process's resident memory after importing app.main, and after the
inline thread's warm-up solve (app/inline.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial

from app.convert.beliefs import gemm_ws_belief
from app.convert.candidates import prepare
from app.jobs import optimize_job
from app.schemas.optimize import OptimizeTilingRequest
from bench.bench_certified import _body, space_ranking
from bench.common import command_line
from perfmodel.gemm_ws import GemmShape, Simulation
from solver import TilingProblem
from solver.bounds import triple_bounds
from solver.encoding import encode_text
from solver.explore import explore_problem
from solver.factory import make_solver
from solver.per_configuration import Instance, ScoredRanking, certify
from solver.problem import better_than
from solver.shortlist import ShortlistMode
from tests.gemm_ws_cases import A6000, TABLE_1, TABLE_1_SPACE


def _fresh_check(problem: TilingProblem, incumbent: Simulation) -> str:
    """The certificate check before sessions: new solver, whole text, Python-API claim."""
    bounds = triple_bounds(
        problem.shape, problem.machine, problem.space, problem.element_bytes, problem.wave_model
    )
    hopeful = [b for b in bounds if b.overall_time_floor_ns <= incumbent.overall_time_ns]
    enc = encode_text(hopeful, problem.space, problem.machine, problem.wave_model).parse()
    solver = make_solver(timeout_ms=30_000)
    solver.from_string(enc.smtlib)
    solver.add(better_than(enc, incumbent))
    return str(solver.check())


def _session_check(instance: Instance, ranking: ScoredRanking, incumbent: Simulation) -> str:
    """The certificate check now: certify() through this thread's Z3 session."""
    deadline = time.perf_counter() + 30
    certificate = certify(instance, incumbent, ranking.hopeful, deadline, ranking.hopeful_floors)
    return certificate.checks[0].outcome


def _timed(times: dict[str, list[float]], name: str, fn: Callable[[], object]) -> object:
    started = time.perf_counter()
    out = fn()
    times.setdefault(name, []).append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(f"command: `{command_line()}`\n")
    print(
        "| problem | certificate before ms (fresh solver) | certificate now ms (session) "
        "| scorer ms | explore ms | whole job ms |"
    )
    print("|---|---|---|---|---|---|")
    counter = iter(range(1, 1_000_000))
    for dims, _ in TABLE_1:
        times: dict[str, list[float]] = {}
        for _ in range(args.repeats + 2):  # the first two rounds warm up, not counted
            t_init = A6000.t_init_us + next(counter) * 1e-6
            machine = dataclasses.replace(A6000, t_init_us=t_init)
            problem = TilingProblem(GemmShape(*dims), machine, TABLE_1_SPACE)
            deadline = time.perf_counter() + 30
            scored = _timed(times, "scorer", partial(space_ranking, problem, deadline))
            instance, ranking, best = scored  # type: ignore[misc]
            before = _timed(times, "before", partial(_fresh_check, problem, best))
            after = _timed(times, "certificate", partial(_session_check, instance, ranking, best))
            assert before == after == "unsat", (before, after)
            _, belief = gemm_ws_belief(None, machine)
            _timed(
                times,
                "explore",
                partial(explore_problem, problem, belief, 1, ShortlistMode.EXPLORE),
            )
            request = OptimizeTilingRequest.model_validate(_body(dims, 1, "certified", t_init))
            body = request.model_dump(mode="json")
            prepared = prepare(request)  # the route's part, before the job
            _timed(times, "job", partial(optimize_job, body, None, prepared, 30.0))
        m = {k: statistics.median(v[2:]) * 1e3 for k, v in times.items()}
        print(
            f"| {dims} | {m['before']:.2f} | {m['certificate']:.2f} | {m['scorer']:.2f} "
            f"| {m['explore']:.2f} | {m['job']:.2f} |"
        )


_RESIDENT = """
import app.main
from app.inline import WARM_UP_REQUEST
from app.jobs import warm_up_job

def resident_mb():
    status = open("/proc/self/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024

before = resident_mb()
warm_up_job(WARM_UP_REQUEST)
print(f"{before:.0f} {resident_mb():.0f}")
"""


def resident_memory() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RESIDENT], capture_output=True, text=True, check=True
    ).stdout.split()
    print(
        f"\nService process resident memory: {out[0]} MB after importing app.main, "
        f"{out[1]} MB after the inline warm-up solve"
    )


if __name__ == "__main__":
    main()
    resident_memory()
