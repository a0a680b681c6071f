"""Kernel Tuner plug-in: a search strategy that asks kperf which tiles to try first.

::

    from kperf_client.kernel_tuner import KperfStrategy

    strategy = KperfStrategy("http://127.0.0.1:8000", "rtx-a6000", m=4096, n=4096, k=4096,
                             dtype="fp32", seed=1)
    results, env = kernel_tuner.tune_kernel("Xgemm", source, (4096, 4096), args, tune_params,
                                            strategy=strategy,
                                            strategy_options={"max_fevals": 300})

Kernel Tuner 1.5 takes as ``strategy=`` any object with a ``tune(searchspace, runner,
tuning_options)`` method returning the results (``kernel_tuner/interface.py``: "check for
user-defined strategy"; its own strategies are modules with that function). The strategy
evaluates configurations only through Kernel Tuner's ``CostFunc``
(``kernel_tuner/strategies/common.py``), so its budget (``max_fevals``, ``time_limit``), cache,
simulation mode and result records are Kernel Tuner's own.

How it searches:

1. The tune parameters naming the work-group tile (``MWG``/``NWG``/``KWG`` for CLBlast's
   Xgemm by default, :class:`KernelTunerNames`) and the buffer depth (a parameter, or a fixed
   ``buffer_depth``) give each configuration its tiling; every other parameter (thread
   shapes, vector widths, ...) is one the model does not see.
2. ``/optimize-tiling`` predicts each tiling's time (explicit ``candidates``, one per
   tiling). That prediction is the prior of a surrogate of the whole space
   (:mod:`kperf_client.kernel_tuner_surrogate`): log time = kperf's log time + a per-tiling
   correction + one effect per value of each other parameter, shared by all tilings, fitted
   to the runs (Bayesian linear regression).
3. The first configuration is the prior's fastest. Then each evaluation draws one model
   from the posterior (Thompson sampling) and measures, most of the time, the unmeasured
   one-parameter neighbour of the fastest configuration so far that the draw predicts
   fastest; ``explore`` of the time (or with no neighbour left) the unmeasured
   configuration it predicts fastest anywhere. Failed configurations teach the surrogate
   they are slow.
4. Every ``recalibrate_every`` evaluations, each tiling's fastest time so far (the model
   predicts what a tiling reaches with its best inner parameters), when new, is posted as a
   GeMM-WS run of the device (``POST /devices/{id}/measurements``, Kernel Tuner's ``time``
   in ms x 1000 = ``measured_time_us``); once ``MIN_RUNS_TO_FIT`` runs have been posted the
   device is refit (``POST /devices/{id}/recalibrate``) and the refit profile's predictions
   become the surrogate's prior. What is left is posted when the tuning ends (no refit then).

The service down, slow (past ``timeout_s``) or refusing never fails the tuning: one random
configuration of every tiling is measured first, in a random order, and the surrogate goes
on without kperf's prior; one warning per kind of trouble (logger
``kperf_client.kernel_tuner``, through :mod:`logging`).
``kernel_tuner`` itself is imported when the strategy runs, not with this module.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, Unpack

from kperf_client.session import KperfSession, SessionOptions, reason_of, service_trouble
from kperf_client.triton_configs import DTYPES, Problem, Tiling, candidate

__all__ = ["KernelTunerNames", "KperfStrategy"]

logger = logging.getLogger(__name__)

#: Kernel Tuner reports ``time`` in milliseconds; kperf's runs are microseconds
US_PER_MS = 1000.0
#: a GeMM-WS refit fits six figures and takes at least one run more (README, "Calibrate")
MIN_RUNS_TO_FIT = 7

#: the largest refit budget asked (a server's default maximum time_limit_s)
MAX_REFIT_S = 120.0
#: the share of draws taken from the whole space rather than around the fastest
#: configuration measured (the rest: its one-parameter neighbours)
EXPLORE = 0.2
#: a count never reached (no automatic post or refit: the strategy decides when)
NEVER = 10**9

Config = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class KernelTunerNames:
    """Which tune parameters are kperf's tile (TM, TN, TK) and buffer depth: CLBlast's Xgemm
    names by default; ``buffer_depth`` None means every configuration has the strategy's
    fixed ``buffer_depth`` (Xgemm stages one tile of A and B in shared memory: 1)."""

    tile_m: str = "MWG"
    tile_n: str = "NWG"
    tile_k: str = "KWG"
    buffer_depth: str | None = None


class KperfStrategy(KperfSession):
    """A Kernel Tuner strategy (``tune_kernel(..., strategy=KperfStrategy(...))``) that
    starts from kperf's predictions for the tilings, learns the other parameters from the
    runs, measures through Kernel Tuner and feeds the times back to ``device``. See the
    module docstring.

    ``m``, ``n``, ``k``, ``dtype``: the GEMM tuned (Kernel Tuner's ``problem_size`` rarely
    holds all three). ``url`` None: an in-process service (``kperf[server]``). ``explore``:
    the share of draws from the whole space instead of the fastest configuration's
    neighbours. ``seed``: the strategy's own random choices (posterior draws, ties, the
    fallback order).
    """

    log = logger

    def __init__(
        self,
        url: str | None,
        device: str,
        *,
        m: int,
        n: int,
        k: int,
        dtype: str = "fp32",
        names: KernelTunerNames | None = None,
        buffer_depth: int = 1,
        explore: float = EXPLORE,
        recalibrate_every: int = 50,
        seed: int | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: one of {DTYPES}, got {dtype!r}")
        for what, value in (("m", m), ("n", n), ("k", k), ("buffer_depth", buffer_depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what}: a positive integer, got {value!r}")
        if recalibrate_every < 1:
            raise ValueError(f"recalibrate_every: at least 1, got {recalibrate_every}")
        if not 0 <= explore <= 1:
            raise ValueError(f"explore: in [0, 1], got {explore}")
        super().__init__(url, device, default_dtype=dtype, **options)
        # a refit may take most of the wait (the service's default budget at least)
        self.recalibrate_time_limit_s = min(MAX_REFIT_S, max(10.0, 0.8 * self.timeout_s))
        self.problem = Problem(m, n, k, dtype)
        self.names = names if names is not None else KernelTunerNames()
        self.buffer_depth = buffer_depth
        self.explore = explore
        self.recalibrate_every = recalibrate_every
        self.seed = seed
        #: what the last tune did, for tests and the curious: each ranking asked (tilings,
        #: best first), runs handed to the service, whether it fell back to a random order
        self.rankings: list[list[Tiling]] = []
        #: the latest ranking's predicted time per tiling, us
        self.predicted_us: dict[Tiling, float] = {}
        self.runs_sent = 0
        self.fell_back = False

    def tune(self, searchspace: Any, runner: Any, tuning_options: Any) -> list[dict[str, Any]]:
        """Kernel Tuner's strategy entry point: the results of every evaluation."""
        from kernel_tuner.strategies.common import CostFunc
        from kernel_tuner.util import StopCriterionReached

        cost = CostFunc(searchspace, tuning_options, runner)
        self.fell_back = False
        configs = [tuple(c) for c in searchspace.list]
        search = _Search(self, list(searchspace.tune_params), configs, cost)
        try:
            search.run()
        except StopCriterionReached as stop:
            if getattr(tuning_options, "verbose", False):
                print(stop)
        finally:
            search.post_runs(final=True)
        results: list[dict[str, Any]] = cost.results
        return results

    # ------------------------------------------------------------------ the service

    def ranked_tilings(self, tilings: Sequence[Tiling]) -> list[tuple[Tiling, float | None]]:
        """``tilings`` best first with their ``probability_best`` (kperf's ranking; those it
        finds infeasible last, with 0); empty when the service could not rank them (warned)."""
        if self._service_down():
            return []
        try:
            ranking = self.rank(self.problem, [candidate(t, {}) for t in tilings])
        except Exception as exc:  # noqa: BLE001 - never fail the user's tuning
            if service_trouble(exc):
                self._mark_down()
            self.warn_once(
                "rank",
                f"{self.portal.url} did not rank the tilings ({reason_of(exc)}); trying them "
                "in a random order",
            )
            return []
        ranked = [
            (tilings[p], q) for p, q in zip(ranking.order, ranking.probability_best, strict=True)
        ]
        seen = set(ranking.order)
        ranked += [(t, 0.0) for i, t in enumerate(tilings) if i not in seen]
        self.rankings.append([t for t, _ in ranked])
        self.predicted_us = {
            tilings[p]: float(us)
            for p, us in zip(ranking.order, ranking.predicted_time_us, strict=False)
            if us is not None
        }
        return ranked


class _Search:
    """One tuning: the search space, its tilings, the surrogate, what was measured."""

    def __init__(
        self, strategy: KperfStrategy, param_names: list[str], configs: list[Config], cost: Any
    ) -> None:
        self.strategy = strategy
        self.cost = cost
        self.rng = random.Random(strategy.seed)
        self.times: dict[Config, float] = {}  # evaluated -> cost (inf: invalid)
        self.run_time_ms: dict[Tiling, float] = {}  # fastest measured 'time' per tiling
        self.posted_ms: dict[Tiling, float] = {}
        self.since_post = 0
        self.results_read = 0
        self.configs: list[Config] = []  # those with a tiling, the surrogate's rows
        self.row_of: dict[Config, int] = {}
        self.tiling_of: dict[Config, Tiling] = {}
        self.tilings: list[Tiling] = []
        self.neighbours_index: dict[tuple[int, Config], list[int]] = {}
        self.model: Any = None  # the Surrogate, once there are configurations with tilings
        self.incumbent: int | None = None  # row of the fastest valid configuration measured
        self.measured_rows = 0
        tiles = self._tile_positions(param_names)
        if tiles is None:
            return
        inner = [i for i in range(len(param_names)) if i not in tiles]
        for config in configs:
            tiling = self._tiling(config, tiles)
            if tiling is None or config in self.row_of:
                continue
            self.row_of[config] = len(self.configs)
            self.configs.append(config)
            self.tiling_of[config] = tiling
            for i in range(len(config)):
                self.neighbours_index.setdefault(_blank(config, i), []).append(self.row_of[config])
        self.tilings = list(dict.fromkeys(self.tiling_of.values()))
        if self.configs:
            from kperf_client.kernel_tuner_surrogate import Surrogate

            rows = [self.tiling_of[c] for c in self.configs]
            self.model = Surrogate(self.configs, rows, inner, self.rng)

    def _tile_positions(self, param_names: list[str]) -> list[int] | None:
        names = self.strategy.names
        wanted = [names.tile_m, names.tile_n, names.tile_k]
        if names.buffer_depth is not None:
            wanted.append(names.buffer_depth)
        missing = [w for w in wanted if w not in param_names]
        if missing:
            self.strategy.warn_once(
                "names",
                f"no tune parameter named {', '.join(missing)} (have {', '.join(param_names)}); "
                "name the tiles with KernelTunerNames(...); searching without kperf",
            )
            self.strategy.fell_back = True
            return None
        return [param_names.index(w) for w in wanted]

    def _tiling(self, config: Config, tiles: list[int]) -> Tiling | None:
        values = [config[i] for i in tiles]
        if len(values) == 3:
            values.append(self.strategy.buffer_depth)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            return None
        return Tiling(*values)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, config: Config) -> None:
        if config in self.times:
            return
        [value] = self.cost.eval_all([list(config)], check_restrictions=False)
        time = float(value) if _finite(value) else math.inf
        self.times[config] = time
        row = self.row_of.get(config)
        if row is not None and self.model is not None:
            self.measured_rows += 1
            self.model.add(row, time)
            best = math.inf if self.incumbent is None else self.times[self.configs[self.incumbent]]
            if time < best:
                self.incumbent = row
        self.since_post += 1
        if self.since_post >= self.strategy.recalibrate_every:
            self.since_post = 0
            if self.post_runs():
                self.predict()

    def post_runs(self, final: bool = False) -> bool:
        """Hand each tiling's fastest time, when new, to the feedback; post and refit once
        enough tilings have runs. True when the device was refit."""
        strategy = self.strategy
        if strategy.fell_back or strategy._service_down():
            return False
        problem = strategy.problem
        self._read_results()
        runs = []
        for tiling, time_ms in sorted(self.run_time_ms.items()):
            if self.posted_ms.get(tiling) == time_ms:
                continue
            self.posted_ms[tiling] = time_ms
            runs.append({**_problem_fields(problem), **_tiling_fields(tiling)})
            runs[-1]["measured_time_us"] = time_ms * US_PER_MS
        # posted at once; refit only with enough tilings measured (a fit wants more runs than
        # figures) and never at the end (the next tuning's first ranking refits nothing)
        feedback = strategy.start_feedback(
            recalibrate_every=NEVER, batch_size=NEVER, max_delay_s=3600.0
        )
        if runs:
            feedback.add(runs, len(runs))
            strategy.runs_sent += len(runs)
        if not runs and not final:
            return False
        enough = strategy.runs_sent >= MIN_RUNS_TO_FIT
        feedback.recalibrate_every = 1 if enough and not final else NEVER
        before = feedback.recalibrations
        strategy.flush(strategy.timeout_s)
        return feedback.recalibrations > before

    def _read_results(self) -> None:
        """Each tiling's fastest Kernel Tuner ``time`` (ms) among the results not read yet."""
        names = list(self.cost.searchspace.tune_params)
        for record in self.cost.results[self.results_read :]:
            time_ms = None if "__error__" in record else record.get("time")
            tiling = self.tiling_of.get(tuple(record.get(name) for name in names))
            if tiling is not None and _finite(time_ms) and time_ms > 0:
                self.run_time_ms[tiling] = min(time_ms, self.run_time_ms.get(tiling, math.inf))
        self.results_read = len(self.cost.results)

    # ------------------------------------------------------------------ the search

    def predict(self) -> bool:
        """Ask kperf (the device as refit so far) for each tiling's time and make it the
        surrogate's prior; False when it could not answer (the surrogate keeps what it had)."""
        ranked = self.strategy.ranked_tilings(self.tilings)
        times = self.strategy.predicted_us
        if not ranked or not times:
            return False
        self.model.set_prediction(times)
        return True

    def run(self) -> None:
        if self.model is None:  # no tiling: plain random order
            everything = [tuple(c) for c in self.cost.searchspace.list]
            self.rng.shuffle(everything)
            for config in everything:
                self.evaluate(config)
            return
        if not self.predict():
            # no kperf: one configuration of every tiling, in a random order, for the
            # surrogate to learn the tilings from
            self.strategy.fell_back = True
            order = list(self.tilings)
            self.rng.shuffle(order)
            groups: dict[Tiling, list[Config]] = {}
            for config in self.configs:
                groups.setdefault(self.tiling_of[config], []).append(config)
            for tiling in order:
                self.evaluate(self.rng.choice(groups[tiling]))
        while self.measured_rows < len(self.configs):
            self.evaluate(self.configs[self._next()])

    def _next(self) -> int:
        """The next row: the first from kperf's ranking and the prior (posterior mean); then,
        mostly, the unmeasured neighbour of the fastest configuration that one posterior draw
        predicts fastest, else (``explore`` of the time, or no neighbour left) the unmeasured
        configuration the draw predicts fastest."""
        first = not self.times
        scores = self.model.scores(sample=not first)
        if self.incumbent is not None and self.rng.random() >= self.strategy.explore:
            near = [
                r
                for r in self._neighbours(self.configs[self.incumbent])
                if self.configs[r] not in self.times
            ]
            if near:
                return min(near, key=lambda r: float(scores[r]))
        scores[[self.row_of[c] for c in self.times if c in self.row_of]] = math.inf
        return int(scores.argmin())

    def _neighbours(self, config: Config) -> list[int]:
        """Rows that differ from ``config`` in one tune parameter."""
        found: list[int] = []
        for i in range(len(config)):
            found += [
                r
                for r in self.neighbours_index.get(_blank(config, i), [])
                if self.configs[r] != config
            ]
        return found


def _blank(config: Config, position: int) -> tuple[int, Config]:
    return position, config[:position] + (None,) + config[position + 1 :]


def _finite(value: Any) -> TypeGuard[float]:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < 1e300  # Kernel Tuner's cost of an invalid configuration
    )


def _problem_fields(problem: Problem) -> dict[str, Any]:
    return {"m": problem.m, "n": problem.n, "k": problem.k, "dtype": problem.dtype}


def _tiling_fields(tiling: Tiling) -> dict[str, Any]:
    return {
        "tile_m": tiling.tile_m,
        "tile_n": tiling.tile_n,
        "tile_k": tiling.tile_k,
        "buffer_depth": tiling.buffer_depth,
    }
