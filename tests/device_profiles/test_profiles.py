"""Every packaged profile validates, cites its figures, and the loader refuses bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from device_profiles import ProfileError, get_profile, load_profile_file
from device_profiles.loader import PROFILE_DIR, UnknownDevice
from device_profiles.schema import Figure

PROFILE_FILES = sorted(PROFILE_DIR.glob("*.json"))


def _figures(node: object) -> list[Figure]:
    if isinstance(node, Figure):
        return [node]
    if isinstance(node, dict):
        return [f for v in node.values() for f in _figures(v)]
    if isinstance(node, list | tuple):
        return [f for v in node for f in _figures(v)]
    if isinstance(node, BaseModel):
        return [f for name in type(node).model_fields for f in _figures(getattr(node, name))]
    return []


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_profile_loads_and_every_figure_is_cited(path: Path) -> None:
    profile = load_profile_file(path)
    assert profile.id == path.stem
    figures = _figures(profile)
    assert figures, "a profile without figures serves no model"
    for figure in figures:
        assert len(figure.source.strip()) >= 10, f"{path.name}: figure {figure} lacks a source"


def test_a6000_figures_are_the_papers() -> None:
    # warp-specialization-gemm-model.txt §4.2 and §2.1.1.
    a6000 = get_profile("rtx-a6000")
    assert a6000.gemm_ws is not None
    assert a6000.hardware.sm_count.value == 84
    assert a6000.gemm_ws.t_init_us.value == pytest.approx(1.680)
    assert a6000.gemm_ws.t_epilogue_us.value == pytest.approx(1.543)
    assert a6000.gemm_ws.load_startup_latency_us.value == pytest.approx(0.770)
    assert a6000.gemm_ws.compute_startup_latency_us.value == 0
    assert "gemm-ws" in a6000.models_served()


def _write(tmp_path: Path, name: str, body: object) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(body))
    return path


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    raw = json.loads((PROFILE_DIR / "rtx-a6000.json").read_text())
    raw["schema_version"] = 99
    with pytest.raises(ProfileError, match="schema_version 99"):
        load_profile_file(_write(tmp_path, "rtx-a6000", raw))


def test_id_must_match_file_name(tmp_path: Path) -> None:
    raw = json.loads((PROFILE_DIR / "rtx-a6000.json").read_text())
    with pytest.raises(ProfileError, match="file name"):
        load_profile_file(_write(tmp_path, "other", raw))


def test_uncited_figure_is_refused(tmp_path: Path) -> None:
    raw = json.loads((PROFILE_DIR / "rtx-a6000.json").read_text())
    raw["hardware"]["sm_count"] = {"value": 84, "source": ""}
    with pytest.raises(ProfileError, match="source"):
        load_profile_file(_write(tmp_path, "rtx-a6000", raw))


def test_unknown_device_lists_known_ids() -> None:
    with pytest.raises(UnknownDevice) as info:
        get_profile("no-such-gpu")
    assert "rtx-a6000" in str(info.value)
