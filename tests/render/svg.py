"""Reading the service's SVG pictures back: elements by id, their text, their extent."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

SVG_NS = "{http://www.w3.org/2000/svg}"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


@dataclass(frozen=True)
class Svg:
    root: ET.Element

    @classmethod
    def parse(cls, data: bytes) -> Svg:
        """Parse (raises ``ET.ParseError`` unless well-formed XML) and check it is SVG."""
        root = ET.fromstring(data)
        assert root.tag == f"{SVG_NS}svg", root.tag
        return cls(root)

    def ids(self, pattern: str = ".*") -> list[str]:
        """Every element id matching ``pattern`` (whole id), in document order."""
        regex = re.compile(pattern)
        return [el.get("id", "") for el in self.root.iter() if regex.fullmatch(el.get("id", ""))]

    def element(self, element_id: str) -> ET.Element:
        found = [el for el in self.root.iter() if el.get("id") == element_id]
        assert len(found) == 1, f"{len(found)} elements with id {element_id!r}"
        return found[0]

    def text(self, element_id: str) -> str:
        """The text drawn under an element (text stays text: svg.fonttype = none)."""
        return " ".join(
            "".join(t.itertext()).strip() for t in self.element(element_id).iter(f"{SVG_NS}text")
        )

    def all_text(self) -> str:
        return "\n".join("".join(t.itertext()) for t in self.root.iter(f"{SVG_NS}text"))

    def x_extent(self, element_id: str) -> tuple[float, float]:
        """Leftmost and rightmost x of the paths under an element, in SVG points."""
        xs: list[float] = []
        for path in self.element(element_id).iter(f"{SVG_NS}path"):
            numbers = [float(n) for n in _NUMBER.findall(path.get("d", ""))]
            xs.extend(numbers[0::2])
        assert xs, f"no path under {element_id!r}"
        return min(xs), max(xs)

    def width(self, element_id: str) -> float:
        lo, hi = self.x_extent(element_id)
        return hi - lo

    def markers(self, element_id: str) -> int:
        """Markers drawn by a Line2D (one <use> each)."""
        return len(list(self.element(element_id).iter(f"{SVG_NS}use")))


def last_number(text: str) -> float:
    """The last number in a label, thousands separators dropped: '... = 1,300.895 µs'."""
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    assert numbers, text
    return float(numbers[-1].replace(",", ""))
