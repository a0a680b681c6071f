"""Run the README's and each docs page's fenced blocks as a new user pastes them, in order.

Conventions (README.md repeats them in a comment at its top; keep the two in step):

* The pages are README.md and every ``docs/*.md`` (``PAGES``). Each page runs on its own: in
  a stand-in clone of its own, against a server of its own started as the README's first
  command starts it. A page whose blocks need a file or a profile makes it in its own blocks.
* A block fenced ```` ```sh ```` / ```` ```bash ```` runs with ``bash -e -o pipefail``, one
  fenced ```` ```python ```` with ``.venv/bin/python``: each in a process of its own, in page
  order, in one temporary working directory. That directory stands for a fresh clone: it holds
  the checkout's tracked files (``git ls-files``, linked as they are in the working tree; what
  a user left untracked or ignored in their checkout is not there), ``../shared`` beside it as
  beside the checkout, and a ``.venv/bin`` whose ``kperf`` and ``python`` run this checkout
  with the test's interpreter. What a block writes stays there; the directory is removed at
  the end.
* Before the first block, ``kperf serve`` runs as the README's first command starts it
  (in-memory store) on a free loopback port. In every block, port ``8000`` after ``localhost:``,
  ``127.0.0.1:``, ``0.0.0.0:`` or ``--port`` becomes that server's port; any other ``80NN``
  port a free port of its own (the same one each time it appears); ``--host 0.0.0.0`` becomes
  ``--host 127.0.0.1``.
* A block that starts a server in the background stops it itself; whatever is left of its
  process group when it ends is killed.
* ``<!-- readme-test: skip reason="..." -->`` on the line before a block: the block is not run
  (it needs a GPU, Docker, an install, ...); the reason is reported as a skip.
* A plain ```` ``` ```` block right after a run block is that block's sample output: its lines
  must appear in the block's standard output, in order (trailing blanks ignored; other lines
  may come between them, so a sample may be abridged); a line ``...`` stands for the lines
  left out, and ``...`` inside a line for any text (a time that varies from run to run).
  ``docs/make_examples.py`` rewrites these samples from a real run, page by page.
* Files a block writes must be in ``.gitignore`` (a user's clone stays clean).
* Tools the blocks may call besides the checkout: bash, curl, jq, openssl, python3, sha256sum
  (tests/test_readme.py ``TOOLS``; ``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: the pages whose blocks run: the README, then every docs page
PAGES = (README, *sorted((REPO / "docs").glob("*.md")))

RUN_LANGUAGES = {"sh": "bash", "bash": "bash", "python": "python"}
MARKER = re.compile(r'<!--\s*readme-test:\s*skip\s+reason="([^"]+)"\s*-->')
FENCE = re.compile(r"^```(\S*)\s*$")
ADDRESS_PORT = re.compile(r"\b(localhost|127\.0\.0\.1|0\.0\.0\.0):(80\d\d)\b")
PORT_OPTION = re.compile(r"--port (80\d\d)\b")
README_PORT = "8000"
ELISION = "..."
#: a block's own limit: the slowest today (a calibration and a refit) takes about 15 s
BLOCK_TIMEOUT_S = 120.0
SERVER_START_S = 90.0


@dataclass
class Block:
    """One fenced block: ``language`` as written after the fence, its text, the page line
    of its opening fence, the skip reason of its marker, its sample output, if any, and its
    page."""

    language: str
    text: str
    line: int
    skip: str | None = None
    sample: Block | None = None
    #: the page it is on, relative to the repository root
    page: str = "README.md"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES

    def label(self) -> str:
        return f"{self.page}:{self.line} ({self.language})"


def page_name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def parse(text: str, page: str = "README.md") -> list[Block]:
    """A page's fenced blocks; a plain block right after a run block is its sample."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    previous_end = -2
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i] != "```":
            i += 1
        block = Block(
            opening.group(1), "\n".join(lines[start + 1 : i]) + "\n", start + 1, page=page
        )
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = MARKER.search(before)
        if marker is not None:
            block.skip = marker.group(1)
        last = blocks[-1] if blocks else None
        if block.language == "" and last is not None and last.runs and previous_end == start - 1:
            last.sample = block
        else:
            blocks.append(block)
        previous_end = i
        i += 1
    return blocks


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Ports:
    """README port -> this run's free loopback port (8000 is the harness's server)."""

    server: int
    others: dict[str, int] = field(default_factory=dict)

    def of(self, readme_port: str) -> int:
        if readme_port == README_PORT:
            return self.server
        return self.others.setdefault(readme_port, free_port())

    def rewrite(self, text: str) -> str:
        text = ADDRESS_PORT.sub(lambda m: f"{m.group(1)}:{self.of(m.group(2))}", text)
        text = PORT_OPTION.sub(lambda m: f"--port {self.of(m.group(1))}", text)
        return text.replace("--host 0.0.0.0", "--host 127.0.0.1")


def block_environment() -> dict[str, str]:
    """The user's shell, without their KPERF_* settings; one worker a server (2 CPUs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPERF_")}
    env.update({"KPERF_WORKERS": "1", "KPERF_LOG_LEVEL": "WARNING"})
    return env


def tracked_files(repo: Path) -> list[str]:
    """What a clone of ``repo`` holds: its tracked files (``git ls-files``) that the working
    tree has (a tracked file deleted there is left out, as a commit of it would be)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (repo / name).is_file()]


def make_clone(workdir: Path, repo: Path = REPO) -> None:
    """``workdir`` as a fresh clone of ``repo`` with the README's install done: each tracked
    file linked to its working-tree copy (nothing untracked or ignored: a user's leftovers,
    such as a ``tuning-tables/`` journal, would change what the blocks print), and
    ``.venv/bin/{kperf,python}`` running ``repo``. ``../shared`` beside ``workdir`` is
    ``repo``'s ``../shared`` (the papers and data sets a clone finds beside it) when there is
    one and ``workdir``'s parent has none."""
    for name in tracked_files(repo):
        target = workdir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(repo / name)
    shared, beside = repo.parent / "shared", workdir.parent / "shared"
    if shared.is_dir() and not os.path.lexists(beside):
        beside.symlink_to(shared)
    bin_dir = workdir / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = shlex.quote(sys.executable)
    path = shlex.quote(str(repo))
    scripts = {
        "python": f'exec {python} "$@"',
        "kperf": f'exec {python} -m kperf_client.cli "$@"',
    }
    for name, command in scripts.items():
        script = bin_dir / name
        # PYTHONPATH first: the checkout under test, never another editable install
        script.write_text(f"#!/bin/sh\nPYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}} {command}\n")
        script.chmod(0o755)


@contextmanager
def readme_server(workdir: Path, env: dict[str, str]) -> Iterator[Ports]:
    """``.venv/bin/kperf serve --host 127.0.0.1 --port <free>`` in ``workdir``, ready."""
    port = free_port()
    log = workdir / ".venv" / "serve.log"  # the harness's own, not a file the README writes
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [".venv/bin/kperf", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kperf serve exited {proc.returncode}: {log.read_text()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"kperf serve not ready in {SERVER_START_S} s")
            time.sleep(0.2)
        yield Ports(port)
    finally:
        stop_group(proc)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> bool:
    """SIGTERM to ``proc``'s process group (its own session); SIGKILL to whatever is left
    after ``grace_s``. True when something was still running when it was called."""
    running = group_alive(proc.pid)
    if running:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while group_alive(proc.pid) and time.monotonic() < deadline:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.1)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return running


def settle(pgid: int, wait_s: float) -> bool:
    """Wait up to ``wait_s`` for the process group to end by itself; whether it did."""
    deadline = time.monotonic() + wait_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    #: processes of the block still running 15 s after it ended (a server not stopped)
    left_running: bool = False


def run_block(
    block: Block, workdir: Path, env: dict[str, str], ports: Ports, settle_s: float = 15.0
) -> Outcome:
    """``block`` as pasted, its ports rewritten, in its own session: whatever of it still
    runs ``settle_s`` after it ended is reported (``left_running``) and killed."""
    text = ports.rewrite(block.text)
    if RUN_LANGUAGES[block.language] == "bash":
        command = ["bash", "-e", "-o", "pipefail", "-c", text]
    else:
        command = [".venv/bin/python", "-c", text]
    proc = subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        out, err = proc.communicate()
        err += f"\n[timed out after {BLOCK_TIMEOUT_S} s]".encode()
        return Outcome(124, out.decode(errors="replace"), err.decode(errors="replace"))
    proc.wait()
    # a server the block stopped itself may take a few seconds to finish shutting down
    left_running = not settle(proc.pid, settle_s)
    stop_group(proc)
    return Outcome(
        proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), left_running
    )


def line_pattern(expected: str) -> re.Pattern[str]:
    """A sample line as a pattern: ``...`` inside a line stands for any text (a time)."""
    return re.compile(".*?".join(re.escape(part) for part in expected.split(ELISION)))


def sample_mismatch(sample: str, stdout: str) -> str | None:
    """Why ``stdout`` does not show ``sample`` (its lines in order, ``...`` any lines)."""
    actual = [line.rstrip() for line in stdout.splitlines()]
    position = 0
    for expected in (line.rstrip() for line in sample.splitlines()):
        if expected == ELISION:
            continue
        pattern = line_pattern(expected)
        found = next(
            (i for i in range(position, len(actual)) if pattern.fullmatch(actual[i])), None
        )
        if found is None:
            return f"sample line not in the output (in order): {expected!r}"
        position = found + 1
    return None


def regenerated_sample(sample: str, stdout: str) -> str:
    """``stdout`` as a sample. A sample that shows some lines and ends in ``...`` stays
    abridged: as many leading lines as it showed, then ``...``; any other sample (``...``
    alone included) becomes the whole output. A sample line with ``...`` inside it is kept
    where it still matches its output line."""
    lines = [line.rstrip() for line in stdout.splitlines()]
    shown = [line.rstrip() for line in sample.splitlines() if line.rstrip() != ELISION]
    for old in (line for line in shown if ELISION in line):
        pattern = line_pattern(old)
        lines = [old if pattern.fullmatch(line) else line for line in lines]
    abridged = bool(shown) and sample.splitlines()[-1].rstrip() == ELISION
    if abridged and len(lines) > len(shown):
        lines = [*lines[: len(shown)], ELISION]
    return "\n".join(lines) + "\n"


def with_samples(text: str, samples: dict[int, str]) -> str:
    """``text`` (a page) with the sample block opening at line ``n`` replaced by
    ``samples[n]``."""
    lines = text.splitlines(keepends=True)
    for opening in sorted(samples, reverse=True):
        end = opening
        while lines[end].rstrip("\n") != "```":
            end += 1
        lines[opening:end] = [samples[opening]]
    return "".join(lines)


@contextmanager
def readme_session() -> Iterator[tuple[Path, dict[str, str], Ports]]:
    """A fresh-clone working directory (``clone/`` in a temporary directory, ``shared``
    beside it) and the README's server, all gone afterwards."""
    env = block_environment()
    with tempfile.TemporaryDirectory(prefix="kperf-readme-") as tmp:
        workdir = Path(tmp) / "clone"
        workdir.mkdir()
        make_clone(workdir)
        with readme_server(workdir, env) as ports:
            yield workdir, env, ports
