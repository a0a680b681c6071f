"""Pictures of the service's answers, as SVG bytes.

Takes the core's dataclasses or plain dicts (never HTTP models) and returns deterministic SVG.
matplotlib is imported when the first picture is drawn, not with this package.

* :func:`timeline_svg` - GeMM-WS pipeline timeline of one simulated tiling;
* :func:`async_timeline_svg` - the same under the async-copy pipeline model (loads in flight);
* :func:`breakdown_svg` - Many-BSP level-1 supersteps and the eq. (24)/(25) terms;
* :func:`calibration_svg` - measured vs predicted times, identity line and residuals.
"""

from render.breakdown import breakdown_svg
from render.calibration import calibration_svg
from render.timeline import async_timeline_svg, timeline_svg

__all__ = ["async_timeline_svg", "breakdown_svg", "calibration_svg", "timeline_svg"]
