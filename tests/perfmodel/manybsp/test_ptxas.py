"""Why ptxas gave no registers: each failure is named, never reported as "not on PATH"."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfmodel.manybsp import ptxas

MODULE = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k()
{
\tret;
}
"""


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    ptxas._registers.cache_clear()
    yield
    ptxas._registers.cache_clear()


def _fake_ptxas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """A ``ptxas`` on PATH running ``script`` (sh), which logs each call to ``calls``."""
    exe = tmp_path / "ptxas"
    exe.write_text(f'#!/bin/sh\necho "$2" >> {tmp_path / "calls"}\n{script}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path / "calls"


def _reason(kernel: str = "k") -> str:
    with pytest.raises(ptxas.PtxasUnavailable) as info:
        ptxas.ptxas_registers(MODULE, kernel, "sm_80")
    return str(info.value)


def test_absent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _reason() == "ptxas is not on PATH"


def test_refused_names_ptxas_error_for_each_target(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_ptxas(
        tmp_path, monkeypatch, "echo 'ptxas k.ptx, line 3; error   : Unknown symbol' >&2; exit 255"
    )
    reason = _reason()
    assert reason.count("Unknown symbol") == 2, reason
    assert "for sm_80" in reason and f"for {ptxas.FALLBACK_TARGET}" in reason


def test_timeout_is_named_and_the_fallback_not_tried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _fake_ptxas(tmp_path, monkeypatch, f"exec {shutil.which('sleep')} 30")
    monkeypatch.setattr(ptxas, "PTXAS_TIMEOUT_S", 0.3)
    assert "did not finish within 0.3 s" in _reason()
    assert calls.read_text().split() == ["--gpu-name=sm_80"]


def test_killed_by_a_signal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_ptxas(tmp_path, monkeypatch, "kill -KILL $$")
    assert "killed by SIGKILL" in _reason()


def test_kernel_missing_from_the_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = "echo \"ptxas info    : Compiling entry function 'other' for 'sm_80'\"; "
    script += "echo 'ptxas info    : Used 12 registers'"
    _fake_ptxas(tmp_path, monkeypatch, script)
    assert "no registers for kernel k" in _reason()
    # the kernel it does report is read
    ptxas._registers.cache_clear()
    assert ptxas.ptxas_registers(MODULE, "other", "sm_80") == (12, "sm_80")
