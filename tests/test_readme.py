"""README.md as a new user pastes it: every shell and Python block, in the order written,
against a live ``kperf serve`` on a free loopback port, in a temporary working directory
(conventions, markers and port rewriting: tests/readme_runner.py, also summarised at the top
of README.md). A block that fails, leaves a server running, or whose output no longer shows
its sample fails this test; blocks marked ``<!-- readme-test: skip reason="..." -->`` are
listed with their reasons. Regenerate the samples with ``.venv/bin/python
docs/make_examples.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.readme_runner import (
    ELISION,
    MARKER,
    README,
    Block,
    Ports,
    block_environment,
    parse,
    readme_session,
    regenerated_sample,
    run_block,
    sample_mismatch,
    with_samples,
)

#: what the runnable blocks call besides the checkout (`.ci/run` installs them)
TOOLS = ("bash", "curl", "jq", "openssl", "python3", "sha256sum")


def blocks() -> list[Block]:
    return parse(README.read_text(encoding="utf-8"))


def test_every_block_is_runnable_or_marked_with_a_reason() -> None:
    found = blocks()
    languages = {b.language for b in found}
    assert languages <= {"sh", "bash", "python", ""}, languages
    for block in found:
        assert block.language or block.skip, f"{block.label()}: a plain block with no command"
    # a marker that matches nothing (a typo, or a stray line between it and its block)
    text = README.read_text(encoding="utf-8")
    assert len(MARKER.findall(text)) == sum(1 for b in found if b.skip), (
        "a readme-test marker that is not on the line right above a block"
    )


def test_the_parser_pairs_samples_and_markers() -> None:
    text = (
        "```sh\necho a\n```\n```\na\n```\n\n"
        '<!-- readme-test: skip reason="needs a GPU" -->\n```python\nimport torch\n```\n'
    )
    first, second = parse(text)
    assert first.sample is not None and first.sample.text == "a\n" and first.skip is None
    assert second.skip == "needs a GPU" and second.sample is None
    assert MARKER.search('<!-- readme-test: skip reason="x" -->')


def test_samples_match_in_order_with_elision() -> None:
    out = "made x\nfigure a\nfigure b\ntraining 1 %\n"
    assert sample_mismatch("made x\nfigure b\n...\n", out) is None
    assert sample_mismatch("figure b\nfigure a\n", out) is not None
    assert sample_mismatch("made y\n", out) is not None
    assert sample_mismatch("training ... %\n", out) is None
    assert sample_mismatch("training ... s\n", out) is not None
    assert regenerated_sample("training ... %\n", out).splitlines()[-1] == "training ... %"
    assert regenerated_sample("old\nolder\n...\n", out) == f"made x\nfigure a\n{ELISION}\n"
    assert regenerated_sample(f"{ELISION}\n", out) == out
    assert regenerated_sample("old\n", out) == out


def test_samples_are_rewritten_in_place() -> None:
    text = "intro\n```sh\necho a\n```\n```\nstale\n...\n```\nafter\n"
    (block,) = parse(text)
    assert block.sample is not None
    rewritten = with_samples(text, {block.sample.line: "a\n"})
    assert rewritten == "intro\n```sh\necho a\n```\n```\na\n```\nafter\n"
    (again,) = parse(rewritten)
    assert again.sample is not None and again.sample.text == "a\n"


def test_a_block_runs_with_its_ports_rewritten(tmp_path: Path) -> None:
    ports = Ports(server=1234)
    text = "echo localhost:8000 --port 8001 --host 0.0.0.0\necho 127.0.0.1:8001 >&2\nfalse\n"
    outcome = run_block(Block("sh", text, 1), tmp_path, block_environment(), ports)
    other = ports.others["8001"]
    assert outcome.stdout == f"localhost:1234 --port {other} --host 127.0.0.1\n"
    assert outcome.stderr == f"127.0.0.1:{other}\n"
    assert outcome.returncode == 1 and not outcome.left_running


def test_a_process_a_block_leaves_running_is_reported_and_stopped(tmp_path: Path) -> None:
    block = Block("sh", "sleep 300 > /dev/null 2>&1 &\necho $! > pid\n", 1)
    outcome = run_block(block, tmp_path, block_environment(), Ports(server=1), settle_s=0.5)
    assert outcome.returncode == 0 and outcome.left_running
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_readme_blocks_run_as_pasted() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the README's blocks call {', '.join(missing)}, not on PATH")
    found = blocks()
    skipped = [f"{b.label()}: {b.skip}" for b in found if b.runs and b.skip]
    failures: list[str] = []
    durations: list[str] = []
    with readme_session() as (workdir, env, ports):
        for block in (b for b in found if b.runs and not b.skip):
            started = time.monotonic()
            outcome = run_block(block, workdir, env, ports)
            durations.append(f"{block.label()}: {time.monotonic() - started:.1f} s")
            where = f"{block.label()}:\n{block.text}"
            if outcome.returncode != 0:
                failures.append(f"{where}exit {outcome.returncode}\n{outcome.stderr[-3000:]}")
                break  # later blocks build on this one
            if outcome.left_running:
                failures.append(f"{where}left a process running")
            if block.sample is not None:
                why = sample_mismatch(block.sample.text, outcome.stdout)
                if why is not None:
                    failures.append(f"{where}{why}\nstdout:\n{outcome.stdout[-3000:]}")
        # what the blocks wrote, as paths in a clone: .gitignore must cover each of them
        written = [
            str(path.relative_to(workdir))
            for path in workdir.rglob("*")
            if path.is_file() and not path.is_symlink() and ".venv" not in path.parts
        ]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *written],
        cwd=README.parent,
        capture_output=True,
        text=True,
    ).stdout.split()
    untracked = sorted(set(written) - set(ignored))
    if untracked:
        failures.append(f"files the README writes that .gitignore does not cover: {untracked}")
    assert not failures, "\n\n".join(failures)
    print("README blocks run:", *durations, "skipped:", *skipped, sep="\n")
