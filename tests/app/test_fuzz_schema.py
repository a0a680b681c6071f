"""Schema fuzzing: schemathesis drives every operation of the OpenAPI document.

A bounded run against a real ``kperf serve`` on 127.0.0.1: no 5xx except the deliberate
503/504, and every response (status code, content type, body) matches the documented schema.
(schemathesis' own pytest plugin does not run under this pytest version, so the operations
are iterated here, each with a hypothesis ``@given`` over its strategy.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

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


def _steer(problem: object, use_known_device: bool) -> None:
    """Keep a generated problem short, and point it at a real profile half of the time.

    Random device ids are almost never known profiles: without this, every problem would stop
    at the 422 for an unknown device and the solver path would go unfuzzed.
    """
    if not isinstance(problem, dict):
        return
    limit = problem.get("time_limit_s")
    if isinstance(limit, int | float) and not isinstance(limit, bool):
        problem["time_limit_s"] = min(limit, FUZZ_TIME_LIMIT_S)
    if use_known_device and isinstance(problem.get("device"), str):
        problem["device"] = "rtx-a6000"


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[str]:
    proc, url = start_server(FUZZ_SERVER_ENV)
    try:
        yield url
    finally:
        stop_server(proc)


#: a schema-valid body may still be refused by domain rules (unknown device, empty range):
#: a 4xx there is correct. 5xx is checked above, allowing the deliberate 503/504.
EXCLUDED_CHECKS = [checks.positive_data_acceptance, checks.not_a_server_error]

#: examples per operation; the whole run stays well under a minute on 2 cores
MAX_EXAMPLES = 100


def _fuzz(operation: schemathesis.APIOperation, base_url: str) -> None:
    @given(data=st.data())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(data: st.DataObject) -> None:
        case = data.draw(operation.as_strategy())
        body = case.body
        known = data.draw(st.booleans())
        if isinstance(body, dict) and isinstance(body.get("problems"), list):
            for item in body["problems"]:
                _steer(item, known)
        elif operation.path == "/optimize-tiling":
            _steer(body, known)
        response = case.call(base_url=base_url, timeout=30)
        assert response.status_code not in (500, 501, 502), (
            f"{operation.label}: {response.status_code} {response.text[:500]}"
        )
        case.validate_response(response, excluded_checks=EXCLUDED_CHECKS)

    check()


@pytest.mark.slow
def test_every_operation_answers_per_its_schema(fuzz_server: str) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {op.label for op in operations}
    assert {"POST /optimize-tiling", "POST /optimize-tiling/batch", "GET /readyz"} <= labels
    for operation in operations:
        if operation.path == "/metrics":
            continue  # text/plain exposition format, checked in test_service_observability
        _fuzz(operation, fuzz_server)
