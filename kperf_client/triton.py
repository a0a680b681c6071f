"""Triton plug-in: prune ``@triton.autotune`` configs with kperf's ranking, learn from the timings.

::

    kperf = KperfTriton("http://127.0.0.1:8000", device="h100")

    @triton.autotune(configs=CONFIGS, key=["M", "N", "K"],
                     prune_configs_by={"early_config_prune": kperf.prune(top_k=4)})
    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, ...): ...

    kperf.install_listener(recalibrate_every=20)

The prune function asks /optimize-tiling to rank the call's configs (explicit ``candidates``)
and keeps the best groups; the listener (``triton.knobs.autotuning.listener``) posts every
benchmarked config's time as a GeMM-WS measurement of the device, batched in the background,
and recalibrates every ``recalibrate_every`` runs, after which the prune function asks the
calibrated profile: the next shapes get better shortlists.

Both live in Triton's hot path, so neither ever raises into it. When the service is down, slow
(past ``timeout_s``) or refuses, the prune function keeps every config and the listener drops
or keeps the runs for later; each kind of trouble is reported once per :class:`KperfTriton`
through the ``logging`` module (logger ``kperf_client.triton``, level WARNING; Python prints
it to stderr when the application configured no logging), never through ``warnings``, which a
``-W error`` would turn into an exception inside Triton.

Triton's contract (3.9, ``triton/runtime/autotuner.py``): ``Autotuner.prune_configs`` calls
``early_config_prune(self.configs, self.nargs, **kwargs)`` (``nargs``: positional arguments by
name; ``kwargs``: the call's keyword arguments), then benchmarks what it keeps, then calls
``knobs.autotuning.listener(fn=, key=, best_config=, configs_timings=, duration=,
cache_hit=)`` with ``configs_timings`` a dict ``Config -> [median, p20, p80]`` in ms.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from kperf_client.client import KperfClient
from kperf_client.session import (
    KperfSession,
    Ranking,
    SessionOptions,
    ranking_of,
    reason_of,
    service_trouble,
)
from kperf_client.triton_configs import (
    Problem,
    Tiling,
    TritonConfig,
    TritonNames,
    candidate,
    measured_runs,
    problem_from_key,
    problem_of,
    select_groups,
    tiling_and_params,
)

#: one tuning's timings as the listener hands them over: the problem, and per benchmarked
#: config its ``all_kwargs()`` and Triton's timing
Tuning = tuple[Problem, list[tuple[dict[str, Any], Any]]]

__all__ = [
    "Ranking",
    "ranking_of",
    "KperfListener",
    "KperfPrune",
    "KperfTriton",
    "TritonNames",
    "install_listener",
    "kperf_prune",
]

logger = logging.getLogger(__name__)

#: kept groups when neither top_k nor probability_mass is given: the groups that together
#: hold this share of the posterior probability of being the fastest
DEFAULT_PROBABILITY_MASS = 0.9


class KperfTriton(KperfSession):
    """One kperf service and one device, shared by the prune functions and the listener.

    ``device``: a profile id, a calibrated id or a name (GET /devices). After each
    recalibration the session uses the refit profile: ``name`` if given (recalibrations move
    it), else the new id. ``timeout_s`` bounds every wait of Triton's thread on the service;
    after a failure the service is not asked again for ``retry_after_s`` (every config kept
    meanwhile), so a dead service costs one timeout, not one per shape.
    """

    log = logger

    def __init__(
        self,
        url: str,
        device: str,
        *,
        names: TritonNames | None = None,
        default_dtype: str = "fp16",
        compute_capability: str | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        super().__init__(url, device, default_dtype=default_dtype, **options)
        self.names = names if names is not None else TritonNames()
        #: the GPU's compute capability ("8.6"): how num_stages maps to a buffer depth
        #: (triton_configs.buffer_depth_of); asked of the device's profile when not given
        self._capability = compute_capability
        self._capability_known = compute_capability is not None
        self._pruned = threading.local()

    # ------------------------------------------------------------------ the GPU

    async def capability(self, client: KperfClient) -> str | None:
        """The device's compute capability, from its profile (GET /devices/{id}) the first
        time; None when the profile does not say (num_stages is then the depth)."""
        if not self._capability_known:
            detail = (await client.device(self.device)).model_dump(mode="json")
            value = detail.get("compute_capability")
            self._capability = value if isinstance(value, str) else None
            self._capability_known = True
        return self._capability

    def capability_now(self) -> str | None:
        """:meth:`capability` from Triton's thread (raises on failure, like :meth:`rank`)."""
        if self._capability_known:
            return self._capability
        return self.portal.call(self.capability, self.timeout_s)

    # ------------------------------------------------------------------ ranking

    def prune(
        self, *, top_k: int | None = None, probability_mass: float | None = None
    ) -> KperfPrune:
        """An ``early_config_prune`` function: see :class:`KperfPrune`."""
        return KperfPrune(self, top_k=top_k, probability_mass=probability_mass)

    # ------------------------------------------------------------------ prune -> listener

    def remember_pruned(self, problem: Problem, kept: Sequence[TritonConfig]) -> None:
        """What this thread's last prune kept, for the listener Triton calls next."""
        self._pruned.last = (problem, list(kept))

    def problem_of_timings(self, configs: Sequence[TritonConfig]) -> Problem | None:
        """The problem of the last prune in this thread, when it kept these configs (Triton
        prunes, benchmarks what was kept and calls the listener, in one thread)."""
        last: tuple[Problem, list[TritonConfig]] | None = getattr(self._pruned, "last", None)
        if last is None:
            return None
        problem, kept = last
        if not configs or any(config not in kept for config in configs):
            return None
        self._pruned.last = None
        return problem

    # ------------------------------------------------------------------ feedback

    def listener(
        self,
        *,
        key_names: Sequence[str] | None = None,
        recalibrate_every: int = 20,
        batch_size: int = 64,
        max_delay_s: float = 2.0,
    ) -> KperfListener:
        """A ``triton.knobs.autotuning.listener`` (not installed): see :class:`KperfListener`."""
        self.start_feedback(recalibrate_every, batch_size, max_delay_s)
        return KperfListener(self, key_names=key_names)

    def install_listener(self, **options: Any) -> KperfListener:
        """:meth:`listener`, installed as ``triton.knobs.autotuning.listener``, chained to
        the one installed before; ``listener.uninstall()`` puts that one back."""
        listener = self.listener(**options)
        listener.install()
        return listener

    async def runs_of(self, client: KperfClient, pending: list[Any]) -> list[dict[str, Any]]:
        """The runs of Triton tunings (:data:`Tuning`): one per tiling, its fastest config;
        the depth of ``num_stages`` needs the device's compute capability."""
        capability = await self.capability(client)
        runs: list[dict[str, Any]] = []
        for problem, timings in pending:
            runs += measured_runs(problem, timings, self.names, capability)
        return runs


class KperfPrune:
    """``early_config_prune(configs, named_args, **kwargs) -> configs`` for
    ``@triton.autotune(prune_configs_by={"early_config_prune": ...})``.

    Reads the GEMM (M, N, K and the element type) from the call's arguments, maps each
    config to a candidate (tiles, ``num_stages`` as the buffer depth, the rest as ``params``),
    asks the service to rank them on the device and keeps the first groups of equal tiling:
    ``top_k`` groups, or as many as hold ``probability_mass`` of the probability of being the
    fastest (default 0.9), whichever is reached first; at least one. Configs the service finds
    infeasible on the device are dropped (unless none is feasible); configs without tile sizes
    are kept (kperf cannot judge them). Any trouble: every config is kept, one warning.
    """

    def __init__(
        self,
        session: KperfTriton,
        *,
        top_k: int | None = None,
        probability_mass: float | None = None,
    ) -> None:
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k: at least 1 group, got {top_k}")
        if probability_mass is not None and not 0 < probability_mass <= 1:
            raise ValueError(f"probability_mass: in (0, 1], got {probability_mass}")
        if top_k is None and probability_mass is None:
            probability_mass = DEFAULT_PROBABILITY_MASS
        self.session = session
        self.top_k = top_k
        self.probability_mass = probability_mass

    def __call__(
        self, configs: Sequence[TritonConfig], named_args: Mapping[str, Any], **kwargs: Any
    ) -> list[TritonConfig]:
        configs = list(configs)
        try:
            problem = problem_of(
                {**named_args, **kwargs}, self.session.names, self.session.default_dtype
            )
        except Exception as exc:  # noqa: BLE001 - never raise into Triton
            self.session.warn_once("prune", f"cannot read the GEMM ({exc}); keeping all configs")
            return configs
        try:
            kept = self._keep(problem, configs)
        except Exception as exc:  # noqa: BLE001 - never raise into Triton
            if service_trouble(exc):
                self.session._mark_down()
            self.session.warn_once(
                "prune",
                f"{self.session.portal.url} did not rank the configs ({reason_of(exc)}); keeping "
                f"all {len(configs)} configs",
            )
            kept = configs
        self.session.remember_pruned(problem, kept)
        return kept

    def _keep(self, problem: Problem, configs: list[TritonConfig]) -> list[TritonConfig]:
        names = self.session.names
        if self.session._service_down():
            return configs
        capability = self.session.capability_now()
        mapped: list[tuple[int, Tiling]] = []  # (config index, tiling), in request order
        request: list[dict[str, Any]] = []
        unjudged: list[int] = []
        for index, config in enumerate(configs):
            found = tiling_and_params(config.all_kwargs(), names, capability)
            if found is None:
                unjudged.append(index)
                continue
            mapped.append((index, found[0]))
            request.append(candidate(*found))
        if not mapped:
            self.session.warn_once(
                "prune",
                f"no config has tile sizes named {names.tile_m}, {names.tile_n}, "
                f"{names.tile_k} and a depth named {names.buffer_depth}; keeping all configs",
            )
            return configs
        ranking = self.session.rank(problem, request)
        tilings = [tiling for _, tiling in mapped]
        ranked: dict[Tiling, float | None] = {}  # each group once, in rank order
        for position, probability in zip(ranking.order, ranking.probability_best, strict=True):
            ranked.setdefault(tilings[position], probability)
        if not ranked:
            self.session.warn_once(
                "prune", f"no config is feasible on {self.session.device}; keeping all configs"
            )
            return configs
        kept_tilings = select_groups(list(ranked.items()), self.top_k, self.probability_mass)
        best_first = sorted(
            (kept_tilings.index(tiling), index)
            for index, tiling in mapped
            if tiling in kept_tilings
        )
        kept = [index for _, index in best_first]
        # neither ranked nor infeasible (refused by the request's schema, e.g. oversized
        # params, or left unranked by a solve out of time): not judged, kept
        judged = set(ranking.order) | ranking.infeasible
        kept += [
            index
            for position, (index, tiling) in enumerate(mapped)
            if position not in judged and tiling not in kept_tilings
        ]
        return [configs[index] for index in kept + unjudged]


class KperfListener:
    """``triton.knobs.autotuning.listener``: each benchmarked config's time becomes a GeMM-WS
    measurement of the session's device (one per tiling, its fastest config), posted in
    batches from a background thread; every ``recalibrate_every`` runs the device is refit.

    The GEMM of a tuning comes from the prune function of the same session (Triton prunes and
    benchmarks in one thread), else from the autotuning key when ``key_names`` (the
    autotuner's ``key`` list) names M, N and K. Other kernels' tunings are ignored. Calls the
    listener installed before it, if any.
    """

    def __init__(self, session: KperfTriton, *, key_names: Sequence[str] | None = None) -> None:
        self.session = session
        self.key_names = tuple(key_names) if key_names is not None else None
        self.previous: Callable[..., Any] | None = None
        self.installed = False

    def __call__(self, **kwargs: Any) -> None:
        try:
            self._record(kwargs)
        except Exception as exc:  # noqa: BLE001 - never raise into Triton
            self.session.warn_once("feedback", f"timings not recorded: {exc!r}")
        if self.previous is not None:
            self.previous(**kwargs)

    def _record(self, kwargs: Mapping[str, Any]) -> None:
        timings = kwargs.get("configs_timings") or {}
        configs = list(timings)
        session = self.session
        problem = session.problem_of_timings(configs)
        if problem is None and self.key_names is not None and "key" in kwargs:
            problem = problem_from_key(
                kwargs["key"], self.key_names, session.names, session.default_dtype
            )
        if problem is None:
            logger.debug("kperf: a tuning of another kernel (%s): not recorded", kwargs.get("fn"))
            return
        if configs and session.feedback is not None:
            plain = [(config.all_kwargs(), timing) for config, timing in timings.items()]
            session.feedback.add((problem, plain), len(plain))

    def install(self) -> bool:
        """Install as ``triton.knobs.autotuning.listener`` (chained to the previous one);
        False, with a warning, when the installed Triton has no such hook."""
        import triton.knobs

        reason = _listener_hook_problem(triton.knobs)
        if reason is not None:
            self.session.warn_once("feedback", f"listener not installed: {reason}")
            return False
        if not self.installed:
            self.previous = triton.knobs.autotuning.listener
            triton.knobs.autotuning.listener = self
            self.installed = True
        return True

    def uninstall(self) -> None:
        """Put back the listener installed before this one."""
        import triton.knobs

        if self.installed:
            triton.knobs.autotuning.listener = self.previous
            self.installed = False


def _listener_hook_problem(knobs: Any) -> str | None:
    """Why the installed Triton cannot call this listener (None: it can): it must have
    ``knobs.autotuning.listener``, and its listener protocol (``knobs.AutotuneListener``,
    3.9) must pass ``configs_timings`` by keyword."""
    autotuning = getattr(knobs, "autotuning", None)
    if autotuning is None or not hasattr(autotuning, "listener"):
        return "this Triton has no triton.knobs.autotuning.listener (Triton >= 3.4 has)"
    protocol = getattr(knobs, "AutotuneListener", None)
    if protocol is not None:
        parameters = inspect.signature(protocol.__call__).parameters
        if "configs_timings" not in parameters:
            return f"its listener receives {list(parameters)[1:]}, not configs_timings"
    return None


def kperf_prune(
    url: str,
    device: str,
    *,
    top_k: int | None = None,
    probability_mass: float | None = None,
    **session_options: Any,
) -> KperfPrune:
    """``early_config_prune`` of a new :class:`KperfTriton` session (its ``session``
    attribute; ``install_listener(prune.session)`` feeds the same device)."""
    return KperfTriton(url, device, **session_options).prune(
        top_k=top_k, probability_mass=probability_mass
    )


def install_listener(session: KperfTriton, **options: Any) -> KperfListener:
    """Install ``session``'s listener as ``triton.knobs.autotuning.listener``."""
    return session.install_listener(**options)
