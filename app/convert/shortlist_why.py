"""Why each shortlist entry holds its rank: one sentence per rank, from what the answer
already carries (the solve's status, the shortlist's mode and belief, each entry's point
prediction and probability of being the fastest).

The order it explains (solver/shortlist.py): rank 1 is the point estimate's optimum in both
modes; ``exploit`` continues in the point estimate's order; ``explore`` continues with the
tilings most often fastest across the draws of the device's figures, then, among those that
are fastest in no draw, in the point estimate's order. A tiling whose predicted time ties a
better-ranked one's is never counted fastest (a tie goes to the better point rank), which is
why it may follow slower tilings that win some draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BELIEFS = {
    "calibration": "the device's calibrated posterior",
    "priors": "the device's priors (uncalibrated)",
}


@dataclass(frozen=True, slots=True)
class Ranked:
    """One shortlist rank as answered: its point prediction and probability of being best."""

    predicted_time_us: float
    probability_best: float | None


def reasons(
    entries: Sequence[Ranked],
    *,
    proven: bool,
    mode: str | None,
    belief: str | None,
    draws: int,
) -> list[str]:
    """The ``why`` of each of ``entries`` (rank 1 first)."""
    drawn = mode == "explore" and belief in BELIEFS and draws > 0
    out = []
    for index, entry in enumerate(entries):
        rank = index + 1
        if rank == 1:
            out.append(
                "proven optimum: the fastest predicted time under the device's point figures "
                "(Z3 certificate)"
                if proven
                else "best found within the time limit under the device's point figures "
                "(not proven)"
            )
        elif not drawn or entry.probability_best is None:
            out.append(f"next fastest under the device's point figures (point rank {rank})")
        elif entry.probability_best > 0:
            wins = round(entry.probability_best * draws)
            out.append(
                f"next likeliest true best: the fastest in {wins} of {draws} draws from "
                f"{BELIEFS[str(belief)]}, P(best)={entry.probability_best:.3g}"
            )
        else:
            out.append(_never_fastest(entries, index))
    return out


def _never_fastest(entries: Sequence[Ranked], index: int) -> str:
    entry = entries[index]
    tie = next(
        (j + 1 for j in range(index) if entries[j].predicted_time_us == entry.predicted_time_us),
        None,
    )
    if tie is not None:
        return (
            f"predicts the same time as rank {tie} ({entry.predicted_time_us} us); a draw they "
            "tie goes to the better point rank, and this one is the fastest in no draw, so it "
            "follows every tiling that is"
        )
    return (
        "the fastest in no draw: after the tilings that are, the next fastest under the "
        "device's point figures"
    )
