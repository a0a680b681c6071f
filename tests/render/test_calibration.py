"""The calibration-fit picture: one marker per measurement, identity line, residuals."""

from __future__ import annotations

import re

import pytest

from render import calibration_svg
from render.calibration import mean_abs_error_percent
from tests.render.svg import Svg, last_number

MEASURED = [10.0, 20.0, 40.0, 80.0, 160.0]
PREDICTED = [11.0, 19.0, 42.0, 80.0, 150.0]


def test_one_marker_per_measurement_and_the_identity_line() -> None:
    svg = Svg.parse(calibration_svg(MEASURED, PREDICTED, ["a", "b", "c", "d", "e"]))
    assert svg.markers("points") == len(MEASURED)
    assert svg.markers("residuals") == len(MEASURED)
    assert svg.ids("identity") == ["identity"] and svg.ids("zero") == ["zero"]
    assert [svg.text(f"point-label-{i}") for i in range(5)] == ["a", "b", "c", "d", "e"]


def test_points_sit_at_their_values() -> None:
    svg = Svg.parse(calibration_svg(MEASURED, PREDICTED))
    xs = [float(u.get("x", "nan")) for u in svg.element("points").iter() if u.tag.endswith("use")]
    # x is the measured time: equal steps in measured give proportional steps in x
    spans = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    ratios = [s / (MEASURED[i + 1] - MEASURED[i]) for i, s in enumerate(spans)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-3)


def test_summary_states_the_mean_and_worst_error() -> None:
    svg = Svg.parse(calibration_svg(MEASURED, PREDICTED))
    summary = svg.text("summary")
    mape = mean_abs_error_percent(MEASURED, PREDICTED)
    assert mape == pytest.approx((10 + 5 + 5 + 0 + 6.25) / 5)
    assert f"mean |error| {mape:.2f} %" in summary
    assert last_number(summary) == pytest.approx(10.0, abs=0.005)


@pytest.mark.parametrize(
    ("measured", "predicted", "labels", "field"),
    [
        ([], [], None, "measured"),  # nothing to draw
        ([1.0, 2.0], [1.0], None, "predicted"),  # one prediction per measurement
        ([1.0], [1.0], ["a", "b"], "labels"),  # one label per measurement
        ([1.0, float("nan")], [1.0, 1.0], None, "measured[1]"),  # not finite
        ([1.0], [0.0], None, "predicted[0]"),  # relative error needs > 0
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(
    measured: list[float], predicted: list[float], labels: list[str] | None, field: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(field) + ":"):
        calibration_svg(measured, predicted, labels)
