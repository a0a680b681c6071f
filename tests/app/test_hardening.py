"""The hardening list: strict JSON bodies, the contract mismatches schemathesis
found, and what the service leaks. Each case failed before it was fixed."""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import json
import re
from typing import Any

import pytest

from app.errors import BodyDecodeError
from app.routes.json_body import decode_json_body
from kperf_client.client import KperfClient
from tests.app.service_helpers import (
    clean_environ,
    free_port,
    in_app,
    make_settings,
    problem,
    server_log_path,
    start_server,
    stop_server,
)

__all__ = ["clean_environ"]

JSON = "application/json"
SMALL_BODY = json.dumps(problem())

#: (body bytes, content-type, status, field named, a phrase of the reason); one per rule
BODY_CASES: list[tuple[bytes, str, int, str, str]] = [
    # the example: the last "device" would have won
    (
        b'{"m": 1024, "n": 1024, "k": 1024, "device": "nope", "device": "rtx-a6000"}',
        JSON,
        422,
        "device",
        "'device' given twice",
    ),
    # a duplicate inside a nested object is named by its dotted path
    (
        b'{"m": 1024, "n": 1024, "k": 1024, "device": "rtx-a6000",'
        b' "search_space": {"tile_m": [16], "tile_m": [32]}}',
        JSON,
        422,
        "search_space.tile_m",
        "given twice",
    ),
    # a declared non-UTF-8 charset: JSON is UTF-8 (RFC 8259 §8.1)
    (SMALL_BODY.encode(), "application/json; charset=latin-1", 415, "content-type", "latin-1"),
    # text and form bodies are the wrong media type, not wrong fields
    (SMALL_BODY.encode(), "text/plain", 415, "content-type", "text/plain"),
    (b"m=1024&n=1024", "application/x-www-form-urlencoded", 415, "content-type", "urlencoded"),
    # a parse error says where: line 2, column 7 is the "}" where a value was expected
    (b'{"m": 1024,\n "n": }', JSON, 422, "body", "line 2, column 7"),
    # undecodable bytes
    (b'{"device": "\xff"}', JSON, 400, "body", "not UTF-8"),
]


def test_strict_json_bodies() -> None:
    async def scenario(client: KperfClient) -> list[tuple[int, list[dict[str, Any]]]]:
        out = []
        for body, content_type, _, _, _ in BODY_CASES:
            response = await client.http.post(
                "/optimize-tiling", content=body, headers={"content-type": content_type}
            )
            assert response.headers["content-type"] == "application/problem+json"
            out.append((response.status_code, response.json()["errors"]))
        # still accepted: charset=UTF-8 in any spelling, and +json media types
        for content_type in ("application/json; charset=UTF-8", "application/problem+json"):
            response = await client.http.post(
                "/optimize-tiling", content=SMALL_BODY, headers={"content-type": content_type}
            )
            assert response.status_code == 200, response.text
        return out

    for (_, _, status, field, phrase), (got, errors) in zip(
        BODY_CASES, in_app(scenario), strict=True
    ):
        assert got == status, errors
        assert errors[0]["field"] == field
        assert phrase in errors[0]["reason"]


def test_parse_error_position_matches_the_text() -> None:
    # property: the line and column given point at the character the parser stopped on
    text = '{\n  "m": 1024,\n  "n": [1, 2,,]\n}'
    with pytest.raises(BodyDecodeError) as caught:
        decode_json_body(text.encode())
    reason = caught.value.reason
    line, column = (int(x) for x in reason.split("line ")[1].split(" (")[0].split(", column "))
    assert text.splitlines()[line - 1][column - 1] == ","


def test_options_lists_every_method_of_the_path() -> None:
    async def scenario(client: KperfClient) -> tuple[int, str]:
        response = await client.http.options("/devices/rtx-a6000/measurements")
        return response.status_code, response.headers["allow"]

    status, allow = in_app(scenario)
    assert status == 405
    assert {m.strip() for m in allow.split(",")} >= {"GET", "POST"}


@pytest.mark.parametrize("path", ["/devices", "/devices/rtx-a6000"])
def test_json_only_routes_refuse_svg_with_406(path: str) -> None:
    async def scenario(client: KperfClient) -> tuple[int, int]:
        svg = await client.http.get(path, headers={"accept": "image/svg+xml"})
        either = await client.http.get(path, headers={"accept": "image/svg+xml, */*;q=0.1"})
        return svg.status_code, either.status_code

    assert in_app(scenario) == (406, 200)


def test_html_pages_load_nothing_from_outside_and_send_security_headers() -> None:
    async def scenario(client: KperfClient) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path in ("/", "/docs", "/redoc"):
            response = await client.http.get(path)
            assert response.status_code == 200, path
            references = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']+)', response.text)
            for url in references:
                if url.startswith("/"):
                    asset = await client.http.get(url)
                    assert asset.status_code == 200, url
                    assert asset.headers["x-content-type-options"] == "nosniff"
            out[path] = (response.text, dict(response.headers), references)
        out["json"] = dict((await client.http.get("/healthz")).headers)
        return out

    pages = in_app(scenario)
    for path in ("/", "/docs", "/redoc"):
        text, headers, references = pages[path]
        assert not [u for u in references if "//" in u], f"{path} loads from outside"
        assert "googleapis" not in text and "cdn" not in text.lower()
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        policy = headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
        # every inline script of the page runs: its hash is in the policy (CSP Level 3)
        for body in re.findall(r"<script>(.*?)</script>", text, re.DOTALL):
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in policy, path
    api = pages["json"]
    assert api["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in api["content-security-policy"]


def test_readyz_lists_no_worker_pids_by_default() -> None:
    async def scenario(client: KperfClient) -> dict[str, Any]:
        body: dict[str, Any] = (await client.http.get("/readyz")).json()
        return body

    body = in_app(scenario)
    assert body["workers"] and all(w["pid"] is None for w in body["workers"])
    opted_in = in_app(scenario, make_settings(readyz_worker_pids=True))
    assert all(isinstance(w["pid"], int) for w in opted_in["workers"])


def test_store_errors_do_not_name_the_store_address() -> None:
    port = free_port()  # nothing listens there: every Redis call fails at once

    async def scenario(client: KperfClient) -> list[str]:
        texts = [(await client.http.get("/readyz")).text]
        for _ in range(2):  # the first failure, then the circuit breaker's message
            answer = await client.http.get("/devices/rtx-a6000-cal-0123456789ab")
            assert answer.status_code == 503, answer.text
            texts.append(answer.text)
        return texts

    texts = in_app(scenario, make_settings(store_url=f"redis://127.0.0.1:{port}/0"))
    assert "degraded: store" in texts[0]
    for text in texts:
        assert str(port) not in text and "127.0.0.1" not in text, text


def test_pool_background_failure_at_shutdown_is_retrieved() -> None:
    """A replacement that fails once the loop's executor is shut down ("cannot schedule new
    futures after shutdown") was logged by asyncio as "Task exception was never retrieved"."""
    from app.pool import WorkerPool

    reported: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
        pool = WorkerPool(1, 1)

        async def replace_after_shutdown() -> None:
            raise RuntimeError("cannot schedule new futures after shutdown")

        pool._background(replace_after_shutdown())
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        await pool.stop()

    asyncio.run(main())
    gc.collect()
    assert reported == []


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        (459038.7041269841, "459038.7041"),  # the examples
        (30.560000000000002, "30.56"),
        (80.0, "80"),
        (1e-7, "1e-07"),  # small figures keep their digits
        (7, "7"),
        ("rtx-a6000", "rtx-a6000"),
    ],
)
def test_cli_table_cells_print_floats_without_binary_noise(value: Any, cell: str) -> None:
    from kperf_client.cli import _table

    assert _table(("v",), [(value,)]).splitlines()[2] == cell


def test_stopped_test_server_leaves_no_log_behind() -> None:
    proc, url = start_server()
    log = server_log_path(url.rsplit(":", 1)[1])
    assert log.exists()
    stop_server(proc)
    assert not log.exists()
