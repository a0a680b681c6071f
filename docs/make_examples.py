"""Rewrite the README's sample outputs from a real run of its blocks.

Runs every runnable README block in order, as tests/test_readme.py does (a temporary clone,
``kperf serve`` on a free loopback port; conventions: tests/readme_runner.py), and replaces
each sample block (the plain block right after a command) by that command's output. A sample
that shows some lines and ends in ``...`` stays abridged to as many lines; any other becomes
the whole output. Stops, writing nothing, at the first block that fails.

Run from the repository root: ``.venv/bin/python docs/make_examples.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.readme_runner import (  # noqa: E402
    README,
    parse,
    readme_session,
    regenerated_sample,
    run_block,
    with_samples,
)


def main() -> int:
    text = README.read_text(encoding="utf-8")
    samples: dict[int, str] = {}
    with readme_session() as (workdir, env, ports):
        for block in parse(text):
            if not block.runs or block.skip:
                continue
            print(f"running {block.label()}", file=sys.stderr)
            outcome = run_block(block, workdir, env, ports)
            if outcome.returncode != 0:
                print(f"{block.label()} failed ({outcome.returncode}):\n{outcome.stderr}")
                return 1
            if block.sample is not None:
                samples[block.sample.line] = regenerated_sample(block.sample.text, outcome.stdout)
    README.write_text(with_samples(text, samples), encoding="utf-8")
    print(f"rewrote {len(samples)} samples in {README.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
