"""Push a sweep's shapes through ``POST /optimize-tiling/batch`` on one or more services.

Batches go round-robin over the URLs with at most ``concurrency`` in flight. A batch is
retried on transient failures (connection errors, 429/503 honouring ``Retry-After``, other
5xx) with capped exponential backoff, moving to the next URL each time; a 422 that names
items (``problems.<i>.<field>``) answers those items and resends the rest; any other 4xx is
split until it names a single shape. Only definitive answers are journalled: a shape that
ran out of retries is counted as failed and a rerun tries it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from kperf_client.client import KperfClient
from kperf_client.sweep.journal import Journal
from kperf_client.sweep.shapes import Shape

BATCH_PATH = "/optimize-tiling/batch"
_ITEM_FIELD = re.compile(r"^(?:body\.)?problems\.(\d+)(?:\.|$)")


@dataclass(frozen=True, slots=True)
class SweepOptions:
    #: services to spread batches over; empty runs the service in-process
    urls: tuple[str, ...] = ()
    batch_size: int = 16
    concurrency: int = 4
    retries: int = 5
    request_timeout_s: float = 300.0
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 15.0
    #: a Retry-After above this is clipped: the sweep keeps its own pace bounded
    retry_after_cap_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("batch_size", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.retries < 0:
            raise ValueError("retries must be 0 or more")


@dataclass
class SweepStats:
    shapes: int = 0
    #: answered by an earlier run of the same sweep (resume)
    skipped: int = 0
    answered: int = 0
    cache_hits: int = 0
    errors: int = 0
    #: shapes whose batch ran out of retries (not journalled; a rerun retries them)
    failed: int = 0
    invalid_lines: int = 0
    retries: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False
    error_lines: list[int] = field(default_factory=list)

    @property
    def rate_shapes_per_s(self) -> float:
        return self.answered / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def hit_ratio(self) -> float:
        ok = self.answered - self.errors
        return self.cache_hits / ok if ok > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["rate_shapes_per_s"] = round(self.rate_shapes_per_s, 3)
        document["hit_ratio"] = round(self.hit_ratio, 4)
        return document


#: called after every journalled answer (for a progress display)
ProgressHook = Callable[[SweepStats], None]


class Sweep:
    def __init__(
        self,
        options: SweepOptions,
        journal: Journal,
        on_progress: ProgressHook | None = None,
        on_failure: Callable[[int, str], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.options = options
        #: for tests of the retry paths only; real sweeps use the default network transport
        self._transport = transport
        self.journal = journal
        self.stats = SweepStats()
        self._on_progress = on_progress
        self._on_failure = on_failure
        self._clients: list[httpx.AsyncClient] = []
        self._turn = 0

    def _next_client(self) -> httpx.AsyncClient:
        client = self._clients[self._turn % len(self._clients)]
        self._turn += 1
        return client

    def _journal(self, shape: Shape, document: dict[str, Any]) -> None:
        self.journal.record(
            {"line": shape.line, "input_digest": shape.digest, "problem": shape.problem, **document}
        )
        self.stats.answered += 1
        if document["status"] == "ok":
            self.stats.cache_hits += document.get("cache") == "hit"
        else:
            self.stats.errors += 1
            self.stats.error_lines.append(shape.line)
            if self._on_failure is not None:
                self._on_failure(shape.line, _problem_text(document["error"]))
        if self._on_progress is not None:
            self._on_progress(self.stats)

    async def _pause(self, attempt: int, retry_after: str | None) -> None:
        delay = self.options.backoff_base_s * 2 ** (attempt - 1)
        delay = min(delay, self.options.backoff_cap_s) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(retry_after), self.options.retry_after_cap_s))
        self.stats.retries += 1
        await asyncio.sleep(delay)

    def _give_up(self, shapes: Sequence[Shape], reason: str) -> None:
        self.stats.failed += len(shapes)
        if self._on_failure is not None:
            for shape in shapes:
                self._on_failure(shape.line, f"not answered after retries: {reason}")
        if self._on_progress is not None:
            self._on_progress(self.stats)

    async def _solve(self, shapes: list[Shape]) -> None:
        pending = shapes
        attempt = 0
        while pending:
            client = self._next_client()
            body = {"problems": [s.problem for s in pending]}
            try:
                response = await client.post(BATCH_PATH, json=body)
            except httpx.TransportError as exc:
                attempt += 1
                if attempt > self.options.retries:
                    self._give_up(pending, f"{type(exc).__name__}: {exc}")
                    return
                await self._pause(attempt, None)
                continue
            status = response.status_code
            if status == 200:
                for item in response.json()["items"]:
                    self._journal(pending[item["index"]], _answer(item))
                return
            if status in (429, 503) or status >= 500:
                attempt += 1
                if attempt > self.options.retries:
                    self._give_up(pending, f"HTTP {status}")
                    return
                await self._pause(attempt, response.headers.get("retry-after"))
                continue
            problem = _problem_json(response)
            named = _named_items(problem, len(pending))
            if status == 422 and named:
                for index, reasons in named.items():
                    self._journal(pending[index], _item_error(problem, index, reasons))
                pending = [s for i, s in enumerate(pending) if i not in named]
                continue
            if len(pending) > 1:
                half = len(pending) // 2
                await asyncio.gather(self._solve(pending[:half]), self._solve(pending[half:]))
                return
            self._journal(pending[0], {"status": "error", "error": problem})
            return

    async def _open_clients(self, stack: contextlib.AsyncExitStack) -> None:
        timeout_s = self.options.request_timeout_s
        for url in self.options.urls:
            client = httpx.AsyncClient(base_url=url, timeout=timeout_s, transport=self._transport)
            self._clients.append(await stack.enter_async_context(client))
        if not self.options.urls:
            # in-process service (its own worker pool), quiet unless something goes wrong
            local = KperfClient(settings={"log_level": "WARNING"}, timeout_s=timeout_s)
            self._clients.append((await stack.enter_async_context(local)).http)

    async def run(self, shapes: Sequence[Shape], stop: asyncio.Event | None = None) -> SweepStats:
        """Answer every shape not yet in the journal; returns early when ``stop`` is set."""
        started = time.perf_counter()
        todo = [s for s in shapes if (s.line, s.digest) not in self.journal.done]
        self.stats.shapes = len(shapes)
        self.stats.skipped = len(shapes) - len(todo)
        stop = stop if stop is not None else asyncio.Event()
        batches = [
            todo[i : i + self.options.batch_size]
            for i in range(0, len(todo), self.options.batch_size)
        ]
        async with contextlib.AsyncExitStack() as stack:
            await self._open_clients(stack)
            slots = asyncio.Semaphore(self.options.concurrency)
            tasks: set[asyncio.Task[None]] = set()

            async def one(batch: list[Shape]) -> None:
                try:
                    await self._solve(batch)
                finally:
                    slots.release()

            for batch in batches:
                acquired = asyncio.ensure_future(slots.acquire())
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({acquired, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if stop.is_set():
                    if acquired.done() and not acquired.cancelled():
                        slots.release()
                    acquired.cancel()
                    break
                task = asyncio.create_task(one(batch))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                waiter = asyncio.ensure_future(asyncio.wait(set(tasks)))
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if stop.is_set():
                    # answers in flight are dropped, never half-written: a rerun redoes them
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                await waiter
        self.stats.interrupted = stop.is_set()
        self.stats.elapsed_s = time.perf_counter() - started
        return self.stats


def _answer(item: dict[str, Any]) -> dict[str, Any]:
    if item["status"] == "ok":
        return {"status": "ok", "cache": item.get("cache"), "result": item["result"]}
    return {"status": "error", "error": item["error"]}


def _problem_json(response: httpx.Response) -> dict[str, Any]:
    try:
        document = response.json()
    except ValueError:
        document = None
    if isinstance(document, dict):
        return document
    return {"status": response.status_code, "detail": response.text[:500], "errors": []}


def _named_items(problem: dict[str, Any], count: int) -> dict[int, list[dict[str, str]]]:
    """Items a whole-batch 422 blames, with their field errors renamed to the item."""
    named: dict[int, list[dict[str, str]]] = {}
    for entry in problem.get("errors", []):
        match = _ITEM_FIELD.match(str(entry.get("field", "")))
        if match is None or int(match.group(1)) >= count:
            return {}  # an error not tied to one item: the caller splits the batch instead
        index = int(match.group(1))
        field_name = str(entry["field"])[match.end() :] or "problem"
        named.setdefault(index, []).append({"field": field_name, "reason": entry["reason"]})
    return named


def _item_error(
    problem: dict[str, Any], index: int, reasons: list[dict[str, str]]
) -> dict[str, Any]:
    return {
        "status": "error",
        "error": {
            "type": problem.get("type"),
            "title": problem.get("title"),
            "status": problem.get("status", 422),
            "detail": "; ".join(f"{r['field']}: {r['reason']}" for r in reasons),
            "errors": reasons,
        },
    }


def _problem_text(problem: dict[str, Any]) -> str:
    errors = problem.get("errors") or []
    if errors:
        # the batch route prefixes item fields with ``problems.<i>.``; the line number
        # already says which shape, so the field is shown as in a single request
        return "; ".join(
            f"{_ITEM_FIELD.sub('', str(e.get('field')))}: {e.get('reason')}" for e in errors
        )
    return str(problem.get("detail") or problem.get("title") or "error")
