"""The Many-BSP breakdown picture, read back and checked against the prediction it draws."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.convert.predict import resolve_device, terms_of, to_response
from app.schemas.predict import PredictKernelRequest
from perfmodel.manybsp import PredictResult, predict_kernel
from perfmodel.manybsp.kernel import KernelTerms
from render import breakdown_svg
from tests.paper_cases import CASE_IDS, paper_case, paper_http_body
from tests.perfmodel.manybsp.conftest import paper_request, paper_result
from tests.render.svg import Svg, last_number


def _answer(case_id: str, result: PredictResult) -> tuple[dict[str, Any], KernelTerms]:
    case = paper_case(case_id)
    clock = paper_request(case).device.clock_mhz
    answer = to_response(result, clock).model_dump(mode="json")
    request = PredictKernelRequest.model_validate(paper_http_body(case))
    return answer, terms_of(answer, resolve_device(request))


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_every_superstep_appears_once_and_the_terms_add_up(case_id: str) -> None:
    answer, terms = _answer(case_id, paper_result(paper_case(case_id)))
    svg = Svg.parse(breakdown_svg(answer, terms))
    steps = answer["level1_supersteps"]
    assert svg.ids(r"superstep-\d+-comp") == [
        f"superstep-{k}-comp" for k in range(1, len(steps) + 1)
    ]
    text = svg.all_text()
    for k, step in enumerate(steps, start=1):
        label = f"#{k}: lines {step['start_line']}–{step['end_line']} × {step['iterations']}"
        assert text.count(label) == 1, label
        assert svg.text(f"superstep-{k}-label") == label
    # widths proportional to cycles x iterations, on one scale
    first = steps[0]
    scale = svg.width("superstep-1-comp") / (first["comp_cycles"] * first["iterations"])
    for k, step in enumerate(steps, start=1):
        for part in ("comp", "comm", "ovh"):
            cycles = step[f"{part}_cycles"] * step["iterations"]
            assert svg.width(f"superstep-{k}-{part}") == pytest.approx(cycles * scale, abs=0.02)

    # the terms add up to the labelled total
    assert terms.total == answer["predicted_cycles"]  # bit for bit: the model sums the same terms
    total = svg.text("total")
    assert f"eq. ({answer['equation']})" in total
    cycles = float(total.split("=")[1].replace("cycles", "").replace(",", ""))
    assert cycles == pytest.approx(answer["predicted_cycles"], abs=0.05)
    assert last_number(total.split(" at ")[0]) == pytest.approx(
        answer["predicted_time_us"], abs=5e-4
    )
    drawn = sum(svg.width(i) for i in svg.ids(r"term-[a-z]+"))
    scale = svg.width("term-blocks") / terms.blocks
    assert drawn == pytest.approx(terms.total * scale, rel=1e-3)
    assert svg.ids("term-rounds") == []  # every worked example is eq. (24)


def test_equation_25_draws_the_rounds_term() -> None:
    # 255 registers per thread leave one resident block per SM: rho = 1 < tau, eq. (25)
    case = paper_case("hotspot-940mx")
    result = predict_kernel(dataclasses.replace(paper_request(case), registers_per_thread=255))
    assert result.estimate.equation == "25"
    answer, terms = _answer("hotspot-940mx", result)
    answer_terms = terms_of(answer, paper_request(case).device)
    assert answer_terms.rounds > 0 and answer_terms.total == answer["predicted_cycles"]
    svg = Svg.parse(breakdown_svg(answer, answer_terms))
    assert svg.ids(r"term-[a-z]+") == ["term-launch", "term-blocks", "term-rounds", "term-tail"]
    assert "eq. (25)" in svg.text("total")
    assert terms == answer_terms
