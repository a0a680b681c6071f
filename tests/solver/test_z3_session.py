"""solver/z3_session.py: a reused solver answers as a fresh one does, over the same encoding.

Oracles: a fresh solver given the whole encoding and the Python-API claim (the path the
certificate took before sessions), and the stage-by-stage brute force's ranking.
"""

from __future__ import annotations

import random
import threading

import pytest
import z3

from perfmodel.gemm_ws import GemmShape, Simulation, Tiling
from solver import TilingProblem
from solver.bounds import TripleBound, triple_bounds
from solver.encoding import encode_text
from solver.factory import make_solver
from solver.problem import better_than, better_than_smtlib
from solver.z3_session import Z3Session, session
from tests.gemm_ws_cases import A6000, TABLE_1, TABLE_1_SPACE, brute_force_ranking
from tests.solver.test_certified import _random_case


def _ranking(problem: TilingProblem) -> list[Simulation]:
    return brute_force_ranking(
        problem.shape, problem.machine, problem.space, problem.element_bytes, problem.wave_model
    )


def _hopeful(problem: TilingProblem, incumbent: Simulation) -> list[TripleBound]:
    """The triples certify() encodes: feasible, with a time floor not above the incumbent's."""
    bounds = triple_bounds(
        problem.shape, problem.machine, problem.space, problem.element_bytes, problem.wave_model
    )
    return [
        b
        for b in bounds
        if b.max_buffer_depth is None
        or b.max_buffer_depth >= problem.space.buffer_depth[0]
        and b.overall_time_floor_ns <= incumbent.overall_time_ns
    ]


def _texts(problem: TilingProblem, incumbent: Simulation) -> tuple[str, str]:
    hopeful = _hopeful(problem, incumbent)
    text = encode_text(hopeful, problem.space, problem.machine, problem.wave_model)
    return text.shared, text.specific + "\n" + better_than_smtlib(incumbent)


def _fresh(problem: TilingProblem, incumbent: Simulation) -> str:
    """The certificate as it was checked before sessions: a new solver, the whole text, the
    claim built through the Python API."""
    enc = encode_text(
        _hopeful(problem, incumbent), problem.space, problem.machine, problem.wave_model
    ).parse()
    solver = make_solver(timeout_ms=30_000)
    solver.from_string(enc.smtlib)
    solver.add(better_than(enc, incumbent))
    return str(solver.check())


def test_the_text_claim_is_the_python_claim() -> None:
    """Z3 proves the SMT-LIB claim equivalent to better_than's formula over the encoding's
    variables, for incumbents of several ranks (the tie-break digits included)."""
    problem = TilingProblem(GemmShape(1024, 512, 1024), A6000, TABLE_1_SPACE)
    bounds = triple_bounds(problem.shape, problem.machine, problem.space, 2, problem.wave_model)
    enc = encode_text(bounds, problem.space, problem.machine, problem.wave_model).parse()
    ranking = _ranking(problem)
    for incumbent in (ranking[0], ranking[1], ranking[7], ranking[-1]):
        declarations = "\n".join(
            line for line in enc.smtlib.splitlines() if line.startswith("(declare")
        )
        (text_claim,) = z3.parse_smt2_string(declarations + "\n" + better_than_smtlib(incumbent))
        solver = z3.Solver()
        solver.add(text_claim != better_than(enc, incumbent))
        assert solver.check() == z3.unsat


def test_a_session_answers_as_a_fresh_solver_on_random_problems() -> None:
    """Right and wrong incumbents interleaved on one session: a scope's assertions never leak
    into the next check (a wrong incumbent after a right one is still refuted, and back)."""
    rng = random.Random(7)
    reused = Z3Session()
    seen = {"sat": 0, "unsat": 0}
    for _ in range(120):
        problem, _ = _random_case(rng)
        ranking = _ranking(problem)
        if not ranking:
            continue
        for incumbent in (ranking[0], ranking[rng.randrange(len(ranking))], ranking[0]):
            expected = _fresh(problem, incumbent)
            shared, specific = _texts(problem, incumbent)
            got = reused.check(shared, specific, timeout_ms=30_000)
            assert got.outcome == expected, (problem, incumbent.tiling)
            seen[got.outcome] += 1
            if got.outcome == "sat":
                # the model's configuration beats the incumbent in the optimizer's order
                assert got.tiling is not None
                better = [s.tiling for s in ranking].index(Tiling(*got.tiling))
                assert better < ranking.index(incumbent)
            else:
                assert incumbent is ranking[0] and got.tiling is None
    assert seen["sat"] > 20 and seen["unsat"] > 100
    # the shared parts repeat (a handful of depth sets and windows): solvers were reused
    assert reused.solvers_built < reused.checks / 2


@pytest.mark.parametrize(("problem", "tiling"), TABLE_1)
def test_table_1_certificates_through_one_session(
    problem: tuple[int, int, int], tiling: tuple[int, int, int]
) -> None:
    p = TilingProblem(GemmShape(*problem), A6000, TABLE_1_SPACE)
    ranking = _ranking(p)
    assert (ranking[0].tiling.tile_m, ranking[0].tiling.tile_n, ranking[0].tiling.tile_k) == tiling
    for incumbent, outcome in ((ranking[0], "unsat"), (ranking[1], "sat"), (ranking[0], "unsat")):
        assert session().check(*_texts(p, incumbent), timeout_ms=30_000).outcome == outcome


def test_a_failed_check_drops_its_solver() -> None:
    """A parse error (or an "unknown") leaves the solver in no state to trust: it is rebuilt."""
    problem = TilingProblem(GemmShape(512, 512, 512), A6000, TABLE_1_SPACE)
    best = _ranking(problem)[0]
    shared, specific = _texts(problem, best)
    fresh = Z3Session()
    assert fresh.check(shared, specific, timeout_ms=30_000).outcome == "unsat"
    with pytest.raises(z3.Z3Exception):
        fresh.check(shared, "(assert (= undeclared 1))", timeout_ms=30_000)
    assert fresh.check(shared, specific, timeout_ms=30_000).outcome == "unsat"
    assert fresh.solvers_built == 2


def test_sessions_keep_at_most_their_solver_limit() -> None:
    small = Z3Session(max_solvers=2)
    rng = random.Random(3)
    shared_texts: set[str] = set()
    while len(shared_texts) < 4:
        problem, _ = _random_case(rng)
        ranking = _ranking(problem)
        if not ranking:
            continue
        shared, specific = _texts(problem, ranking[0])
        shared_texts.add(shared)
        assert small.check(shared, specific, timeout_ms=30_000).outcome == "unsat"
    assert len(small._solvers) == 2


def test_each_thread_has_its_own_session_and_context() -> None:
    problems = [TilingProblem(GemmShape(*p), A6000, TABLE_1_SPACE) for p, _ in TABLE_1]
    texts = [(_texts(p, _ranking(p)[0]), _texts(p, _ranking(p)[1])) for p in problems]
    sessions: list[Z3Session] = []
    failures: list[BaseException] = []

    def work() -> None:
        try:
            sessions.append(session())
            for _ in range(5):
                for right, wrong in texts:
                    assert session().check(*right, timeout_ms=30_000).outcome == "unsat"
                    assert session().check(*wrong, timeout_ms=30_000).outcome == "sat"
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len({id(s.context) for s in sessions}) == 3
