"""Every packaged profile validates, cites its figures, and the loader refuses bad files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from device_profiles import ProfileError, calibration_needs, get_profile, load_profile_file
from device_profiles.loader import PROFILE_DIR, UnknownDevice
from device_profiles.schema import Figure

PROFILE_FILES = sorted(PROFILE_DIR.glob("*.json"))

#: numbers a paper gives as zero: GeMM-WS §4.2.3 "its startup latency is negligible"
ZERO_BY_SOURCE = {"gemm_ws.compute_startup_latency_us"}


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


def _cited(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, object) of every JSON object with a "source" key: figures, instruction
    classes, barrier and synchronization points, read from the raw file."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if "source" in node:
            found.append((path, node))
        for key, value in node.items():
            found += _cited(value, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for item in node:
            found += _cited(item, path)
    return found


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_profile_loads_and_every_figure_is_cited(path: Path) -> None:
    profile = load_profile_file(path)
    assert profile.id == path.stem
    figures = _figures(profile)
    assert figures, "a profile without figures serves no model"
    for figure in figures:
        assert len(figure.source.strip()) >= 10, f"{path.name}: figure {figure} lacks a source"


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_every_number_is_cited_finite_and_positive(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    cited = _cited(raw)
    assert cited
    for where, item in cited:
        assert len(item["source"].strip()) >= 10, f"{path.name}: {where} lacks a source"
        numbers = {k: v for k, v in item.items() if isinstance(v, int | float)}
        numbers = {k: v for k, v in numbers.items() if not isinstance(v, bool)}
        for key, value in numbers.items():
            assert math.isfinite(value), f"{path.name}: {where}.{key}"
            assert value > 0 or where in ZERO_BY_SOURCE, f"{path.name}: {where}.{key} = {value}"


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_estimates_say_so_and_need_version_2(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    flagged = [(w, item) for w, item in _cited(raw) if item.get("estimate") is True]
    for where, item in flagged:
        assert "estimate" in item.get("note", ""), f"{path.name}: {where} hides that it estimates"
    if flagged:
        assert raw["schema_version"] >= 2
    profile = load_profile_file(path)
    assert profile.estimated_figures() == sorted({w for w, _ in flagged})


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


def _version_1(raw: dict[str, Any]) -> dict[str, Any]:
    """The A6000 file as schema_version 1 had it: its §4.2 figures, no priors, no dtype
    ratios, no (estimated) Many-BSP section."""
    gemm = {k: {f: v for f, v in fig.items() if f != "prior"} for k, fig in raw["gemm_ws"].items()}
    del gemm["dtype_ratios"]
    return {
        **{k: v for k, v in raw.items() if k != "many_bsp"},
        "schema_version": 1,
        "gemm_ws": gemm,
    }


def test_version_1_file_may_not_flag_estimates(tmp_path: Path) -> None:
    raw = _version_1(json.loads((PROFILE_DIR / "rtx-a6000.json").read_text()))
    assert load_profile_file(_write(tmp_path, "rtx-a6000", raw)).schema_version == 1
    raw["gemm_ws"]["t_init_us"]["estimate"] = True
    with pytest.raises(ProfileError, match="schema_version 2"):
        load_profile_file(_write(tmp_path, "rtx-a6000", raw))
    raw["schema_version"] = 2
    profile = load_profile_file(_write(tmp_path, "rtx-a6000", raw))
    assert profile.estimated_figures() == ["gemm_ws.t_init_us"]
    assert calibration_needs(profile)["gemm-ws"] == ["gemm_ws.t_init_us"]


@pytest.mark.parametrize("feature", ["prior", "dtype_ratios"])
def test_priors_and_dtype_ratios_need_version_3(tmp_path: Path, feature: str) -> None:
    shipped = json.loads((PROFILE_DIR / "rtx-a6000.json").read_text())
    raw = _version_1(shipped)
    raw["schema_version"] = 2
    if feature == "prior":
        raw["gemm_ws"]["t_init_us"]["prior"] = shipped["gemm_ws"]["t_init_us"]["prior"]
    else:
        raw["gemm_ws"]["dtype_ratios"] = shipped["gemm_ws"]["dtype_ratios"]
    with pytest.raises(ProfileError, match="schema_version 3"):
        load_profile_file(_write(tmp_path, "rtx-a6000", raw))
    raw["schema_version"] = 3
    assert load_profile_file(_write(tmp_path, "rtx-a6000", raw)).schema_version == 3


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
