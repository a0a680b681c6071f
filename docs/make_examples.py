"""Rewrite the sample outputs of the README and of every docs page from a real run of their
blocks.

Runs every runnable block of each page in order, as tests/test_readme.py does (each page in a
temporary clone of its own, against a ``kperf serve`` of its own on a free loopback port;
conventions: tests/readme_runner.py), and replaces each sample block (the plain block right
after a command) by that command's output. A sample that shows some lines and ends in ``...``
stays abridged to as many lines; any other becomes the whole output. A page stops, written
not at all, at its first block that fails; the other pages are still rewritten.

Run from the repository root: ``.venv/bin/python docs/make_examples.py [PAGE ...]`` (no
page: every page; a page as a path, e.g. ``docs/calibration.md``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.readme_runner import (  # noqa: E402
    PAGES,
    page_name,
    parse,
    readme_session,
    regenerated_sample,
    run_block,
    with_samples,
)


def rewrite(page: Path) -> bool:
    """``page`` with its samples regenerated; False (and the page untouched) when a block
    fails."""
    text = page.read_text(encoding="utf-8")
    runnable = [block for block in parse(text, page_name(page)) if block.runs and not block.skip]
    if not runnable:
        return True
    samples: dict[int, str] = {}
    with readme_session() as (workdir, env, ports):
        for block in runnable:
            print(f"running {block.label()}", file=sys.stderr)
            outcome = run_block(block, workdir, env, ports)
            if outcome.returncode != 0:
                print(f"{block.label()} failed ({outcome.returncode}):\n{outcome.stderr}")
                return False
            if block.sample is not None:
                samples[block.sample.line] = regenerated_sample(block.sample.text, outcome.stdout)
    page.write_text(with_samples(text, samples), encoding="utf-8")
    print(f"rewrote {len(samples)} samples in {page_name(page)}", file=sys.stderr)
    return True


def main(argv: list[str]) -> int:
    pages = [Path(name).resolve() for name in argv] or list(PAGES)
    unknown = [str(page) for page in pages if page not in PAGES]
    if unknown:
        print(f"not a page: {', '.join(unknown)} (pages: README.md, docs/*.md)")
        return 2
    failed = [page_name(page) for page in pages if not rewrite(page)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
