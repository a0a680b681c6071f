"""The Kernel Tuner strategy's surrogate and search on synthetic spaces whose times are known
in closed form (no service, no Kernel Tuner): effects it must recover, the fastest
configuration it must find far sooner than random order, configurations that fail, ties."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kperf_client.kernel_tuner import KperfStrategy, _Search
from kperf_client.triton_configs import Tiling

pytest.importorskip("numpy")
from kperf_client.kernel_tuner_surrogate import Surrogate  # noqa: E402

NAMES = ["MWG", "NWG", "KWG", "VW", "SA", "TH"]
TILES = [(m, n, 32) for m in (32, 64, 128) for n in (32, 64, 128)]
INNER = {"VW": (1, 2, 4, 8), "SA": (0, 1), "TH": (8, 16, 32)}
CONFIGS = [(*t, *rest) for t in TILES for rest in itertools.product(*INNER.values())]
#: Kernel Tuner's cost of a configuration that failed (sys.float_info.max)
INVALID = 1.7976931348623157e308


class Stop(Exception):
    """The budget is spent (Kernel Tuner's StopCriterionReached)."""


class Cost:
    """Kernel Tuner's CostFunc as the search uses it: eval_all, results, a budget."""

    def __init__(self, time_of: Callable[[tuple[int, ...]], float], budget: int) -> None:
        self.time_of = time_of
        self.budget = budget
        self.evaluated: list[tuple[int, ...]] = []
        self.results: list[dict[str, Any]] = []

    def eval_all(self, configs: list[list[int]], check_restrictions: bool) -> list[float]:
        values = []
        for config in configs:
            if len(self.evaluated) >= self.budget:
                raise Stop
            self.evaluated.append(tuple(config))
            values.append(self.time_of(tuple(config)))
        return values


class Offline(KperfStrategy):
    """The strategy with kperf's prediction given, not asked (``None``: the service fails)."""

    def __init__(self, predicted: dict[Tiling, float] | None, seed: int) -> None:
        super().__init__("http://127.0.0.1:9", "a100", m=4096, n=4096, k=4096, seed=seed)
        self.given = predicted

    def ranked_tilings(self, tilings: Sequence[Tiling]) -> list[tuple[Tiling, float | None]]:
        if self.given is None:
            return []
        self.predicted_us = dict(self.given)
        return [(t, None) for t in sorted(tilings, key=self.given.__getitem__)]


def separable(config: tuple[int, ...]) -> float:
    """A time that is a product of per-parameter factors: the 128 x 128 tiling, VW 4, SA 1
    and TH 16 are each fastest, so exactly one configuration is the fastest."""
    m, n, _, vw, sa, th = config
    tiling = 1.0 + 0.15 * (math.log2(128 / m) + math.log2(128 / n))
    return (
        tiling
        * {1: 1.6, 2: 1.2, 4: 1.0, 8: 1.1}[vw]
        * (1.3 - 0.3 * sa)
        * {8: 1.25, 16: 1.0, 32: 1.15}[th]
    )


def search(
    time_of: Callable[[tuple[int, ...]], float],
    budget: int,
    seed: int,
    predicted: dict[Tiling, float] | None = None,
    configs: Sequence[tuple[int, ...]] = CONFIGS,
) -> list[tuple[int, ...]]:
    """The configurations the search measured, in order."""
    strategy = Offline(predicted, seed)
    strategy.recalibrate_every = 10**9  # nothing to post to
    cost = Cost(time_of, budget)
    try:
        _Search(strategy, NAMES, list(configs), cost).run()
    except Stop:
        pass
    finally:
        strategy.close()
    return cost.evaluated


def tiling_prediction(scale: Callable[[tuple[int, int, int]], float]) -> dict[Tiling, float]:
    return {Tiling(*t, 1): 1000.0 * scale(t) for t in TILES}


def test_posterior_mean_recovers_the_effects_of_a_log_additive_time() -> None:
    """Fed every configuration of a space whose log time is a sum of per-parameter effects,
    the posterior mean's differences are those effects (all within the 1.5x clip)."""
    rows = [c[:3] for c in CONFIGS]
    model = Surrogate(CONFIGS, rows, [3, 4, 5], random.Random(0))
    effect: dict[tuple[int, ...], float] = {t: 1.0 + 0.015 * i for i, t in enumerate(TILES)}

    def time_of(c: tuple[int, ...]) -> float:
        return effect[c[:3]] * {1: 1.1, 2: 1.0, 4: 0.95, 8: 1.05}[c[3]] * (1.1 - 0.1 * c[4])

    for row, config in enumerate(CONFIGS):
        model.add(row, time_of(config))
    mean = model.scores(sample=False)
    truth = [math.log(time_of(c)) for c in CONFIGS]
    offset = statistics.fmean(m - t for m, t in zip(mean, truth, strict=True))
    assert max(abs(m - t - offset) for m, t in zip(mean, truth, strict=True)) < 0.01


@pytest.mark.parametrize("informed", [True, False])
def test_finds_the_fastest_of_a_separable_space_far_sooner_than_random_order(
    informed: bool,
) -> None:
    """One fastest among 648: random order needs 324 evaluations on average. With kperf's
    prediction of the tilings right, or with none (the service down: one configuration per
    tiling first), the search needs a small fraction of that on every seed."""
    fastest = min(CONFIGS, key=separable)
    predicted = tiling_prediction(lambda t: separable((*t, 4, 1, 16))) if informed else None
    needed = []
    for seed in range(8):
        order = search(separable, 200, seed, predicted)
        assert len(set(order)) == len(order)  # never the same configuration twice
        assert fastest in order, seed
        needed.append(order.index(fastest) + 1)
    assert max(needed) <= (40 if informed else 60), needed
    if informed:  # the first configuration is in the tiling kperf predicts fastest
        assert all(
            search(separable, 1, seed, predicted)[0][:3] == (128, 128, 32) for seed in range(4)
        )


def test_a_parameter_value_that_always_fails_is_soon_avoided() -> None:
    """TH 32 fails on every tiling (a third of the space): after the first failures the
    surrogate counts them slow, so few later draws land there."""

    def time_of(config: tuple[int, ...]) -> float:
        return INVALID if config[5] == 32 else separable(config)

    for seed in range(4):
        order = search(time_of, 120, seed)
        late = order[len(TILES) + 20 :]
        assert sum(c[5] == 32 for c in late) <= 0.1 * len(late), seed


def test_ties_everywhere_measure_each_configuration_once_from_a_random_first() -> None:
    """Every configuration equally fast (the posterior never prefers one): the search measures
    each once and stops when none is left; which comes first depends on the seed."""
    few = [c for c in CONFIGS if c[3] in (1, 2) and c[5] == 8]
    flat = tiling_prediction(lambda t: 1.0)
    firsts = set()
    for seed in range(6):
        order = search(lambda c: 1.0, 10**6, seed, flat, configs=few)
        assert sorted(order) == sorted(few)
        firsts.add(order[0])
    assert len(firsts) > 1
