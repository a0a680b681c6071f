"""What every autotuner plug-in shares: one kperf service and one device, asked to rank
candidates and fed the measured runs, from code that must never fail because of kperf.

A plug-in (``kperf_client/triton.py``, ``kperf_client/kernel_tuner.py``) lives in someone
else's hot path: it reaches the service through a :class:`~kperf_client.portal.ClientPortal`
with a deadline, reports each kind of trouble once (``logging``, WARNING, then DEBUG: never
``warnings``, which ``-W error`` would raise), stops asking a service that failed for
``retry_after_s``, and queues the measured runs (:class:`Feedback`): posted to
``POST /devices/{id}/measurements`` in batches, refit every ``recalibrate_every`` runs
(``POST /devices/{id}/recalibrate``), after which the session asks the refit profile.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from kperf_client.client import KperfClient, KperfError
from kperf_client.portal import ClientPortal
from kperf_client.triton_configs import DTYPES, Problem

__all__ = ["GEMM_WS", "Feedback", "KperfSession", "Ranking", "SessionOptions", "ranking_of"]

#: /optimize-tiling's default solver budget, s (a server's maximum is at least that)
DEFAULT_TIME_LIMIT_S = 10.0
#: the GeMM-WS measurements model name of /devices/{id}/measurements
GEMM_WS = "gemm-ws"


class SessionOptions(TypedDict, total=False):
    """How a session talks to the service (every plug-in takes these as keywords):
    ``token`` its bearer token; ``timeout_s`` bounds every wait (default 5 s); after a
    failure the service is not asked again for ``retry_after_s`` (default 30 s); ``name``:
    the name recalibrations move (see :class:`KperfSession`)."""

    token: str | None
    timeout_s: float
    retry_after_s: float
    name: str | None


@dataclass(frozen=True, slots=True)
class Ranking:
    """The service's answer for one list of candidates: positions in that list, best first,
    with each one's ``probability_best`` (None when not drawn) and ``predicted_time_us``, the
    infeasible positions, and the positions the request schema refused (not judged)."""

    order: tuple[int, ...]
    probability_best: tuple[float | None, ...]
    infeasible: frozenset[int]
    refused: frozenset[int] = frozenset()
    predicted_time_us: tuple[float | None, ...] = ()


def ranking_of(answer: Mapping[str, Any], positions: Sequence[int] | None = None) -> Ranking:
    """Read /optimize-tiling's answer to a ``candidates`` request; ``positions``: where each
    candidate sent stands in the caller's list (default: the same place)."""

    def where(entry: Mapping[str, Any]) -> int:
        index = int(entry["input_index"])
        return index if positions is None else positions[index]

    ranked = sorted(answer["candidates"], key=lambda entry: int(entry["rank"]))
    return Ranking(
        order=tuple(map(where, ranked)),
        probability_best=tuple(entry.get("probability_best") for entry in ranked),
        infeasible=frozenset(map(where, answer.get("infeasible", []))),
        predicted_time_us=tuple(entry.get("predicted_time_us") for entry in ranked),
    )


class KperfSession:
    """One kperf service and one device, for a plug-in.

    ``url``: the service (None: an in-process service of this process, which needs
    ``kperf[server]``; its memory store forgets at exit). ``device``: a profile id, a
    calibrated id or a name (GET /devices). After each recalibration the session uses the
    refit profile: ``name`` if given (recalibrations move it), else the new id.
    ``timeout_s`` bounds every wait of the caller's thread on the service; after a failure the
    service is not asked again for ``retry_after_s``, so a dead service costs one timeout.
    """

    #: where trouble is reported (each plug-in names its own)
    log = logging.getLogger("kperf_client.session")

    def __init__(
        self,
        url: str | None,
        device: str,
        *,
        default_dtype: str = "fp16",
        **options: Unpack[SessionOptions],
    ) -> None:
        timeout_s = options.get("timeout_s", 5.0)
        retry_after_s = options.get("retry_after_s", 30.0)
        if not device:
            raise ValueError("device: give a profile id or name (GET /devices), e.g. 'h100'")
        if default_dtype not in DTYPES:
            raise ValueError(f"default_dtype: one of {DTYPES}, got {default_dtype!r}")
        if retry_after_s < 0:
            raise ValueError(f"retry_after_s: must be >= 0 s, got {retry_after_s}")
        self.portal = ClientPortal(url, token=options.get("token"), timeout_s=timeout_s)
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.default_dtype = default_dtype
        self.name = options.get("name")
        self._device = device
        self._lock = threading.Lock()
        self._rankings: dict[tuple[Any, ...], Ranking] = {}
        self._warned: set[str] = set()
        self._down_until = 0.0
        self.feedback: Feedback | None = None
        #: the refit's solver budget (``time_limit_s`` of the recalibrate request; None: the
        #: service's default)
        self.recalibrate_time_limit_s: float | None = None
        self._closed = False
        atexit.register(self.close)

    @property
    def device(self) -> str:
        """The device asked and fed: the configured one, then the latest refit profile."""
        with self._lock:
            return self._device

    def _moved_to(self, device: str) -> None:
        with self._lock:
            self._device = device

    # ------------------------------------------------------------------ trouble, once

    def warn_once(self, kind: str, message: str) -> None:
        """Log ``message`` at WARNING the first time trouble of ``kind`` happens, then DEBUG."""
        with self._lock:
            first = kind not in self._warned
            self._warned.add(kind)
        self.log.log(logging.WARNING if first else logging.DEBUG, "kperf: %s", message)

    def _service_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _mark_down(self) -> None:
        self._down_until = time.monotonic() + self.retry_after_s

    # ------------------------------------------------------------------ ranking

    def rank(self, problem: Problem, candidates: Sequence[dict[str, Any]]) -> Ranking:
        """/optimize-tiling's ranking of ``candidates`` for ``problem`` on the device, cached
        in the process per (device, problem, candidates); raises on any failure."""
        device = self.device
        key = (device, problem, _frozen(candidates))
        with self._lock:
            cached = self._rankings.get(key)
        if cached is not None:
            return cached
        body = {
            "m": problem.m,
            "n": problem.n,
            "k": problem.k,
            "dtype": problem.dtype,
            "device": device,
            # the service answers within its own budget, inside ours (and within the
            # service's default budget, which every server's maximum allows)
            "time_limit_s": min(DEFAULT_TIME_LIMIT_S, max(0.1, 0.5 * self.timeout_s)),
        }

        async def ask(client: KperfClient) -> Ranking:
            positions = list(range(len(candidates)))
            for attempt in range(2):  # once more without the candidates the schema refused
                sent = [candidates[p] for p in positions]
                try:
                    answer = await client.optimize({**body, "candidates": sent})
                except KperfError as exc:
                    refused = _refused_positions(exc, "candidates", len(sent))
                    if attempt or exc.status != 422 or not refused or len(refused) == len(sent):
                        raise
                    positions = [p for i, p in enumerate(positions) if i not in refused]
                    continue
                ranking = ranking_of(answer.response.model_dump(mode="json"), positions)
                left_out = frozenset(range(len(candidates))) - frozenset(positions)
                return dataclasses.replace(ranking, refused=left_out)
            raise AssertionError("unreachable")

        ranking = self.portal.call(ask, self.timeout_s)
        with self._lock:
            self._rankings[key] = ranking
        return ranking

    # ------------------------------------------------------------------ feedback

    def start_feedback(
        self, recalibrate_every: int = 20, batch_size: int = 64, max_delay_s: float = 2.0
    ) -> Feedback:
        """The session's :class:`Feedback` (made on first call; later options are ignored)."""
        if self.feedback is None:
            self.feedback = Feedback(self, recalibrate_every, batch_size, max_delay_s)
        return self.feedback

    async def runs_of(self, client: KperfClient, pending: list[Any]) -> list[dict[str, Any]]:
        """The GeMM-WS runs of what a plug-in handed to :meth:`Feedback.add`: here lists of
        runs already (a plug-in whose items need the service to convert them overrides)."""
        return [run for runs in pending for run in runs]

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Post the runs waiting in the batch now (and recalibrate if due), waiting for any
        post under way; False, with a warning, when they could not be posted (they stay
        queued for the next flush). Never raises."""
        feedback = self.feedback
        if feedback is None:
            return True
        try:
            self.portal.call(feedback.flush, timeout_s)
        except Exception as exc:  # noqa: BLE001 - user-side code: say it, never raise
            self.warn_once("feedback", f"measured runs not posted: {reason_of(exc)}")
            return False
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush the waiting runs, then close the connection (registered with atexit;
        idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.flush(timeout_s)
        self.portal.close()


def _frozen(value: Any) -> Any:
    """A hashable copy of JSON-like data (for the cache key)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


class Feedback:
    """Items waiting to be posted as runs, on the portal's loop thread: posted when
    ``batch_size`` runs are waiting or ``max_delay_s`` after the first; every
    ``recalibrate_every`` runs recorded, the device is refit. An item is what the plug-in
    hands over (:meth:`KperfSession.runs_of` turns items into runs when they are posted)."""

    def __init__(
        self,
        session: KperfSession,
        recalibrate_every: int,
        batch_size: int,
        max_delay_s: float,
        max_waiting_runs: int = 10_000,
    ) -> None:
        if recalibrate_every < 1:
            raise ValueError(f"recalibrate_every: at least 1 run, got {recalibrate_every}")
        if batch_size < 1:
            raise ValueError(f"batch_size: at least 1 run, got {batch_size}")
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s: must be >= 0 s, got {max_delay_s}")
        self.session = session
        self.recalibrate_every = recalibrate_every
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self.max_waiting_runs = max_waiting_runs
        self._pending: list[Any] = []  # not yet runs (Triton's depth needs the device's GPU)
        self._pending_size = 0
        self._runs: list[dict[str, Any]] = []  # runs not yet recorded by the service
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.since_recalibration = 0
        #: what happened, for tests and the curious: runs recorded, recalibrations made
        self.posted = 0
        self.recalibrations = 0

    def add(self, item: Any, size: int) -> None:
        """Hand one item over (any thread); ``size``: about how many runs it makes."""
        self.session.portal.call_soon(lambda: self._take(item, size))

    def _take(self, item: Any, size: int) -> None:
        self._pending.append(item)
        self._pending_size += size
        if len(self._runs) + self._pending_size >= self.batch_size:
            self._flush_in_background()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self.max_delay_s, self._flush_in_background
            )

    def _flush_in_background(self) -> None:
        # the loop keeps only weak references to tasks: hold each until it is done
        task = asyncio.get_running_loop().create_task(self._flush_logged())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_logged(self) -> None:
        try:
            await self.session.portal.within(self.flush)
        except Exception as exc:  # noqa: BLE001 - a background task: say it, never raise
            self.session.warn_once("feedback", f"measured runs not posted: {reason_of(exc)}")

    async def flush(self, client: KperfClient) -> None:
        """Post what is waiting, then recalibrate if due. Runs the device refuses are
        dropped; when the service cannot be reached they wait for the next flush."""
        if self._flushing is None:
            self._flushing = asyncio.Lock()
        async with self._flushing:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._pending:
                runs = await self.session.runs_of(client, self._pending)
                self._pending, self._pending_size = [], 0
                self._runs += runs
                del self._runs[: max(0, len(self._runs) - self.max_waiting_runs)]  # oldest
            if self._runs:
                await self._post(client)
            if self.since_recalibration >= self.recalibrate_every:
                await self._recalibrate(client)

    async def _post(self, client: KperfClient) -> None:
        session = self.session
        for _ in range(2):  # once more without the runs the device refused
            try:
                added = await client.add_measurements(session.device, GEMM_WS, self._runs)
            except KperfError as exc:
                refused = _refused_positions(exc, "measurements", len(self._runs))
                if exc.status != 422 or not refused:
                    session.warn_once("feedback", f"measured runs refused: {exc}")
                    self._runs = []
                    return
                session.warn_once(
                    "feedback", f"{len(refused)} measured run(s) refused by the device: {exc}"
                )
                self._runs = [run for i, run in enumerate(self._runs) if i not in refused]
                continue
            self._runs = []
            self.posted += added.added
            self.since_recalibration += added.added
            return

    async def _recalibrate(self, client: KperfClient) -> None:
        session = self.session
        device = session.device
        body: dict[str, Any] = {"model": GEMM_WS}
        if session.recalibrate_time_limit_s is not None:
            body["time_limit_s"] = session.recalibrate_time_limit_s
        if session.name is not None and device != session.name:
            body["name"] = session.name
        try:
            answer = await client.recalibrate(device, body)
        except KperfError as exc:
            session.warn_once("feedback", f"recalibrating {device} failed: {exc}")
            self.since_recalibration = 0  # not again at once: after the next runs
            return
        self.since_recalibration = 0
        self.recalibrations += 1
        session._moved_to(session.name if session.name is not None else answer.device)
        session.log.info("kperf: %s recalibrated from its runs: now %s", device, answer.device)


def _refused_positions(exc: KperfError, list_field: str, count: int) -> set[int]:
    """Positions in a request's list that a 422 names (``measurements.3.tile_m``)."""
    refused = set()
    for field, _ in exc.field_errors:
        parts = field.split(".")
        if len(parts) >= 2 and parts[0] == list_field and parts[1].isdigit():
            if int(parts[1]) < count:
                refused.add(int(parts[1]))
    return refused


def service_trouble(exc: BaseException) -> bool:
    """Whether ``exc`` says the service cannot answer now (unreachable, slow, overloaded:
    wait before asking again), rather than that it refused this one request."""
    if isinstance(exc, KperfError):
        return exc.status >= 500 or exc.status == 429
    return True


def reason_of(exc: BaseException) -> str:
    """One line saying what went wrong, for a warning."""
    if isinstance(exc, TimeoutError):
        return f"no answer within the timeout: {exc}"
    return f"{type(exc).__name__}: {exc}"
