"""Every relative link and image of README.md and docs/*.md resolves: the file (or folder)
exists, and a ``#anchor`` names a heading of the page it points to, as GitHub slugs
headings (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` ... on
repeats). Links inside code (fenced blocks, inline code) are text, not links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.readme_runner import PAGES, REPO, page_name

#: an inline link or image: [text](target) / ![alt](target), an optional "title" after it
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced blocks, inline code blanked out."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, re.sub(r"`[^`]*`", "``", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: links reduced to their text, lower case, every
    character but letters, digits, ``_``, ``-`` and spaces dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (outside fenced blocks), repeats numbered."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """``page:line: target (why)`` for each relative link of ``page`` that does not resolve."""
    text = page.read_text(encoding="utf-8")
    broken: list[str] = []
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if SCHEME.match(target):
                continue  # http(s), mailto: not this test's to fetch
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.name}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and resolved.is_file():
                if anchor not in anchors(resolved.read_text(encoding="utf-8")):
                    broken.append(f"{where} (no heading #{anchor} in {resolved.name})")
    return broken


def test_slugs_follow_github() -> None:
    assert slug("Many-BSP on today's GPUs: sm_80, sm_86, sm_90") == (
        "many-bsp-on-todays-gpus-sm_80-sm_86-sm_90"
    )
    assert slug("`POST /optimize-tiling` in full") == "post-optimize-tiling-in-full"
    assert slug("Hopper PTX and warp-specialized kernels (`/predict-kernel`)") == (
        "hopper-ptx-and-warp-specialized-kernels-predict-kernel"
    )
    assert slug("See [the notes](docs/x.md) — 4b") == "see-the-notes--4b"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n### B #\n") == {"a", "a-1", "b"}


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Calibrate for your GPU\n")
    (tmp_path / "pic.svg").write_text("<svg/>")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n\n"
        "[ok](docs/page.md#calibrate-for-your-gpu) ![ok](pic.svg) [ok](#top) "
        "[web](https://example.org/x#y)\n"
        "[no file](docs/gone.md) [no anchor](docs/page.md#calibrate)\n"
        "![no picture](docs/pictures/gone.svg) [no anchor here](#nowhere)\n"
        "`[code](not/a/link.md)`\n```\n[fenced](not/a/link.md)\n```\n"
    )
    assert broken_links(page) == [
        "README.md:4: docs/gone.md (no such file)",
        "README.md:4: docs/page.md#calibrate (no heading #calibrate in page.md)",
        "README.md:5: docs/pictures/gone.svg (no such file)",
        "README.md:5: #nowhere (no heading #nowhere in README.md)",
    ]


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_links_every_docs_page() -> None:
    """The README is the front page: every docs page is reachable from it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = {
        (REPO / target.partition("#")[0]).resolve()
        for _, line in prose_lines(readme)
        for target in LINK.findall(line)
        if not SCHEME.match(target)
    }
    assert [page_name(p) for p in PAGES[1:] if p not in linked] == []


#: a tracker number in prose ("issue 7", "issues 3 and 8", "issue #16")
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_no_page_cites_a_tracker_number(page: Path) -> None:
    """A reader has no tracker: a page says the reason or the equation, not "issue N"."""
    text = page.read_text(encoding="utf-8")
    cited = [
        f"{page_name(page)}:{number}: {match.group(0)}"
        for number, line in enumerate(text.splitlines(), 1)
        for match in ISSUE_NUMBER.finditer(line)
    ]
    assert cited == []
    assert ISSUE_NUMBER.search("as issue 3 asks") and ISSUE_NUMBER.search("Issues #16")


def test_the_readme_is_a_front_page() -> None:
    """The front page stays short: the topics live on their own pages."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
