"""README.md and every docs/*.md page as a new user pastes them: every shell and Python block
of a page, in the order written, against a live ``kperf serve`` of that page's own on a free
loopback port, in a stand-in clone of its own holding only the tracked files (conventions,
markers and port rewriting: tests/readme_runner.py, also summarised at the top of README.md).
A block that fails, leaves a server running, or whose output no longer shows its sample fails
this test; blocks marked ``<!-- readme-test: skip reason="..." -->`` are listed with their
reasons. Regenerate the samples with ``.venv/bin/python docs/make_examples.py``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.readme_runner import (
    ELISION,
    MARKER,
    PAGES,
    README,
    REPO,
    Block,
    Ports,
    block_environment,
    make_clone,
    page_name,
    parse,
    readme_session,
    regenerated_sample,
    run_block,
    sample_mismatch,
    tracked_files,
    with_samples,
)

#: what the runnable blocks call besides the checkout (`.ci/run` installs them)
TOOLS = ("bash", "curl", "jq", "openssl", "python3", "sha256sum")


def blocks(page: Path = README) -> list[Block]:
    return parse(page.read_text(encoding="utf-8"), page_name(page))


#: the pages with at least one block to run
RUN_PAGES = [page for page in PAGES if any(b.runs and not b.skip for b in blocks(page))]


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_block_is_runnable_or_marked_with_a_reason(page: Path) -> None:
    found = blocks(page)
    languages = {b.language for b in found}
    assert languages <= {"sh", "bash", "python", ""}, languages
    for block in found:
        assert block.language or block.skip, f"{block.label()}: a plain block with no command"
    # a marker that matches nothing (a typo, or a stray line between it and its block)
    text = page.read_text(encoding="utf-8")
    assert len(MARKER.findall(text)) == sum(1 for b in found if b.skip), (
        "a readme-test marker that is not on the line right above a block"
    )


#: a calibrated profile's name as a block gives it: `kperf calibrate --name X` or a JSON body's
#: `name: "X"` (jq) / `"name": "X"`
PROFILE_NAME = re.compile(r'--name ([\w.-]+)|\bname: "([^"]+)"|"name": ?"([^"]+)"')


def profile_names(page: Path) -> set[str]:
    names: set[str] = set()
    for block in blocks(page):
        if block.runs and not block.skip:
            for match in PROFILE_NAME.finditer(block.text):
                names.add(next(group for group in match.groups() if group))
    return names


def test_each_profile_name_is_made_on_one_page_only() -> None:
    # A user pastes the README and then the docs pages against the one server the README
    # starts; a name two pages both give makes the second page's calibration a 409
    # (name taken), although each page passes against a server of its own.
    owner: dict[str, str] = {}
    for page in RUN_PAGES:
        for name in profile_names(page):
            assert name not in owner, f"{name!r} is made on {owner[name]} and {page_name(page)}"
            owner[name] = page_name(page)
    assert "lab-gpu" in owner  # the pattern sees the README's own calibration


def test_the_pages_are_the_readme_and_every_docs_page() -> None:
    assert PAGES[0] == README
    assert set(PAGES[1:]) == set((REPO / "docs").glob("*.md"))
    assert README in RUN_PAGES


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


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_the_clone_holds_the_tracked_files_only(tmp_path: Path) -> None:
    """A user's leftovers in their checkout (an ignored ``tuning-tables/`` journal from trying
    the README, an untracked file) are not in the stand-in clone; tracked files are, with
    their working-tree content, and ``../shared`` stays beside it."""
    repo = tmp_path / "work" / "kperf"
    (repo / "docs" / "examples").mkdir(parents=True)
    (repo / "docs" / "examples" / "runs.jsonl").write_text("committed\n")
    (repo / ".gitignore").write_text("/tuning-tables/\n")
    (repo / "gone.txt").write_text("deleted after the commit\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tracked")
    (repo / "docs" / "examples" / "runs.jsonl").write_text("edited, not committed\n")
    (repo / "gone.txt").unlink()
    journal = repo / "tuning-tables" / "configs" / "kperf-table-sweep.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text('{"line": 2, "answered": true}\n')
    (repo / "shapes.csv").write_text("n,k\n1536,7168\n")  # untracked, not ignored
    (repo / "docs" / "examples" / "mine.jsonl").write_text("untracked\n")
    (tmp_path / "work" / "shared").mkdir()
    (tmp_path / "work" / "shared" / "paper.txt").write_text("a paper\n")

    clone = tmp_path / "run" / "clone"
    clone.mkdir(parents=True)
    make_clone(clone, repo)
    present = {
        p.relative_to(clone).as_posix()
        for p in clone.rglob("*")
        if not p.is_dir() and ".venv" not in p.parts
    }
    assert present == {".gitignore", "docs/examples/runs.jsonl"}
    assert (clone / "docs" / "examples" / "runs.jsonl").read_text() == "edited, not committed\n"
    assert not (clone / "tuning-tables").exists()
    assert (clone / ".." / "shared" / "paper.txt").read_text() == "a paper\n"
    assert (clone / ".venv" / "bin" / "kperf").is_file()


def test_the_clone_of_this_checkout_is_its_tracked_files(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    make_clone(clone, REPO)
    present = {
        p.relative_to(clone).as_posix()
        for p in clone.rglob("*")
        if p.is_symlink() and ".venv" not in p.parts
    }
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert present == set(tracked_files(REPO))
    assert present <= set(listed) and "README.md" in present


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("page", RUN_PAGES, ids=page_name)
def test_page_blocks_run_as_pasted(page: Path) -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the pages' blocks call {', '.join(missing)}, not on PATH")
    found = blocks(page)
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
        failures.append(f"files the page writes that .gitignore does not cover: {untracked}")
    assert not failures, "\n\n".join(failures)
    print(f"{page_name(page)} blocks run:", *durations, "skipped:", *skipped, sep="\n")
