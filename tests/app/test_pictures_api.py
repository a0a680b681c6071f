"""Pictures over HTTP: Accept negotiation on the answer routes, the page at /, and the CLI."""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.jobs import calibration_svg_via_pool
from app.main import create_app
from app.negotiation import prefers_svg
from app.service import RequestFieldError
from app.settings import Settings
from kperf_client.cli import main
from kperf_client.client import KperfClient
from render.timeline import FIRST_STAGES, LAST_STAGES, MAX_STAGES_DRAWN
from tests.app.service_helpers import REPO, clean_environ, make_settings
from tests.paper_cases import paper_case, paper_http_body
from tests.render.svg import Svg, last_number

__all__ = ["clean_environ"]

SVG = {"accept": "image/svg+xml"}
#: the paper's Table 1 row under the paper's DRAM-stream loads
TABLE_1_ROW = {
    "m": 1024,
    "n": 512,
    "k": 1024,
    "device": "rtx-a6000",
    "memory_model": "dram-stream",
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(workers=1, cache_path=None, log_level="WARNING")
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _math_stages(svg: Svg) -> list[int]:
    return [int(i.split("-")[1]) for i in svg.ids(r"stage-\d+-math")]


@pytest.mark.parametrize(
    ("accept", "svg"),
    [
        (None, False),  # no header: JSON, as before pictures
        ("application/json", False),
        ("*/*", False),  # a wildcard ties: JSON
        ("image/svg+xml", True),
        ("image/*", True),
        ("image/svg+xml, application/json", False),  # tie: JSON
        ("application/json;q=0.5, image/svg+xml", True),
        ("image/svg+xml;q=0.1, application/json", False),
        ("image/svg+xml;q=0", False),  # refused explicitly
        ("text/html", False),  # neither offered: JSON rather than 406
        ("image/svg+xml;q=bogus, */*;q=0.1", False),  # an unreadable q counts as 0
    ],
)
def test_accept_negotiation(accept: str | None, svg: bool) -> None:
    assert prefers_svg(accept) is svg


def test_json_clients_keep_getting_json(client: TestClient) -> None:
    problem = {**TABLE_1_ROW, "k": 2048}
    first = client.post("/optimize-tiling", json=problem)
    assert first.status_code == 200
    assert first.headers["content-type"] == "application/json"
    assert first.headers["x-cache"] == "miss"
    assert first.headers["vary"] == "Accept"
    for accept in ("application/json", "*/*", "image/svg+xml;q=0.5, application/json"):
        again = client.post("/optimize-tiling", json=problem, headers={"accept": accept})
        assert again.headers["content-type"] == "application/json"
        assert again.headers["x-cache"] == "hit"
        assert again.json() == first.json()
    # candidate_rank only selects the picture; JSON ignores it
    ranked = client.post("/optimize-tiling?candidate_rank=3", json=problem)
    assert ranked.json() == first.json()


def test_timeline_of_the_best_tiling(client: TestClient) -> None:
    picture = client.post("/optimize-tiling", json=TABLE_1_ROW, headers=SVG)
    assert picture.status_code == 200, picture.text
    assert picture.headers["content-type"] == "image/svg+xml"
    assert picture.headers["vary"] == "Accept"
    cache = picture.headers["x-cache"]
    answer = client.post("/optimize-tiling", json=TABLE_1_ROW).json()
    best = answer["best"]
    # the published Table 1 tiling for this problem
    assert (best["tile_m"], best["tile_n"], best["tile_k"]) == (128, 64, 128)
    svg = Svg.parse(picture.content)
    assert _math_stages(svg) == list(range(1, best["stages"] + 1))
    assert last_number(svg.text("total")) == pytest.approx(best["predicted_time_us"], abs=5e-4)
    assert "128×64×128" in svg.all_text()
    # the picture's solve was cached: the JSON answer after it is a hit, and so is the picture
    assert cache in ("hit", "miss")
    again = client.post("/optimize-tiling", json=TABLE_1_ROW, headers=SVG)
    assert again.headers["x-cache"] == "hit"
    assert again.content == picture.content  # deterministic


def test_timeline_of_a_selected_candidate(client: TestClient) -> None:
    answer = client.post("/optimize-tiling", json=TABLE_1_ROW).json()
    for candidate in answer["candidates"][1:3]:
        rank = candidate["rank"]
        picture = client.post(
            f"/optimize-tiling?candidate_rank={rank}", json=TABLE_1_ROW, headers=SVG
        )
        assert picture.status_code == 200, picture.text
        svg = Svg.parse(picture.content)
        tiling = f"{candidate['tile_m']}×{candidate['tile_n']}×{candidate['tile_k']}"
        assert f"{tiling}, buffer depth {candidate['buffer_depth']}, rank {rank}" in svg.all_text()
        stages = candidate["stages"]
        expected = (
            list(range(1, stages + 1))
            if stages <= MAX_STAGES_DRAWN
            else [*range(1, FIRST_STAGES + 1), *range(stages - LAST_STAGES + 1, stages + 1)]
        )
        assert _math_stages(svg) == expected
        assert last_number(svg.text("total")) == pytest.approx(
            candidate["predicted_time_us"], abs=5e-4
        )


def test_timeline_of_any_one_tiling(client: TestClient) -> None:
    # one value per dimension: the "shortlist" is that tiling, long enough to be elided
    one = {
        **TABLE_1_ROW,
        "k": 65536,
        "search_space": {"tile_m": [64], "tile_n": [64], "tile_k": [32], "buffer_depth": [4]},
    }
    answer = client.post("/optimize-tiling", json=one).json()
    assert answer["best"]["stages"] == 2048
    svg = Svg.parse(client.post("/optimize-tiling", json=one, headers=SVG).content)
    assert _math_stages(svg) == [*range(1, 9), *range(2045, 2049)]
    assert "stages 9–2044" in svg.text("elided-stages")
    assert last_number(svg.text("total")) == pytest.approx(
        answer["best"]["predicted_time_us"], abs=5e-4
    )


@pytest.mark.parametrize(
    ("query", "body", "status"),
    [
        # schema-valid ranks the shortlist does not reach: no such candidate (404: a 422
        # would refuse an input the schema allows)
        ("candidate_rank=6", {}, 404),  # the shortlist has 5
        ("candidate_rank=2", {"top_k": 1}, 404),
        ("candidate_rank=0", {}, 422),  # ranks start at 1
        ("candidate_rank=x", {}, 422),
    ],
)
def test_a_rank_outside_the_shortlist_is_refused_naming_it(
    client: TestClient, query: str, body: dict[str, Any], status: int
) -> None:
    r = client.post(f"/optimize-tiling?{query}", json={**TABLE_1_ROW, **body}, headers=SVG)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in r.json()["errors"]] == ["candidate_rank"]


def test_errors_of_a_picture_request_are_problem_json(client: TestClient) -> None:
    r = client.post("/optimize-tiling", json={**TABLE_1_ROW, "device": "nope"}, headers=SVG)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["field"] == "device"
    r = client.post("/predict-kernel", json={"ptx": "x", "device": "gtx-760"}, headers=SVG)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "launch"


def test_predict_breakdown(client: TestClient) -> None:
    body = paper_http_body(paper_case("hotspot-gtx-760"))
    picture = client.post("/predict-kernel", json=body, headers=SVG)
    assert picture.status_code == 200, picture.text
    assert picture.headers["content-type"] == "image/svg+xml"
    # the picture draws the full answer (every superstep), cached as detail=full
    answer = client.post("/predict-kernel", json={**body, "detail": "full"})
    assert answer.headers["x-cache"] == "hit"
    # a paged or summary request still gets the whole picture
    summary = client.post("/predict-kernel", json={**body, "detail": "summary"}, headers=SVG)
    assert summary.content == picture.content
    document = answer.json()
    svg = Svg.parse(picture.content)
    steps = document["level1_supersteps"]
    assert len(steps) == 4
    assert svg.ids(r"superstep-\d+-comp") == [f"superstep-{k}-comp" for k in range(1, 5)]
    for k, step in enumerate(steps, start=1):
        assert svg.text(f"superstep-{k}-label").startswith(
            f"#{k}: lines {step['start_line']}–{step['end_line']}"
        )
    total = svg.text("total")
    assert f"eq. ({document['equation']})" in total
    cycles = float(total.split("=")[1].replace("cycles", "").replace(",", ""))
    assert cycles == pytest.approx(document["predicted_cycles"], abs=0.05)
    again = client.post("/predict-kernel", json=body, headers=SVG)
    assert again.headers["x-cache"] == "hit" and again.content == picture.content


def test_openapi_documents_the_pictures(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/optimize-tiling", "/predict-kernel"):
        content = paths[path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "image/svg+xml"}
        assert "application/problem+json" in paths[path]["post"]["responses"]["406"]["content"]
        assert "image/svg+xml" in paths[path]["post"]["description"]
    parameters = {p["name"]: p for p in paths["/optimize-tiling"]["post"]["parameters"]}
    assert parameters["candidate_rank"]["in"] == "query"
    assert "/" not in paths  # the page is not part of the API


def test_the_page_lists_the_devices_and_loads_nothing_from_elsewhere(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    page = r.text
    optimize_form = page[page.index('id="optimize-form"') : page.index("</form>")]
    assert '<option value="rtx-a6000">' in optimize_form
    assert '<option value="gtx-760">' in optimize_form  # every profile serves GeMM-WS
    predict_form = page[page.index('id="predict-form"') :]
    assert '<option value="gtx-760">' in predict_form
    assert "<!--" not in page  # every placeholder filled
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # no CDN, no external link
    for path in ("/optimize-tiling", "/predict-kernel", "candidate_rank"):
        assert path in page  # the page calls the public API


def test_cli_writes_the_pictures(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    timeline = tmp_path / "timeline.svg"
    argv = ["optimize", "--m", "1024", "--n", "512", "--k", "1024", "--device", "rtx-a6000"]
    code = main([*argv, "--svg", str(timeline), "--candidate-rank", "2"], out=out, err=err)
    assert code == 0, err.getvalue()
    assert f"wrote {timeline}" in err.getvalue()
    svg = Svg.parse(timeline.read_bytes())
    assert "rank 2" in svg.all_text()
    breakdown = tmp_path / "breakdown.svg"
    hotspot = REPO / "tests" / "fixtures" / "ptx" / "paper" / "hotspot.ptx"
    argv = [
        "predict", str(hotspot), "--device", "gtx-760", "--grid", "43,43", "--block", "16,16",
        "--registers-per-thread", "34", "--trip-count", "BB0_4=2", "--svg", str(breakdown),
    ]  # fmt: skip
    code = main(argv, out=out, err=err)
    assert code == 0, err.getvalue()
    assert Svg.parse(breakdown.read_bytes()).ids(r"superstep-\d+-comp")


def test_cli_rank_outside_the_shortlist_names_the_flag(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    argv = ["optimize", "--m", "1024", "--n", "512", "--k", "1024", "--device", "rtx-a6000"]
    code = main(
        [*argv, "--svg", str(tmp_path / "x.svg"), "--candidate-rank", "9"], out=out, err=err
    )
    assert code == 1
    assert "candidate_rank" in err.getvalue()
    assert not (tmp_path / "x.svg").exists()


def test_the_service_process_never_imports_matplotlib() -> None:
    code = "import sys, app.main, app.jobs, render; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_calibration_fit_is_drawn_in_a_worker_and_bad_input_is_a_422() -> None:
    # the one call POST /calibrate makes for its SVG answer
    async def scenario() -> tuple[bytes, RequestFieldError]:
        async with KperfClient(settings=make_settings()) as client:
            service = client.app.state.service  # type: ignore[union-attr]
            svg = await calibration_svg_via_pool(service, [10.0, 20.0, 40.0], [11.0, 19.0, 40.0])
            with pytest.raises(RequestFieldError) as refused:
                await calibration_svg_via_pool(service, [10.0, 20.0], [11.0])
            return svg, refused.value

    svg, refused = asyncio.run(scenario())
    assert Svg.parse(svg).markers("points") == 3
    assert refused.field == "predicted"


def test_a_server_without_pictures_answers_406_and_keeps_json(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an installation whose matplotlib went missing (installed with --no-deps, say)
    monkeypatch.setattr("app.negotiation.pictures_installed", lambda: False)
    r = client.post("/optimize-tiling", json=TABLE_1_ROW, headers=SVG)
    assert r.status_code == 406
    assert r.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in r.json()["errors"]] == ["accept"]
    assert "matplotlib" in r.json()["detail"]
    body = paper_http_body(paper_case("hotspot-gtx-760"))
    assert client.post("/predict-kernel", json=body, headers=SVG).status_code == 406
    assert client.post("/optimize-tiling", json=TABLE_1_ROW).status_code == 200
