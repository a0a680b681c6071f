"""Content negotiation of the answer routes: JSON (the default) or an SVG picture.

A JSON client keeps JSON: SVG is chosen only when ``Accept`` ranks ``image/svg+xml`` (or
``image/*``) strictly above ``application/json``; no header, ``*/*``, a tie or a list naming
neither type all give JSON, as before pictures existed.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from fastapi import Response

from app.service import CACHE_HEADER

JSON_MEDIA_TYPE = "application/json"
SVG_MEDIA_TYPE = "image/svg+xml"
#: documents the SVG alternative of a route's 200 answer in OpenAPI
SVG_RESPONSE = {
    "content": {SVG_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    "description": "the answer as JSON, or as an SVG picture with `Accept: image/svg+xml`",
}
#: documents the 406 of an installation whose matplotlib is missing (a broken install)
NOT_ACCEPTABLE_RESPONSE = {
    "description": "SVG asked for, but this installation lacks matplotlib (a dependency of "
    "kperf: reinstall it); ask for application/json",
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}
#: documents a route answering JSON or, on request, a picture
PICTURE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: SVG_RESPONSE,
    406: NOT_ACCEPTABLE_RESPONSE,
}


class PicturesUnavailable(RuntimeError):
    """SVG was asked for, and this installation cannot draw (no matplotlib): 406."""

    def __init__(self) -> None:
        super().__init__(
            "this installation cannot draw: matplotlib, a dependency of kperf, is missing "
            "(reinstall kperf); ask for application/json"
        )


@functools.cache
def pictures_installed() -> bool:
    """Whether matplotlib can be imported (looked up, not imported: that takes ~0.5 s)."""
    return importlib.util.find_spec("matplotlib") is not None


def _ranges(accept: str) -> list[tuple[str, float]]:
    ranges = []
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if not media:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranges.append((media.lower(), q if 0.0 <= q <= 1.0 else 0.0))
    return ranges


def _quality(media_type: str, ranges: list[tuple[str, float]]) -> float:
    """q of the most specific range matching ``media_type`` (RFC 9110 §12.5.1); 0 if none."""
    kind = media_type.split("/")[0]
    best: tuple[int, float] = (-1, 0.0)
    for media, q in ranges:
        if media == media_type:
            specificity = 2
        elif media == f"{kind}/*":
            specificity = 1
        elif media == "*/*":
            specificity = 0
        else:
            continue
        if specificity > best[0]:
            best = (specificity, q)
    return best[1]


class JSONNotAcceptable(ValueError):
    """``Accept`` excludes JSON on a route that answers only JSON: 406 (RFC 9110 §15.5.7)."""

    def __init__(self, accept: str) -> None:
        super().__init__(
            f"this resource is JSON only and Accept {accept!r} does not accept "
            "application/json; ask for application/json or */*"
        )


#: documents the 406 of a JSON-only route
JSON_ONLY_RESPONSES: dict[int | str, dict[str, object]] = {
    406: {
        "description": "Accept does not accept application/json, the only representation",
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }
}


def require_json(accept: str | None) -> None:
    """Refuse with :class:`JSONNotAcceptable` an ``Accept`` that gives JSON quality 0."""
    if accept and _quality(JSON_MEDIA_TYPE, _ranges(accept)) <= 0.0:
        raise JSONNotAcceptable(accept)


def prefers_svg(accept: str | None) -> bool:
    """True when the ``Accept`` header ranks SVG strictly above JSON."""
    if not accept:
        return False
    ranges = _ranges(accept)
    return _quality(SVG_MEDIA_TYPE, ranges) > _quality(JSON_MEDIA_TYPE, ranges)


def picture_requested(accept: str | None) -> bool:
    """:func:`prefers_svg`, refused with :class:`PicturesUnavailable` when it cannot be drawn."""
    if not prefers_svg(accept):
        return False
    if not pictures_installed():
        raise PicturesUnavailable()
    return True


def vary_on_accept(response: Response) -> Response:
    """The answer depends on ``Accept``: say so to caches in between."""
    response.headers["Vary"] = "Accept"
    return response


def svg_response(svg: bytes, hit: bool) -> Response:
    """The picture, with the headers the JSON answer would carry (X-Cache of the answer drawn)."""
    headers = {"Vary": "Accept", CACHE_HEADER: "hit" if hit else "miss"}
    return Response(svg, media_type=SVG_MEDIA_TYPE, headers=headers)
