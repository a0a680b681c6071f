"""Pictures of the service's answers, as SVG bytes.

Takes the core's dataclasses or plain dicts (never HTTP models) and returns deterministic SVG.
matplotlib is imported when the first picture is drawn, not with this package.

* :func:`timeline_svg` - GeMM-WS pipeline timeline of one simulated tiling;
* :func:`async_timeline_svg` - the same under the async-copy pipeline model (loads in flight);
* :func:`pipeline_timeline_svg` - either, by the prediction's type, or a registered model's own
  (render/pipeline.py);
* :func:`breakdown_svg` - Many-BSP level-1 supersteps and the eq. (24)/(25) terms;
* :func:`calibration_svg` - measured vs predicted times, identity line and residuals;
* :func:`tuning_table_svg` - a tuning table's time over M, each M's optimum, the loss band.
"""

from render.breakdown import breakdown_svg
from render.calibration import calibration_svg
from render.pipeline import pipeline_timeline_svg
from render.timeline import async_timeline_svg, timeline_svg
from render.tuning_table import tuning_table_svg

__all__ = [
    "async_timeline_svg",
    "breakdown_svg",
    "calibration_svg",
    "pipeline_timeline_svg",
    "timeline_svg",
    "tuning_table_svg",
]
