"""``pip install .`` with no extra, in a fresh virtual environment, is a working
user side: ``kperf devices --url`` and ``kperf optimize --url`` answer from a running service,
and none of the server's dependencies was installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.app.service_helpers import REPO, start_server, stop_server

#: the whole test, install included, stays under this (the network is the slow part)
BUDGET_S = 85.0
#: pip's words when the package index cannot be reached: skipped, not failed
NO_NETWORK = re.compile(
    r"No matching distribution|Could not find a version|Failed to establish a new connection|"
    r"Temporary failure in name resolution|Network is unreachable|ConnectionError|ReadTimeout",
)


def copy_sources(target: Path) -> None:
    """What ``pip install .`` reads: pyproject, README and every package it installs."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, target / name)
    for pattern in packages:
        package = pattern.rstrip("*")
        shutil.copytree(
            REPO / package, target / package, ignore=shutil.ignore_patterns("__pycache__")
        )


@pytest.mark.slow
def test_a_bare_install_is_a_working_client(tmp_path: Path) -> None:
    started = time.monotonic()

    def left_s() -> float:
        return BUDGET_S - (time.monotonic() - started)

    source = tmp_path / "src"
    source.mkdir()
    copy_sources(source)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=left_s())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KPERF_", "VIRTUAL_ENV"))}
    try:
        install = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "."],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
            timeout=left_s() - 20,  # the rest: a server and two commands
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip install . did not finish within the {BUDGET_S:.0f} s budget (network)")
    if install.returncode != 0 and NO_NETWORK.search(install.stderr):
        pytest.skip(f"no package index reachable: {install.stderr.strip().splitlines()[-1]}")
    assert install.returncode == 0, install.stderr
    python = venv / "bin" / "python"
    server_modules = ("fastapi", "z3", "numpy", "scipy", "matplotlib", "uvicorn")
    probe = f"import importlib.util as u; print([m for m in {server_modules!r} if u.find_spec(m)])"
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", "installed without the server extra"
    kperf = venv / "bin" / "kperf"

    def run_kperf(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(kperf), *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=max(left_s(), 1.0),
        )

    server, url = start_server()
    try:
        devices = run_kperf("devices", "--url", url, "--json")
        assert devices.returncode == 0, devices.stderr
        assert '"id": "rtx-a6000"' in devices.stdout
        problem = ("--m", "1024", "--n", "1024", "--k", "1024", "--device", "rtx-a6000")
        optimize = run_kperf("optimize", *problem, "--url", url)
        assert optimize.returncode == 0, optimize.stderr
        assert "status optimal" in optimize.stdout
    finally:
        stop_server(server)
    # without a URL the bare install cannot run the service: it says what to install
    local = run_kperf("devices")
    assert local.returncode == 2 and "kperf[server]" in local.stderr
