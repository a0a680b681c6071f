"""mu fitted to the Many-BSP worked examples' measured cycles, leave one kernel out (calibration).

Usage: python -m bench.bench_many_bsp_mu

Per paper device (GTX 760, 940MX), the three worked examples (Hotspot, KNN, MM; PTX, launch
and n_ma of tests/fixtures/ptx/paper/cases.json) with the measured kernel cycles the paper
prints. For each kernel: its cycles predicted with the published mu, and with mu fitted to the
other two kernels (leave-one-kernel-out, fit_many_bsp(fit=["mu"], folds=3)), next to the
paper's own eq. (27) error. Then all three default figures fitted to the three kernels, which
the data cannot determine.
"""

from __future__ import annotations

import sys

from bench.common import command_line
from perfmodel.calibration import ManyBspMeasurement, fit_many_bsp, predict_many_bsp_cycles
from tests.perfmodel.manybsp.conftest import CASES, paper_request


def main() -> int:
    print(f"command: {command_line()}\n")
    print(
        "| example | measured cycles | paper's prediction (error) | ours, published mu "
        "(error) | mu fitted to the other two | ours, held out (error) |"
    )
    print("|---|---|---|---|---|---|")
    notes = []
    for device in ("gtx-760", "940mx"):
        cases = [c for c in CASES if c["device"] == device]
        data = [
            ManyBspMeasurement(paper_request(c), float(c["published"]["measured_cycles"]))
            for c in cases
        ]
        base = data[0].request.device
        loko = fit_many_bsp(base, data, fit=["mu"], folds=3)
        for i, (case, m) in enumerate(zip(cases, data, strict=True)):
            rest = [d for j, d in enumerate(data) if j != i]
            mu_i = fit_many_bsp(base, rest, fit=["mu"], folds=0).fitted[0]
            published = case["published"]["kernel_exec_cycle"]
            ours = predict_many_bsp_cycles(base, m.request)
            held_out = loko.cross_validation_residuals[i]
            print(
                f"| {case['id']} | {m.measured_cycles:,.0f} | {published:,} "
                f"({100 * (published / m.measured_cycles - 1):+.2f} %) | {ours:,.0f} "
                f"({100 * (ours / m.measured_cycles - 1):+.2f} %) | {mu_i.value:.3f}"
                f"{'' if mu_i.identifiable else ' (n.i.)'} | {held_out.predicted:,.0f} "
                f"({held_out.error_pct:+.2f} %) |"
            )
        mu = loko.fitted[0]
        cv = loko.cross_validation_error
        assert cv is not None
        notes.append(
            f"{device}: published mu {mu.base_value}; mu fitted to all three kernels "
            f"{mu.value:.3f} +- {mu.standard_error:.3f} (training error mean "
            f"{loko.training_error.mean_abs_pct:.2f} %, max {loko.training_error.max_abs_pct:.2f} "
            f"%); leave-one-kernel-out error mean {cv.mean_abs_pct:.2f} %, max "
            f"{cv.max_abs_pct:.2f} %"
        )
        everything = fit_many_bsp(base, data, folds=3)
        figures = ", ".join(f"{f.name}: identifiable={f.identifiable}" for f in everything.fitted)
        notes.append(f"{device}, all three figures from three kernels: {figures}")
        notes += [f"  warning: {w}" for w in everything.warnings]
    print()
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
