"""A user-side install (no ``kperf[server]``): the commands that need the server say what to
install instead of failing with a traceback; the ones given ``--url`` never import it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: run the CLI as if the server's dependencies were not installed (an import of them fails)
BLOCKED = "import sys\nfor name in ('fastapi', 'uvicorn', 'z3'):\n    sys.modules[name] = None\n"


def run_cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    code = BLOCKED + f"from kperf_client.cli import main\nsys.exit(main({argv!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "argv", [["devices"], ["serve", "--port", "1"]], ids=["in-process", "serve"]
)
def test_a_command_that_needs_the_server_names_the_extra(argv: list[str]) -> None:
    done = run_cli(argv)
    assert done.returncode == 2, done.stderr
    assert "pip install 'kperf[server]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_command_with_a_url_runs_without_the_server() -> None:
    # nothing listens on port 9 (discard): the client fails to connect, as a client, exit 1
    done = run_cli(["devices", "--url", "http://127.0.0.1:9"])
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: ") and "kperf[server]" not in done.stderr


def test_every_install_of_the_service_names_the_server_extra() -> None:
    """README's start command and the image install the server extra (a bare ``pip install .``
    is the user side alone, which cannot ``kperf serve``)."""
    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    serve = [
        line for line in readme.splitlines() if "kperf serve" in line and "pip install" in line
    ]
    assert serve and all("'.[server]'" in line for line in serve)
    dockerfile = (repo / "Dockerfile").read_text(encoding="utf-8")
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and all("'.[server]'" in line for line in installs)
