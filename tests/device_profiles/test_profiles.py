"""Every packaged profile validates, cites its figures, and the loader refuses bad files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from device_profiles import ProfileError, get_profile, load_profile_file
from device_profiles.loader import PROFILE_DIR, UnknownDevice
from device_profiles.schema import Figure
from device_profiles.status import calibration_needs, default_fit

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


def _without_version_3(raw: dict) -> dict:
    """The file as schema_version 1 would hold it: no priors, no dtype ratios, no flags, no
    memory section."""

    def strip(node: object) -> object:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in ("prior", "estimate")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    out = strip({k: v for k, v in raw.items() if k not in ("gemm_ws_dtypes", "memory")})
    assert isinstance(out, dict)
    out["schema_version"] = 1
    return out


def test_version_1_file_may_not_flag_estimates_and_priors_need_version_3(tmp_path: Path) -> None:
    raw = _without_version_3(json.loads((PROFILE_DIR / "rtx-a6000.json").read_text()))
    assert load_profile_file(_write(tmp_path, "rtx-a6000", raw)).estimated_figures() == []
    raw["gemm_ws"]["t_init_us"]["estimate"] = True
    with pytest.raises(ProfileError, match="schema_version 2"):
        load_profile_file(_write(tmp_path, "rtx-a6000", raw))
    raw["schema_version"] = 2
    profile = load_profile_file(_write(tmp_path, "rtx-a6000", raw))
    assert profile.estimated_figures() == ["gemm_ws.t_init_us"]
    assert calibration_needs(profile)["gemm-ws"] == ["gemm_ws.t_init_us"]
    raw["gemm_ws"]["t_init_us"]["prior"] = {"median": 1.68, "sigma_log": 0.1, "source": "test"}
    with pytest.raises(ProfileError, match="schema_version 3"):
        load_profile_file(_write(tmp_path, "rtx-a6000", raw))
    raw["schema_version"] = 3
    assert load_profile_file(_write(tmp_path, "rtx-a6000", raw)).prior_figures() == [
        "gemm_ws.t_init_us"
    ]


def test_memory_section_needs_version_4(tmp_path: Path) -> None:
    raw = json.loads((PROFILE_DIR / "h100.json").read_text())
    assert load_profile_file(_write(tmp_path, "h100", raw)).memory is not None
    raw["schema_version"] = 3
    with pytest.raises(ProfileError, match="schema_version 4"):
        load_profile_file(_write(tmp_path, "h100", raw))


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_every_profile_has_cited_memory_priors(path: Path) -> None:
    """Latency, bandwidth, L2 size and launch time, each cited with a prior; an L2 hit is
    faster than DRAM where both were measured, and L2 outruns DRAM."""
    memory = load_profile_file(path).memory
    assert memory is not None
    for name in type(memory).model_fields:
        figure = getattr(memory, name)
        assert figure.prior is not None and figure.prior.median == figure.value, name
    assert memory.l2_bandwidth_gb_per_s.value > memory.dram_bandwidth_gb_per_s.value
    if not memory.l2_latency_ns.estimate and not memory.dram_latency_ns.estimate:
        assert memory.l2_latency_ns.value < memory.dram_latency_ns.value


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


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_the_default_fit_is_what_the_fits_take_without_one(path: Path) -> None:
    """What GET /devices/{id} says a calibration without ``fit`` fits is what the fitting
    engines fit then: every GeMM-WS figure; the Many-BSP figures the device's runs can
    depend on (perfmodel.calibration)."""
    from perfmodel.calibration import GEMM_WS_FIGURES
    from perfmodel.calibration.many_bsp import fittable_figures
    from perfmodel.manybsp.device import device_from_profile

    profile = load_profile_file(path)
    assert set(default_fit(profile, "gemm-ws")) == set(GEMM_WS_FIGURES)
    if profile.missing_many_bsp_figures():
        return  # Many-BSP serves it once cited: no fit runs on it yet
    expected = fittable_figures(device_from_profile(profile).device)
    assert set(default_fit(profile, "many-bsp")) == set(expected)
