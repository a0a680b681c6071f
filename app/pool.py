"""A bounded pool of worker processes for solves and PTX analyses.

Why processes, and why not ``concurrent.futures.ProcessPoolExecutor``: a Z3 solve holds the GIL
inside C++ and can run past its own timeout, so it must be off the event loop and killable on
its own. An executor cannot kill one task without breaking the whole pool. Here every worker
owns one duplex pipe; the event loop waits on the pipe's file descriptor (no thread per job), and
a worker that overruns its deadline is SIGKILLed and replaced while the others keep working.

Contract of :meth:`WorkerPool.run`:

* the job gets ``time_limit_s`` minus the time it waited for a worker (keyword argument
  ``time_limit_s``), so it can stop itself and return its best-so-far;
* the answer (result or error) comes within ``hard_deadline_s`` of the call, else the worker is
  killed and :class:`WorkerTimeout` is raised;
* when every worker is busy and ``queue_size`` calls already wait, :class:`PoolSaturated` is
  raised at once (no unbounded queue);
* a job that exceeds the worker's address-space cap raises :class:`WorkerMemoryExceeded`; a
  worker that dies raises :class:`WorkerCrashed`; in both cases only that call fails and the
  worker is replaced.

Jobs are module-level functions (they are pickled by reference to a ``spawn``ed child).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import resource
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("kperf.pool")

# ``spawn``: uvicorn's process already runs threads, and forking a threaded process can
# deadlock the child (CPython 3.12 warns about it); a fresh interpreter is the safe choice.
_CTX = multiprocessing.get_context("spawn")


class PoolError(RuntimeError):
    """Base class of pool failures (mapped to HTTP in ``app/errors.py``)."""


class PoolSaturated(PoolError):
    """Every worker is busy and the wait queue is full; retry after ``retry_after_s``."""

    def __init__(self, queue_size: int, retry_after_s: int) -> None:
        super().__init__(
            f"all solver workers are busy and {queue_size} requests are already waiting; "
            f"retry after {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class WorkerTimeout(PoolError):
    """No answer within the hard deadline; the worker (if any) was killed."""

    def __init__(self, time_limit_s: float, hard_deadline_s: float, queued: bool) -> None:
        where = "waiting for a free worker" if queued else "solving"
        super().__init__(
            f"no answer within {hard_deadline_s:.3f} s (time_limit_s={time_limit_s} plus 20% + "
            f"100 ms) while {where}; raise time_limit_s or shrink the problem"
        )
        self.time_limit_s = time_limit_s
        self.hard_deadline_s = hard_deadline_s


class WorkerMemoryExceeded(PoolError):
    """The job needed more address space than the per-worker cap."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            f"the job exceeded the worker memory limit of {limit_bytes} bytes; shrink the "
            "problem or the search space (operators: raise KPERF_WORKER_MEMORY_LIMIT_BYTES)"
        )
        self.limit_bytes = limit_bytes


class WorkerCrashed(PoolError):
    """The worker process died while running the job (a bug; the worker was replaced)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"the solver worker process died (exit code {exitcode})")
        self.exitcode = exitcode


class PoolClosed(PoolError):
    """The pool is not running (service starting up or shutting down)."""

    def __init__(self) -> None:
        super().__init__("the solver pool is not running; retry shortly")


class RemoteError(RuntimeError):
    """An exception raised in a worker that could not be sent back as itself."""


# --------------------------------------------------------------------------- worker side


def _worker_main(
    conn: multiprocessing.connection.Connection,
    memory_limit_bytes: int,
    preload: Sequence[str],
    nice: int = 0,
) -> None:
    # The parent decides when to stop; Ctrl-C in a terminal must not kill workers mid-job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice > 0:
        # solves are throughput work; the parent's event loop (health checks, cache hits,
        # 503s) is latency work and must win the CPU when both want it
        os.nice(nice)
    for module in preload:
        importlib.import_module(module)
    if memory_limit_bytes > 0:
        # Set after the imports so the cap measures the job, not the interpreter start-up.
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        fn, kwargs = job
        conn.send(_run_job(fn, kwargs))


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    # z3 reports a failed allocation as Z3Exception("out of memory") or similar
    return type(exc).__name__ == "Z3Exception" and "memory" in str(exc).lower()


@dataclass(frozen=True)
class _ExceptionPayload:
    """An exception in transit: class, ``args`` and ``__dict__``.

    Domain errors with a custom ``__init__(field, reason)`` do not survive plain pickling
    (pickle re-calls ``__init__`` with ``args``); rebuilding from the parts keeps the class,
    message and attributes, so the parent maps the error exactly as if raised in-process.
    """

    cls: type[BaseException]
    args: tuple[Any, ...]
    state: dict[str, Any]
    remote_traceback: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> _ExceptionPayload:
        state = {k: v for k, v in getattr(exc, "__dict__", {}).items() if k != "__notes__"}
        trace = "".join(traceback.format_exception(exc))
        payload = cls(type(exc), tuple(exc.args), state, trace)
        try:
            pickle.loads(pickle.dumps(payload))
        except Exception:  # noqa: BLE001 - unimportable class or unpicklable attributes
            return cls(RemoteError, (f"{type(exc).__name__}: {exc}",), {}, trace)
        return payload

    def rebuild(self) -> BaseException:
        exc = self.cls.__new__(self.cls)
        exc.args = self.args
        exc.__dict__.update(self.state)
        if self.remote_traceback:
            # shown when the parent logs the error (e.g. an unexpected 500): where it happened
            exc.add_note("in the worker process:\n" + self.remote_traceback)
        return exc


def _run_job(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[str, Any, float]:
    start = time.perf_counter()
    try:
        result = fn(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        elapsed = time.perf_counter() - start
        if _is_out_of_memory(exc):
            return ("memory", None, elapsed)
        return ("error", _ExceptionPayload.of(exc), elapsed)
    elapsed = time.perf_counter() - start
    try:
        pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001
        return ("error", RemoteError(f"result is not picklable: {exc}"), elapsed)
    return ("ok", result, elapsed)


# --------------------------------------------------------------------------- parent side


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    started_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a job returned, and how long it ran inside the worker."""

    value: Any
    solve_time_s: float
    queued_s: float


Observer = Callable[[str, float], None]


async def _read(conn: multiprocessing.connection.Connection) -> Any:
    """Await one message on ``conn`` without a thread: wake when the fd is readable."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    fd = conn.fileno()

    def on_readable() -> None:
        loop.remove_reader(fd)
        if fut.done():
            return
        try:
            fut.set_result(conn.recv())
        except (EOFError, OSError) as exc:
            fut.set_exception(EOFError(str(exc)))
        except Exception as exc:  # noqa: BLE001 - e.g. unpickling failure
            fut.set_exception(exc)

    loop.add_reader(fd, on_readable)
    try:
        return await fut
    finally:
        loop.remove_reader(fd)


class WorkerPool:
    """``size`` worker processes, at most ``queue_size`` callers waiting for one."""

    def __init__(
        self,
        size: int,
        queue_size: int,
        *,
        memory_limit_bytes: int = 0,
        retry_after_s: int = 1,
        startup_timeout_s: float = 60.0,
        preload: Sequence[str] = (),
        nice: int = 0,
        on_restart: Callable[[str], None] | None = None,
        on_queue_depth: Callable[[int], None] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1 worker")
        if queue_size < 0:
            raise ValueError("queue_size must be 0 or more")
        self.size = size
        self.queue_size = queue_size
        self.memory_limit_bytes = memory_limit_bytes
        self.retry_after_s = retry_after_s
        self.startup_timeout_s = startup_timeout_s
        self.preload = tuple(preload)
        self.nice = nice
        self._on_restart = on_restart
        self._on_queue_depth = on_queue_depth
        self._workers: set[_Worker] = set()
        self._idle: asyncio.Queue[_Worker] | None = None
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self.restarts = 0

    # ----------------------------------------------------------------- lifecycle

    async def start(self, *, wait_ready: bool = True) -> None:
        """Start the workers; with ``wait_ready`` return once every one has loaded."""
        self._idle = asyncio.Queue()
        self._running = True
        spawns = [self._spawn() for _ in range(self.size)]
        if wait_ready:
            await asyncio.gather(*spawns)
        else:
            for coro in spawns:
                self._background(coro)

    async def stop(self) -> None:
        self._running = False
        for task in list(self._tasks):
            task.cancel()
        for worker in list(self._workers):
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(None)
        deadline = time.monotonic() + 2.0
        for worker in list(self._workers):
            await asyncio.to_thread(worker.process.join, max(0.0, deadline - time.monotonic()))
            self._discard(worker)

    @property
    def alive_workers(self) -> int:
        return sum(1 for w in self._workers if w.process.is_alive())

    @property
    def idle_workers(self) -> int:
        return self._idle.qsize() if self._idle is not None else 0

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> bool:
        return self._running

    def _background(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self) -> None:
        """Start one worker and put it in the idle queue once it has loaded."""
        parent, child = _CTX.Pipe(duplex=True)
        process = _CTX.Process(
            target=_worker_main,
            args=(child, self.memory_limit_bytes, self.preload, self.nice),
            name="kperf-worker",
            daemon=True,
        )
        process.start()
        child.close()
        worker = _Worker(process, parent)
        self._workers.add(worker)
        try:
            message = await asyncio.wait_for(_read(parent), self.startup_timeout_s)
        except (TimeoutError, EOFError, OSError) as exc:
            log.error("worker failed to start", extra={"error": repr(exc)})
            await self._kill(worker)
            if self._running:
                await asyncio.sleep(1.0)  # don't spin if start-up itself is broken
                self._background(self._spawn())
            return
        if message[0] != "ready":  # pragma: no cover - protocol guard
            await self._kill(worker)
            return
        if not self._running or self._idle is None:
            await self._kill(worker)
            return
        self._idle.put_nowait(worker)

    def _discard(self, worker: _Worker) -> None:
        self._workers.discard(worker)
        with contextlib.suppress(OSError):
            worker.conn.close()

    async def _kill(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        await asyncio.to_thread(worker.process.join, 5.0)
        self._discard(worker)

    async def _replace(self, worker: _Worker, reason: str) -> None:
        await self._kill(worker)
        self.restarts += 1
        log.warning("worker replaced", extra={"reason": reason, "pid": worker.process.pid})
        if self._on_restart is not None:
            self._on_restart(reason)
        if self._running:
            await self._spawn()

    def _report_depth(self) -> None:
        if self._on_queue_depth is not None:
            self._on_queue_depth(self._waiting)

    # ----------------------------------------------------------------- jobs

    def admit(self) -> None:
        """Raise :class:`PoolSaturated` when a new caller would exceed the wait queue."""
        if not self._running or self._idle is None:
            raise PoolClosed()
        if self._idle.qsize() <= self._waiting and self._waiting >= self.queue_size:
            raise PoolSaturated(self.queue_size, self.retry_after_s)

    async def run(
        self,
        fn: Callable[..., Any],
        kwargs: dict[str, Any],
        *,
        time_limit_s: float,
        hard_deadline_s: float,
        pass_time_limit: bool = True,
        admitted: bool = False,
    ) -> JobOutcome:
        """Run ``fn(**kwargs)`` in a worker within ``hard_deadline_s`` of this call.

        ``admitted=True`` skips the queue-length check, for a caller (a batch) that was
        admitted once for several jobs.
        """
        t0 = time.monotonic()
        deadline = t0 + hard_deadline_s
        if not admitted:
            self.admit()
        if self._idle is None:
            raise PoolClosed()
        self._waiting += 1
        self._report_depth()
        try:
            worker = await asyncio.wait_for(self._idle.get(), max(0.0, deadline - t0))
        except TimeoutError:
            raise WorkerTimeout(time_limit_s, hard_deadline_s, queued=True) from None
        finally:
            self._waiting -= 1
            self._report_depth()
        queued_s = time.monotonic() - t0
        job_kwargs = dict(kwargs)
        if pass_time_limit:
            # the job's own limit is what is left of the request's limit after queueing
            job_kwargs["time_limit_s"] = max(0.05, time_limit_s - queued_s)
        try:
            worker.conn.send((fn, job_kwargs))
        except (OSError, ValueError):
            self._background(self._replace(worker, "crash"))
            raise WorkerCrashed(worker.process.exitcode) from None
        read = asyncio.ensure_future(_read(worker.conn))
        try:
            kind, value, solve_time_s = await asyncio.wait_for(
                asyncio.shield(read), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            read.cancel()
            # kill in the background so the 504 is not delayed by the join
            self._background(self._replace(worker, "timeout"))
            raise WorkerTimeout(time_limit_s, hard_deadline_s, queued=False) from None
        except asyncio.CancelledError:
            # the client went away: let the job finish (or die at its deadline) on its own
            self._background(self._drain(worker, read, deadline))
            raise
        except EOFError:
            await asyncio.to_thread(worker.process.join, 1.0)
            exitcode = worker.process.exitcode
            self._background(self._replace(worker, "crash"))
            if self.memory_limit_bytes > 0 and exitcode == -signal.SIGABRT:
                # a C++ allocation failure under RLIMIT_AS aborts the process
                raise WorkerMemoryExceeded(self.memory_limit_bytes) from None
            raise WorkerCrashed(exitcode) from None
        except Exception:
            # unpicklable/garbled answer: the worker's state is unknown, replace it
            self._background(self._replace(worker, "crash"))
            raise
        if kind == "memory":
            # the allocation failed cleanly, but the heap may be fragmented: start afresh
            self._background(self._replace(worker, "memory"))
            raise WorkerMemoryExceeded(self.memory_limit_bytes)
        self._release(worker)
        if kind == "error":
            raise value.rebuild()
        return JobOutcome(value, solve_time_s, queued_s)

    def _release(self, worker: _Worker) -> None:
        if self._running and self._idle is not None:
            self._idle.put_nowait(worker)
        else:
            self._background(self._kill(worker))

    async def _drain(self, worker: _Worker, read: asyncio.Future[Any], deadline: float) -> None:
        try:
            await asyncio.wait_for(read, max(0.0, deadline - time.monotonic()))
        except (TimeoutError, EOFError):
            await self._replace(worker, "timeout")
        except asyncio.CancelledError:
            await self._kill(worker)
            raise
        except Exception:  # noqa: BLE001
            await self._replace(worker, "crash")
        else:
            self._release(worker)
