"""``kperf table --verify``: time the few configurations per M the service ranks highest, feed
the runs back, refit the device, ask again; then rewrite the table from what was measured.

The loop needs something that times one configuration at one M (:class:`Bench`): on a machine
with a GPU the Triton bench (kperf_client/triton_bench.py); without one, timings recorded
before (:class:`RecordedBench`, a JSON-lines file), which is how the tests and
bench/bench_table_verify.py run it. Each round asks ``POST /tuning-table`` for every key's
shortlist (``shortlist_per_m``), adds the fastest configuration timed so far at each
neighbouring key, times the ones not timed yet at this key, posts them to
``POST /devices/{id}/measurements`` and refits (``POST /devices/{id}/recalibrate``): the next
round asks the refit device. It stops when a round finds nothing new to time, or after
``rounds``. The table written takes, per key, the fastest configuration timed at that key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kperf_client.client import KperfClient
from kperf_client.models import EngineConfig, TableEntry, TuningTableResponse

#: the six integers of one engine entry, in the engines' order (the client's view of them)
ENGINE_FIELDS = tuple(EngineConfig.model_fields)

ConfigKey = tuple[int, ...]


def config_key(config: EngineConfig | Mapping[str, Any]) -> ConfigKey:
    values = config.model_dump() if isinstance(config, EngineConfig) else config
    return tuple(int(values[f]) for f in ENGINE_FIELDS)


class Bench(Protocol):
    """Times one configuration of the GEMM (m x k) @ (k x n) on the device, in us."""

    def time_us(self, m: int, n: int, k: int, dtype: str, config: Mapping[str, int]) -> float: ...


@dataclass
class RecordedBench:
    """Timings recorded before, one JSON object per line: m, n, k, dtype, the six engine
    integers and ``measured_time_us``. Asking for one not recorded is a KeyError."""

    times: dict[tuple[Any, ...], float]

    @classmethod
    def from_file(cls, path: Path) -> RecordedBench:
        times = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                run = json.loads(line)
                times[_run_key(run["m"], run["n"], run["k"], run["dtype"], run)] = float(
                    run["measured_time_us"]
                )
        return cls(times)

    def time_us(self, m: int, n: int, k: int, dtype: str, config: Mapping[str, int]) -> float:
        return self.times[_run_key(m, n, k, dtype, config)]


def _run_key(m: int, n: int, k: int, dtype: str, config: Mapping[str, Any]) -> tuple[Any, ...]:
    return (int(m), int(n), int(k), str(dtype), *config_key(config))


@dataclass
class Timed:
    """One configuration timed at one key."""

    m: int
    config: EngineConfig
    tiling: dict[str, int]
    time_us: float


@dataclass
class VerifyResult:
    """The rewritten table and what the loop spent."""

    #: the device the last round asked (the refit profile's id)
    device: str
    rounds: int
    #: configurations timed (one run each) and the sum of their times, us
    runs: int
    gpu_time_us: float
    #: the last table the service answered (before the rewrite from the timings)
    answer: TuningTableResponse
    #: the first one (from the device as given, before any timing)
    first: TuningTableResponse
    #: str(M) -> the fastest configuration timed at that key (the file to write)
    file: dict[str, dict[str, int]]
    #: per key, the time of that configuration, us
    best_time_us: dict[int, float]
    timed: list[Timed] = field(default_factory=list)


def _run(answer: TuningTableResponse, timed: Timed) -> dict[str, Any]:
    """One GeMM-WS measurement for POST /devices/{id}/measurements."""
    return {
        "m": timed.m,
        "n": answer.n,
        "k": answer.k,
        "dtype": answer.dtype,
        **timed.tiling,
        "measured_time_us": timed.time_us,
    }


def _fastest_so_far(timed: Sequence[Timed]) -> dict[int, Timed]:
    best: dict[int, Timed] = {}
    for t in timed:
        if t.m not in best or t.time_us < best[t.m].time_us:
            best[t.m] = t
    return best


def _fastest(timed: Sequence[Timed], entries: Sequence[TableEntry]) -> dict[int, Timed]:
    best = _fastest_so_far(timed)
    missing = [e.m for e in entries if e.m not in best]
    if missing:
        raise ValueError(f"no configuration timed at M = {missing}")
    return best


async def verify_table(
    client: KperfClient,
    body: Mapping[str, Any],
    bench: Bench,
    *,
    rounds: int = 5,
    fit_time_limit_s: float = 60.0,
) -> VerifyResult:
    """Run the loop for the table ``body`` asks (a /tuning-table request naming ``device``)."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    if body.get("device") is None:
        raise ValueError("device: the loop refits a device profile; name one")
    if body.get("max_distinct_configs") is not None:
        raise ValueError("max_distinct_configs: the verified table takes each key's fastest")
    device = str(body["device"])
    seen: dict[tuple[int, ConfigKey], Timed] = {}
    done = 0
    answer: TuningTableResponse | None = None
    first: TuningTableResponse | None = None
    for done in range(1, rounds + 1):  # noqa: B007 - the rounds run are reported
        answer = await client.tuning_table({**body, "device": device})
        first = first or answer
        new = []
        entries = answer.entries
        fastest = _fastest_so_far(list(seen.values()))
        for i, entry in enumerate(entries):
            # the model's shortlist, and the fastest timed so far at the neighbouring keys
            # (a configuration the refit cannot rank, because its edge lies outside the
            # model, often wins next door too)
            picks = [(item.config, item.tiling.model_dump()) for item in entry.shortlist]
            for j in (i - 1, i + 1):
                if 0 <= j < len(entries) and entries[j].m in fastest:
                    won = fastest[entries[j].m]
                    picks.append((won.config, won.tiling))
            for config, tiling in picks:
                key = (entry.m, config_key(config))
                if key in seen:
                    continue
                values = config.model_dump()
                time_us = bench.time_us(entry.m, answer.n, answer.k, answer.dtype, values)
                timed = Timed(entry.m, config, tiling, time_us)
                seen[key] = timed
                new.append(timed)
        if not new:
            break
        await client.add_measurements(device, "gemm-ws", [_run(answer, t) for t in new])
        refit = {"model": "gemm-ws", "time_limit_s": fit_time_limit_s}
        device = (await client.recalibrate(device, refit)).device
    assert answer is not None and first is not None
    timed_all = list(seen.values())
    best = _fastest(timed_all, answer.entries)
    return VerifyResult(
        device=device,
        rounds=done,
        runs=len(timed_all),
        gpu_time_us=sum(t.time_us for t in timed_all),
        answer=answer,
        first=first,
        file={str(m): best[m].config.model_dump() for m in sorted(best)},
        best_time_us={m: best[m].time_us for m in sorted(best)},
        timed=timed_all,
    )
