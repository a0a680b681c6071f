"""Small solves in a thread of the service's own process instead of the worker pool.

A cache miss of a small problem (a Table 1 space, the default space) is a few milliseconds of
solving, and the worker pool's round trip (pickling, the pipe, waking a niced process, the
answer's way back) cost as much again (bench/RESULTS.md, "Certified solve"). A request whose
work is bounded runs in one dedicated thread of the service instead, through the same job
function as a worker runs (``app.jobs.optimize_job``: the same answer, byte for byte, but for
the elapsed time). Bounded means: the certified solver (the exact scorer, then one Z3 check
over a small encoding), at most ``KPERF_INLINE_MAX_CONFIGURATIONS`` configurations, no
timeline. Everything else goes to the pool.

What the pool gives, and what the inline path keeps of it:

* time limits: the job gets what is left of the request's limit, less the answer's margin, and
  stops by its own deadline (the scorer checks it between chunks, Z3 has it as its timeout);
  the request is answered 504 at its bound if it has not finished, as from the pool. A thread
  cannot be killed: an overrunning job keeps the inline thread until it ends, and meanwhile
  small requests go to the pool.
* back-pressure: one inline solve at a time (a second thread would only contend for the GIL
  and the two cores); a request that finds the thread busy goes to the pool, whose bounded
  queue and 503s stay the service's only queue.
* memory cap and crash containment: not applied in the service's process. The configuration
  threshold bounds the memory (1,024 configurations x 129 figure draws: about 2 MB), and only
  the certified solver's single check runs here; ``KPERF_INLINE_MAX_CONFIGURATIONS=0`` sends
  every solve to the pool.
* resident memory: the exact scorer brings numpy into the service's process (the pool keeps
  it out otherwise), and solving touches libz3's pages: about 60 MB more after the warm-up
  (the thread imports it all and runs one small solve at start-up, so no request pays).

Z3 state is per thread (solver/z3_session.py): the inline thread keeps its own context.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from app.pool import WorkerTimeout
from app.schemas.optimize import OptimizeTilingRequest
from app.service import EncodedAnswer, Job, Service, record_job_outcome, spent_of_request
from solver.errors import SolverTimeout

log = logging.getLogger("kperf.inline")

#: thread name of the inline solver (shown by ``py-spy dump`` and in thread listings)
THREAD_NAME = "kperf-inline"


#: the solve the thread runs at start-up: Table 1's space on a shipped profile
WARM_UP_REQUEST: dict[str, Any] = {
    "m": 512,
    "n": 512,
    "k": 512,
    "device": "rtx-a6000",
    "search_space": {"tile_m": [32, 64, 128], "tile_n": [32, 64, 128], "tile_k": [32, 64, 128]},
    "top_k": 1,
}


def inline_eligible(request: OptimizeTilingRequest, configurations: int, limit: int) -> bool:
    """Whether the request's work is small and bounded enough for the service's own thread:
    the certified solver, at most ``limit`` configurations (0: never), no timeline."""
    return (
        limit > 0
        and configurations <= limit
        and request.solver == "certified"
        and not request.include_timeline
    )


class InlineRunner:
    """One thread that runs small jobs for the event loop; busy means "use the pool"."""

    def __init__(self, min_job_time_limit_s: float) -> None:
        self.min_job_time_limit_s = min_job_time_limit_s
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=THREAD_NAME
        )
        self._busy = threading.Lock()
        #: jobs answered inline (tests and operators read it)
        self.jobs_run = 0

    def warm(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the thread now (imports, Z3 session); the thread counts as busy
        meanwhile, so requests go to the pool until it is done."""
        if not self._busy.acquire(blocking=False):
            return

        def job() -> None:
            started = time.perf_counter()
            try:
                fn()
            except Exception:  # pragma: no cover - a warm-up failure only costs speed
                log.exception("inline warm-up failed")
            finally:
                self._busy.release()
            log.debug("inline warm-up", extra={"seconds": time.perf_counter() - started})

        self._executor.submit(job)

    async def stop(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def run(
        self, service: Service, job: Job, *, admitted: bool = False
    ) -> EncodedAnswer | None:
        """``fn(**kwargs, time_limit_s=...)`` of ``job`` (one answering an EncodedAnswer) in
        the inline thread within the request's bound (as :func:`app.service.run_job`); None
        when the thread is busy or too little of the budget is left (the pool then takes the
        job, or refuses it with its own 504)."""
        kind, fn, kwargs, time_limit_s = job.kind, job.fn, job.kwargs, job.time_limit_s
        elapsed_s, margin_s = spent_of_request(admitted)
        job_limit_s = time_limit_s - elapsed_s - margin_s
        if job_limit_s < self.min_job_time_limit_s:
            return None
        if not self._busy.acquire(blocking=False):
            return None
        bound_s = service.settings.hard_deadline_s(time_limit_s) - elapsed_s - margin_s
        context = contextvars.copy_context()  # the request id reaches the job's log lines
        called = time.perf_counter()

        def call() -> EncodedAnswer:
            try:
                encoded: EncodedAnswer = context.run(fn, **kwargs, time_limit_s=job_limit_s)
                return encoded
            finally:
                self._busy.release()

        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, call)
        except RuntimeError:  # the executor is shut down (service stopping)
            self._busy.release()
            return None
        try:
            # shielded: a late job is left to finish in its thread, never cancelled midway
            answer = await asyncio.wait_for(asyncio.shield(future), max(0.0, bound_s))
        except TimeoutError:
            record_job_outcome(service, kind, time.perf_counter() - called, error=SolverTimeout(1))
            raise WorkerTimeout(
                time_limit_s,
                service.settings.hard_deadline_s(time_limit_s),
                dispatched=True,
                detail="the solve in the service's own thread did not finish in time",
            ) from None
        except Exception as exc:
            record_job_outcome(service, kind, time.perf_counter() - called, error=exc)
            if isinstance(exc, SolverTimeout):
                raise SolverTimeout(time_limit_s) from None
            raise
        self.jobs_run += 1
        record_job_outcome(service, kind, time.perf_counter() - called, value=answer)
        return answer
