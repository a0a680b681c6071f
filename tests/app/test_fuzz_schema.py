"""Schema fuzzing: schemathesis drives every operation of the OpenAPI document.

A bounded run against a real ``kperf serve`` on 127.0.0.1: no 5xx except the deliberate
503/504, and every response (status code, content type, body) matches the documented schema.
(schemathesis' own pytest plugin does not run under this pytest version, so the operations
are iterated here, each with a hypothesis ``@given`` over its strategy.)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from app.auth import hash_token
from app.settings import Settings
from tests.app.service_helpers import clean_environ, start_server, stop_server

__all__ = ["clean_environ"]

#: short solves keep the run bounded: a body without time_limit_s gets the default, larger
#: ones get a documented 422, and big search spaces are refused before solving
FUZZ_SERVER_ENV = {
    "KPERF_WORKERS": "2",
    "KPERF_LOG_LEVEL": "INFO",  # the access log, kept in the temp dir for post-mortems
    "KPERF_DEFAULT_TIME_LIMIT_S": "0.5",
    "KPERF_MAX_BATCH_ITEMS": "4",
}
#: time_limit_s of generated problems is clamped to this, so each solve ends within ~0.7 s
FUZZ_TIME_LIMIT_S = 0.5
#: the servers' maximum time_limit_s (the default setting), which the schema states
MAX_LIMIT_S = float(Settings.model_fields["max_time_limit_s"].default)


def _steer(problem: object, use_known_device: bool) -> None:
    """Keep a generated problem short, and point it at a real profile half of the time.

    Random device ids are almost never known profiles: without this, every problem would stop
    at the 422 for an unknown device and the solver path would go unfuzzed.
    """
    if not isinstance(problem, dict):
        return
    limit = problem.get("time_limit_s")
    # a limit above the server's maximum stays: it must be refused, with no solve
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit <= MAX_LIMIT_S:
        problem["time_limit_s"] = min(limit, FUZZ_TIME_LIMIT_S)
    if use_known_device and isinstance(problem.get("device"), str):
        problem["device"] = "rtx-a6000"


def _integral_floats_as_ints(node: Any) -> Any:
    """``28.0`` -> ``28`` throughout a generated body.

    JSON Schema counts 28.0 as an integer; this service deliberately does not (README: a float where
    an integer belongs is a 422, never coerced), which no schema keyword can say. An integer is
    accepted wherever a float belongs, so the rewrite keeps every generated body schema-valid.
    """
    if isinstance(node, float) and node.is_integer() and abs(node) < 2**53:
        return int(node)
    if isinstance(node, list):
        return [_integral_floats_as_ints(item) for item in node]
    if isinstance(node, dict):
        return {key: _integral_floats_as_ints(value) for key, value in node.items()}
    return node


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[str]:
    proc, url = start_server(FUZZ_SERVER_ENV)
    try:
        yield url
    finally:
        stop_server(proc)


#: the admin token of :func:`token_server`
FUZZ_TOKEN = "fuzz-admin-token"


@pytest.fixture(scope="module")
def token_server() -> Iterator[str]:
    """A server run for a team: a tokens file, and tokens required for reads too."""
    with tempfile.TemporaryDirectory(prefix="kperf-fuzz-") as directory:
        tokens = Path(directory) / "tokens"
        tokens.write_text(f"{hash_token(FUZZ_TOKEN)} fuzz admin\n", encoding="utf-8")
        env = {**FUZZ_SERVER_ENV, "KPERF_TOKENS_FILE": str(tokens), "KPERF_AUTH_READS": "true"}
        proc, url = start_server(env)
        try:
            yield url
        finally:
            stop_server(proc)


#: every check schemathesis has (``--checks all``) but two, done here instead: "no 5xx"
#: (allowing the deliberate 503/504) and "positive data acceptance" (below)
EXCLUDED_CHECKS = [checks.not_a_server_error, checks.positive_data_acceptance]
#: 422s that a schema-valid input may still get: rules on content no JSON schema can state
#: (the PTX text must parse, a device id must exist and serve the model, a space must hold
#: a feasible tiling, the server's own configured limits). Any other 422 to a schema-valid
#: input (pydantic's "Invalid request") is a contract mismatch: the schema must say it
#: (the hardening pass found six).
DOMAIN_422_TYPES = {
    "invalid-ptx",
    "unknown-device",
    "model-not-served-by-device",
    # a dtype the device has no GEMM rate for (its gemm_ws_dtypes)
    "dtype-not-served-by-device",
    "infeasible-search-space",
    "invalid-search-space",
    "memory-limit-exceeded",
    # lists whose lengths must agree (a posterior's mean, covariance and figures)
    "inconsistent-lengths",
    # runs no figures within the priors' range predict in finite time (a fit's overflow)
    "unfittable-measurements",
    # a tuning table's file is named after the GPU's CUDA name, which the server must know
    "unknown-device-name",
    # configuration-less runs the base cannot fit (no memory figures, no rate for the dtype,
    # mixed element types in one set)
    "configless-runs-refused",
}


def _check_positive_acceptance(case: Any, response: Any) -> None:
    meta = case.meta
    if case.operation.label in POSITIVE_CHECK_OPEN:
        return
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return
    problem = response.json()
    kind = str(problem.get("type", "")).rsplit("/", 1)[-1]
    assert kind in DOMAIN_422_TYPES, (
        f"{case.operation.label}: a schema-valid input refused: {response.text[:800]}\n"
        f"body: {case.body!r:.1500}\nquery: {case.query!r}"
    )


#: examples per operation; the whole run stays well under a minute on 2 cores (~10 s idle)
MAX_EXAMPLES = 20


#: fewer examples where each one solves several problems
EXAMPLES_PER_OPERATION = {
    "POST /optimize-tiling/batch": 8,
    "POST /predict-kernel": 6,
    # each example fits a model (a solve per run, several folds)
    "POST /calibrate": 5,
    # each example solves one problem per key (up to 64)
    "POST /tuning-table": 8,
}
#: operations whose positive-data check is still open (the other checks still run on them)
POSITIVE_CHECK_OPEN: set[str] = set()


def _fuzz(
    operation: schemathesis.APIOperation,
    base_url: str,
    headers: dict[str, str] | None = None,
    max_examples: int | None = None,
) -> None:
    examples = EXAMPLES_PER_OPERATION.get(operation.label, MAX_EXAMPLES)

    @given(data=st.data())
    @settings(
        max_examples=examples if max_examples is None else min(examples, max_examples),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(data: st.DataObject) -> None:
        case = data.draw(operation.as_strategy())
        if isinstance(case.body, dict | list):
            case.body = _integral_floats_as_ints(case.body)
        body = case.body
        known = data.draw(st.booleans())
        if isinstance(body, dict) and isinstance(body.get("problems"), list):
            for item in body["problems"]:
                _steer(item, known)
        elif operation.path == "/optimize-tiling":
            _steer(body, known)
        response = case.call(base_url=base_url, timeout=30, headers=headers)
        assert response.status_code not in (500, 501, 502), (
            f"{operation.label}: {response.status_code} {response.text[:500]}"
        )
        case.validate_response(response, excluded_checks=EXCLUDED_CHECKS)
        _check_positive_acceptance(case, response)

    check()


def _operations(base_url: str) -> list[schemathesis.APIOperation]:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {op.label for op in operations}
    assert {"POST /optimize-tiling", "POST /optimize-tiling/batch", "GET /readyz"} <= labels
    # text/plain exposition format, checked in test_service_observability
    return [op for op in operations if op.path != "/metrics"]


@pytest.mark.slow
def test_every_operation_answers_per_its_schema(fuzz_server: str) -> None:
    for operation in _operations(fuzz_server):
        _fuzz(operation, fuzz_server)


#: examples per operation on the server run for a team: its answers differ from the open
#: server's only by the token checks, which the first examples reach (without a token every
#: answer but the health checks' is the same 401)
TOKEN_EXAMPLES = {True: 5, False: 3}


@pytest.mark.slow
@pytest.mark.parametrize("with_token", [True, False], ids=["token", "no-token"])
def test_with_tokens_every_operation_answers_per_its_schema(
    token_server: str, with_token: bool
) -> None:
    """The same on a server with a tokens file and KPERF_AUTH_READS: with the admin token
    every operation answers as on the open server (schemathesis' ignored_auth check also
    sends each one without and with a wrong token: a 401 each time); without one, every
    operation but the health checks is a documented 401."""
    operations = _operations(token_server)
    secured = [op for op in operations if op.definition.raw.get("security")]
    assert len(secured) == len(operations) - 2  # all but /healthz and /readyz
    headers = {"Authorization": f"Bearer {FUZZ_TOKEN}"} if with_token else None
    for operation in operations:
        _fuzz(operation, token_server, headers, TOKEN_EXAMPLES[with_token])
