"""``kperf ... | head -1``: a reader that leaves early is no error (exit 0, nothing on stderr)."""

from __future__ import annotations

import io
import subprocess
import sys

from kperf_client.cli import main
from tests.app.service_helpers import REPO, clean_environ, live_server

__all__ = ["clean_environ", "live_server"]


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_is_no_error(live_server: str) -> None:
    err = io.StringIO()
    assert main(["devices", "--url", live_server], out=_ClosedPipe(), err=err) == 0
    assert err.getvalue() == ""


def test_a_reader_gone_before_the_output(live_server: str) -> None:
    """A real pipe whose reader has closed: the write fails with EPIPE in the process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kperf_client.cli", "devices", "--json", "--url", live_server],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has written anything
    with proc.stderr:
        stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, stderr
    assert stderr == b""
