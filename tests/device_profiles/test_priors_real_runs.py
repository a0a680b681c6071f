"""The scale of the shipped priors against real measured GEMM times (priors must be of the right
size): the public Kernel Tuner data set in ../shared (read at test time; skipped when absent)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from app.convert.optimize import gemm_ws_machine
from device_profiles import get_profile
from device_profiles.priors import gemm_ws_priors
from perfmodel.gemm_ws import GemmShape, Tiling, simulate

#: ../shared relative to the repository root
XGEMM = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "data"
    / "real-gemm"
    / "kt_xgemm_sgemm4096"
    / "xgemm_sgemm4096_all.csv"
)
THROUGHPUTS = ("load_throughput_elements_per_us", "compute_throughput_macs_per_us")


def _best_per_tile(gpu_prefix: str) -> dict[tuple[int, int, int], float]:
    """Fastest measured time (ms) per work-group tile (MWG, NWG, KWG) of CLBlast's SGEMM
    4096^3 (PROVENANCE.md beside the file: fp32, single-buffered, Kernel Tuner means)."""
    if not XGEMM.exists():
        pytest.skip(f"{XGEMM} absent (public data set, not in the repository)")
    best: dict[tuple[int, int, int], float] = {}
    with XGEMM.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["gpu"].startswith(gpu_prefix):
                key = (int(row["MWG"]), int(row["NWG"]), int(row["KWG"]))
                best[key] = min(best.get(key, math.inf), float(row["time_ms"]))
    return best


def test_a100_prior_predicts_measured_sgemm_within_its_spread() -> None:
    """Every measured A100 tile best lies within two sigma_log (of the throughput priors, the
    figures a GEMM's time scales with) of what the a100 priors' medians predict, fp32, buffer
    depth 1 (the kernel stages one tile at a time); and the model is slow, not fast (it cannot
    overlap one CTA's loads with another's MATH: docs/model-notes.md, "Priors")."""
    best = _best_per_tile("A100")
    assert len(best) >= 16  # PROVENANCE.md: the union of the runs covers search-space set 2
    profile = get_profile("a100")
    sigma = max(gemm_ws_priors(profile)[name].sigma_log for name in THROUGHPUTS)
    machine = gemm_ws_machine(profile, "fp32")
    shape = GemmShape(4096, 4096, 4096)
    log_ratios = sorted(
        math.log(simulate(shape, Tiling(tm, tn, tk, 1), machine).overall_time_ns / 1e6 / ms)
        for (tm, tn, tk), ms in best.items()
    )
    assert all(abs(r) <= 2 * sigma for r in log_ratios), log_ratios
    assert log_ratios[len(log_ratios) // 2] > 0
