"""The typed client, in-process and against a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest

from kperf_client.client import KperfClient, KperfError
from tests.app.service_helpers import (
    A6000,
    clean_environ,
    live_server,
    make_settings,
    problem,
)
from tests.paper_cases import paper_case, paper_http_body

__all__ = ["clean_environ", "live_server"]


async def _exercise(client: KperfClient) -> dict[str, object]:
    """The same calls in both modes; returns what must agree between them."""
    devices = await client.devices()
    assert A6000 in [d.id for d in devices.devices]
    profile = await client.device(A6000)
    assert profile.gemm_ws is not None
    first = await client.optimize(problem(m=1536))
    again = await client.optimize(problem(m=1536))
    assert (first.cache, again.cache) == ("miss", "hit")
    assert first.request_id and first.request_id != again.request_id
    with pytest.raises(KperfError) as info:
        await client.optimize(problem(m=-1))
    assert info.value.status == 422 and info.value.field_errors[0][0] == "m"
    with pytest.raises(KperfError) as missing:
        await client.device("no-such-gpu")
    assert missing.value.status == 404
    batch = await client.optimize_batch([problem(m=1536), problem(device="nope")])
    assert [i.status for i in batch.items] == ["ok", "error"]
    return {
        "best": first.response.best.model_dump(),
        "candidates": [c.model_dump() for c in first.response.candidates],
        "devices": devices.model_dump(),
    }


def test_client_in_process_and_against_uvicorn_agree(live_server: str) -> None:
    async def both() -> tuple[dict[str, object], dict[str, object]]:
        async with KperfClient(settings=make_settings()) as local:
            assert local.app is not None
            local_view = await _exercise(local)
        async with KperfClient(live_server) as remote:
            assert remote.app is None
            assert (await remote.healthz()) == {"status": "ok"}
            remote_view = await _exercise(remote)
        return local_view, remote_view

    local_view, remote_view = asyncio.run(both())
    assert local_view == remote_view


def test_client_predict_matches_the_paper_case(live_server: str) -> None:
    case = paper_case("hotspot-gtx-760")
    body = paper_http_body(case)

    async def run() -> dict[str, object]:
        async with KperfClient(live_server) as client:
            result = await client.predict(body)
            again = await client.http.post("/predict-kernel", json=body)
            # a prediction is a pure function of the request: the repeat comes from the cache
            assert again.headers["x-cache"] == "hit" and again.json() == result
            return result

    result = asyncio.run(run())
    # the supplementary report's worked example (§2): rho = 7 resident blocks, eq. (21)
    assert result["rho"] == case["published"]["rho"]
    assert result["n_b"] == 43 * 43 and result["n_t"] == 256


def test_client_outside_its_context_says_how_to_use_it() -> None:
    with pytest.raises(RuntimeError, match="async with"):
        _ = KperfClient("http://127.0.0.1:1").http


def test_unreachable_server_raises_a_transport_error() -> None:
    import httpx

    async def run() -> None:
        async with KperfClient("http://127.0.0.1:9", timeout_s=2) as client:
            await client.healthz()

    with pytest.raises(httpx.HTTPError):
        asyncio.run(run())
