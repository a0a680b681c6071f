"""docs/make_pictures.py regenerates every picture the README and the docs pages show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.render.svg import Svg

REPO = Path(__file__).resolve().parents[1]
NAMES = {
    "timeline.svg",
    "timeline-math-bound.svg",
    "breakdown.svg",
    "calibration.svg",
    "pipeline-paper.svg",
    "pipeline-async-copy.svg",
    "tuning-table.svg",
}
#: pictures a bench draws from data outside the repository (../shared), by their script
BENCH_PICTURES = {"real-gpus.svg": "bench/bench_real.py"}


def shown() -> str:
    """The README and every docs page, a docs page's ``pictures/x.svg`` (relative to
    ``docs/``) written as the README links it, ``docs/pictures/x.svg``."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    pages = [
        page.read_text(encoding="utf-8").replace("](pictures/", "](docs/pictures/")
        for page in sorted((REPO / "docs").glob("*.md"))
    ]
    return "\n".join([readme, *pages])


def test_the_script_writes_each_picture_the_readme_shows(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO / "docs" / "make_pictures.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    assert {p.name for p in tmp_path.iterdir()} == NAMES
    committed = {p.name for p in (REPO / "docs" / "pictures").iterdir()}
    assert committed == NAMES | set(BENCH_PICTURES)
    readme = shown()
    for name in NAMES:
        assert f"docs/pictures/{name}" in readme
        svg = Svg.parse((tmp_path / name).read_bytes())
        assert svg.ids("total") or svg.ids("summary")


def test_bench_pictures_are_shown_and_their_script_exists() -> None:
    readme = shown()
    for name, script in BENCH_PICTURES.items():
        assert f"docs/pictures/{name}" in readme
        assert (REPO / script).is_file()
        assert f"--svg docs/pictures/{name}" in readme  # the command that draws it
