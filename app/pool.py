"""A supervised pool of worker processes for solves and PTX analyses.

Why processes, and why not ``concurrent.futures.ProcessPoolExecutor``: a Z3 solve holds the GIL
inside C++ and can run past its own timeout, so it must be off the event loop and killable on
its own. An executor cannot kill one task without breaking the whole pool. Here every worker
owns one duplex pipe; the event loop waits on the pipe's file descriptor (no thread per job), and
a worker that overruns for real is SIGKILLed and replaced while the others keep working.

Supervision: the pipe is each worker's lifeline. Only the worker holds the other end, so the
moment it dies (``kill -9``, the OOM killer, a segfault) the pipe reads as closed. An idle
worker's pipe is watched by the event loop, so its death is noticed at once, not by the next
job, and a replacement is started; a busy worker's death ends its job's read. Workers are forked
from a ``forkserver`` that has already imported the solver, so a replacement is ready in a
fraction of a second instead of the seconds a fresh interpreter needs to import Z3.

Contract of :meth:`WorkerPool.run`:

* the job gets (keyword argument ``time_limit_s``) what is left of the request's limit after
  queueing, capped so that the job plus its measured overrun (dispatch, set-up, the answer's way
  back: :class:`OverrunEstimate`) fits the request's bound;
* a request whose remaining budget cannot fit that overrun plus ``min_job_time_limit_s`` gets
  :class:`WorkerTimeout` at once, without dispatch (it stops waiting for a worker as soon as
  that is true);
* the answer comes within ``hard_deadline_s`` of the request's arrival, else
  :class:`WorkerTimeout`; the late job keeps its worker until it answers, and the worker is
  killed only if the job runs :data:`KILL_GRACE_S` past the limit it was given;
* when every worker is busy and ``queue_size`` calls already wait, :class:`PoolSaturated` is
  raised at once (no unbounded queue);
* a worker that dies before it acknowledged the job is not the job's fault: the job goes to
  another worker. A worker that dies during the job gets the job retried once on another worker
  (every job is idempotent); a second death means the job caused it: :class:`WorkerCrashed`. A
  job that exceeds the worker's address-space cap raises :class:`WorkerMemoryExceeded` (not
  retried: it would fail the same way). Every dead worker is replaced.

Jobs are module-level functions (pickled by reference, imported by the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import resource
import signal
import sys
import time
import traceback
import types
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal

log = logging.getLogger("kperf.pool")

# ``forkserver``: uvicorn's process already runs threads, and forking a threaded process can
# deadlock the child (CPython 3.12 warns about it). The fork server is a fresh single-threaded
# interpreter that imports the preload modules once; forking it is safe and fast.
_CTX = multiprocessing.get_context("forkserver")

#: the thread counts of the BLAS/OpenMP libraries numpy and scipy load: the pool's parallelism
#: is its workers, and threads inside each only contend for the same cores. OpenBLAS's threads
#: spin while they wait: a 2,059-run recalibration's fit (thousands of small SVDs in scipy's
#: least squares) cost 17 s of CPU with two of them on a loaded 2-core machine, 1.6 s with one
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: the process name workers show in ``ps`` / ``/proc/<pid>/comm`` (at most 15 bytes)
WORKER_PROCESS_NAME = "kperf-worker"

#: the smallest time limit worth giving a job: below it the solver cannot even run one check
MIN_JOB_TIME_LIMIT_S = 0.02
#: overrun assumed for a kind of job until one has reached its limit; bench/bench_deadline.py
#: measures it (RESULTS.md: median 35-70 ms, p90 about 100 ms with both workers busy on the
#: loaded 2-core development machine)
INITIAL_OVERRUN_S = 0.1
#: overrun estimates never go below this (event-loop wake-up and scheduling on a loaded box)
MIN_OVERRUN_S = 0.03
#: overruns are remembered this long: a stall (a burst of load on the machine) raises the
#: estimate for a while, not for good
OVERRUN_MEMORY_S = 60.0
#: a job still running this long past the limit it was given has overrun for real (a solve
#: stuck in C++): its worker is killed. Shorter overruns (CPU contention) answer 504 at the
#: request's bound and let the worker finish, so a loaded machine does not lose its workers
KILL_GRACE_S = 1.0
#: times a job whose worker died before starting it is sent to another worker, at most
MAX_LOST_BEFORE_START = 3
#: the exit status multiprocessing reports when the fork server that forked a worker has died
#: (the worker itself may still run)
_STATUS_LOST = 255


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
    """No answer within the request's bound (504).

    ``dispatched`` is False when the request never reached a worker: its remaining budget could
    not fit a solve. Otherwise the job overran and its worker was killed.
    """

    def __init__(
        self, time_limit_s: float, hard_deadline_s: float, *, dispatched: bool, detail: str
    ) -> None:
        super().__init__(
            f"no answer within the bound of {hard_deadline_s:.3f} s for time_limit_s="
            f"{time_limit_s} s (limit + 20 % + 100 ms): {detail}; raise time_limit_s, shrink "
            "the problem or retry when the service is less busy"
        )
        self.time_limit_s = time_limit_s
        self.hard_deadline_s = hard_deadline_s
        self.dispatched = dispatched


class WorkerMemoryExceeded(PoolError):
    """The job needed more address space than the per-worker cap."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            f"the job exceeded the worker memory limit of {limit_bytes} bytes; shrink the "
            "problem or the search space (operators: raise KPERF_WORKER_MEMORY_LIMIT_BYTES)"
        )
        self.limit_bytes = limit_bytes


class WorkerCrashed(PoolError):
    """The job killed a worker process every time it ran (a bug; the workers were replaced)."""

    def __init__(self, exitcode: int | None, attempts: int = 1) -> None:
        super().__init__(
            f"the solver worker process died while running this request (exit code {exitcode}"
            f", {attempts} attempt{'s' if attempts != 1 else ''} on different workers)"
        )
        self.exitcode = exitcode
        self.attempts = attempts


class PoolClosed(PoolError):
    """The pool is not running (service starting up or shutting down)."""

    def __init__(self) -> None:
        super().__init__("the solver pool is not running; retry shortly")


class RemoteError(RuntimeError):
    """An exception raised in a worker that could not be sent back as itself."""


# --------------------------------------------------------------------------- worker side


def _main_script_imports() -> list[str]:
    """The modules the main script (``kperf``, ``pytest``) took its names from.

    Each new worker runs the main script again (multiprocessing's fix-up of ``__main__``); that
    is quick only when the fork server has already imported what the script imports. Measured
    with bench/bench_recovery.py: a replacement took about 0.6 s without this (``kperf``
    imports ``kperf_client.cli``, which imports the HTTP client and builds an app).
    """
    main = sys.modules.get("__main__")
    names: set[str] = set()
    for name, value in vars(main).items() if main is not None else ():
        if name.startswith("__"):
            continue  # __builtins__, __loader__, ...
        module = value.__name__ if isinstance(value, types.ModuleType) else None
        module = module or getattr(value, "__module__", None)
        if isinstance(module, str) and module not in ("__main__", "__mp_main__", "builtins"):
            names.add(module)
    return sorted(names)


def _name_process(name: str) -> None:
    """Show ``name`` in ``ps`` (Linux: /proc/self/comm); elsewhere a no-op."""
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w", encoding="ascii") as comm:
            comm.write(name[:15])


def _worker_main(
    conn: multiprocessing.connection.Connection,
    memory_limit_bytes: int,
    preload: Sequence[str],
    nice: int = 0,
    environ: dict[str, str] | None = None,
) -> None:
    # The parent decides when to stop; Ctrl-C in a terminal must not kill workers mid-job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if environ is not None:
        # a fork of the fork server has the environment the fork server started with; a worker
        # gets its parent's, as of the worker's start (as a spawned process would)
        os.environ.clear()
        os.environ.update(environ)
    _name_process(WORKER_PROCESS_NAME)
    if nice > 0:
        # solves are throughput work; the parent's event loop (health checks, cache hits,
        # 503s) is latency work and must win the CPU when both want it
        os.nice(nice)
    for module in preload:
        importlib.import_module(module)  # already imported by the fork server: a no-op
    if memory_limit_bytes > 0:
        # Set after the imports so the cap measures the job, not the interpreter start-up.
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    _send(conn, ("ready", os.getpid(), 0.0))
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            job = pickle.loads(data)
        except BaseException as exc:  # noqa: BLE001 - e.g. the job's module fails to import
            _send(conn, ("started", None, 0.0))
            _send(conn, ("error", _ExceptionPayload.of(exc), 0.0))
            continue
        if job is None:
            return
        # the acknowledgement tells the parent that a death from now on happened during the job
        _send(conn, ("started", None, 0.0))
        fn, kwargs = job
        _send_encoded(conn, _run_job(fn, kwargs))


#: a message as it goes down the pipe: a 4-byte count of out-of-band buffers and the pickle
#: (protocol 5), then each buffer as a message of its own
Encoded = tuple[bytes, list[pickle.PickleBuffer]]


def _encode(message: Any) -> Encoded:
    """``message`` ready to send. An object that offers its bytes out of band
    (``EncodedAnswer``: a 36 MB body) is not copied into the pickle; it is received as the one
    bytes object ``recv_bytes`` makes (:func:`_read`)."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    return len(buffers).to_bytes(4, "big") + data, buffers


def _send(conn: multiprocessing.connection.Connection, message: Any) -> None:
    """One message to the parent."""
    _send_encoded(conn, _encode(message))


def _send_encoded(conn: multiprocessing.connection.Connection, encoded: Encoded) -> None:
    head, buffers = encoded
    conn.send_bytes(head)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def _buffer_count(head: bytes) -> int:
    """How many out-of-band buffers follow the message whose first part is ``head``."""
    return int.from_bytes(head[:4], "big")


def _receive_buffers(conn: multiprocessing.connection.Connection, count: int) -> list[bytes]:
    return [conn.recv_bytes() for _ in range(count)]


def _decode(head: bytes, buffers: list[bytes]) -> Any:
    """The message :func:`_encode` made, from its first part and its buffers."""
    return pickle.loads(memoryview(head)[4:], buffers=buffers)


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


def _run_job(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Encoded:
    """The job's outcome, ``(kind, value, seconds)``, encoded once: a result that cannot be
    pickled becomes an error outcome here, not a failure to send."""
    start = time.perf_counter()
    try:
        result = fn(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        elapsed = time.perf_counter() - start
        if _is_out_of_memory(exc):
            return _encode(("memory", None, elapsed))
        return _encode(("error", _ExceptionPayload.of(exc), elapsed))
    elapsed = time.perf_counter() - start
    try:
        return _encode(("ok", result, elapsed))
    except Exception as exc:  # noqa: BLE001
        failure = RemoteError(f"result is not picklable: {exc}")
        return _encode(("error", _ExceptionPayload.of(failure), elapsed))


# --------------------------------------------------------------------------- parent side

WorkerState = Literal["starting", "idle", "busy", "gone"]


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    state: WorkerState = "starting"
    #: the worker acknowledged the job it was sent: a death from then on happened during it
    job_started: bool = False
    started_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a job returned, and how long it ran inside the worker."""

    value: Any
    solve_time_s: float
    queued_s: float


@dataclass
class OverrunEstimate:
    """How far past its time limit a kind of job answers, learned from the jobs that reached it.

    A job's answer arrives some time after its limit: pickling and dispatch, the job's set-up
    before the solver's clock starts, the solver's last check after its deadline, the answer's
    way back, all stretched by CPU contention. Jobs that finish early say nothing about it and
    are not recorded. The estimate is ``headroom`` times the ``quantile`` (p90) of the overruns
    of the last ``memory_s`` seconds (at most ``window`` of them), never below ``floor_s``;
    ``initial_s`` until one is known. A job is given ``remaining budget - estimate`` as its
    limit, so its answer fits the request's bound; a rarer, longer overrun answers 504 at the
    bound (the worker is kept, see :data:`KILL_GRACE_S`).
    """

    initial_s: float = INITIAL_OVERRUN_S
    _: KW_ONLY
    floor_s: float = MIN_OVERRUN_S
    memory_s: float = OVERRUN_MEMORY_S
    window: int = 32
    quantile: float = 0.9
    headroom: float = 1.25
    #: (time.monotonic() when recorded, overrun in seconds), oldest first
    _samples: deque[tuple[float, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ValueError("quantile must be in (0, 1]")
        self._samples = deque(maxlen=self.window)

    def record(self, overrun_s: float) -> None:
        self._samples.append((time.monotonic(), max(0.0, overrun_s)))

    def reserve_s(self) -> float:
        oldest = time.monotonic() - self.memory_s
        while self._samples and self._samples[0][0] < oldest:
            self._samples.popleft()
        if not self._samples:
            return max(self.floor_s, self.initial_s)
        ordered = sorted(s for _, s in self._samples)
        high = ordered[math.ceil(self.quantile * len(ordered)) - 1]
        return max(self.floor_s, self.headroom * high)


class _WorkerLost(Exception):
    """Internal: the worker died under a job (``started``: after acknowledging it)."""

    def __init__(self, started: bool, exitcode: int | None) -> None:
        super().__init__(f"worker lost (started={started}, exit code {exitcode})")
        self.started = started
        self.exitcode = exitcode


class _TooLate(Exception):
    """Internal: the waiter's budget ran out before a worker became free."""


class _LateAnswer(Exception):
    """Internal: the job had not answered by its deadline (its worker was left to finish)."""


@dataclass
class _Job:
    """One dispatch of a job to a worker, with its clock."""

    fn: Callable[..., Any]
    kwargs: dict[str, Any]
    #: time.monotonic() when it was sent
    dispatched: float
    #: the limit the job was given, from ``dispatched``
    time_limit_s: float
    #: when the caller stops waiting for the answer (the request's bound, less the margin)
    deadline: float
    #: learns the job's overrun past its limit; None for jobs given no limit
    estimate: OverrunEstimate | None

    @property
    def kill_at(self) -> float:
        """A job still running this long after its limit overran for real: kill its worker."""
        return max(self.deadline, self.dispatched + self.time_limit_s + KILL_GRACE_S)

    def record_overrun(self) -> None:
        answered_s = time.monotonic() - self.dispatched
        if self.estimate is not None and answered_s >= self.time_limit_s:
            # only a job that used its whole limit says how far past it an answer comes
            self.estimate.record(answered_s - self.time_limit_s)


async def _read(conn: multiprocessing.connection.Connection) -> Any:
    """Await one message on ``conn``: wake when the fd is readable, read the message's first
    part on the loop (small: the pickle without its out-of-band buffers), and its buffers, if
    any, in a thread: copying a 36 MB answer out of the pipe held the loop for 45 ms."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    fd = conn.fileno()

    def settle(message: Callable[[], Any]) -> None:
        if fut.done():  # cancelled meanwhile: the message was consumed whole all the same
            return
        try:
            fut.set_result(message())
        except (EOFError, OSError) as exc:
            fut.set_exception(EOFError(str(exc)))
        except Exception as exc:  # noqa: BLE001 - e.g. unpickling failure
            fut.set_exception(exc)

    def on_readable() -> None:
        loop.remove_reader(fd)
        if fut.done():
            return
        try:
            head = conn.recv_bytes()
        except (EOFError, OSError) as exc:
            fut.set_exception(EOFError(str(exc)))
            return
        count = _buffer_count(head)
        if count == 0:
            settle(lambda: _decode(head, []))
            return

        def buffers_read(read: asyncio.Future[list[bytes]]) -> None:
            if not read.cancelled():
                read.exception()  # retrieved, even when nobody awaits the message any more
            settle(lambda: _decode(head, read.result()))

        reading = loop.run_in_executor(None, _receive_buffers, conn, count)
        reading.add_done_callback(buffers_read)

    loop.add_reader(fd, on_readable)
    try:
        return await fut
    finally:
        loop.remove_reader(fd)


class WorkerPool:
    """``size`` supervised worker processes, at most ``queue_size`` callers waiting for one."""

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
        min_job_time_limit_s: float = MIN_JOB_TIME_LIMIT_S,
        initial_overrun_s: float = INITIAL_OVERRUN_S,
        on_restart: Callable[[str], None] | None = None,
        on_queue_depth: Callable[[int], None] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1 worker")
        if queue_size < 0:
            raise ValueError("queue_size must be 0 or more")
        if min_job_time_limit_s <= 0:
            raise ValueError("min_job_time_limit_s must be positive")
        self.size = size
        self.queue_size = queue_size
        self.memory_limit_bytes = memory_limit_bytes
        self.retry_after_s = retry_after_s
        self.startup_timeout_s = startup_timeout_s
        self.preload = tuple(preload)
        self.nice = nice
        self.min_job_time_limit_s = min_job_time_limit_s
        self.initial_overrun_s = initial_overrun_s
        self._on_restart = on_restart
        self._on_queue_depth = on_queue_depth
        self._workers: set[_Worker] = set()
        self._idle: deque[_Worker] = deque()
        self._waiters: deque[asyncio.Future[_Worker]] = deque()
        self._overruns: dict[str, OverrunEstimate] = {}
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._start_lock: asyncio.Lock | None = None
        self._running = False
        self.restarts = 0

    # ----------------------------------------------------------------- lifecycle

    async def start(self, *, wait_ready: bool = True) -> None:
        """Start the workers; with ``wait_ready`` return once every one has loaded."""
        self._start_lock = asyncio.Lock()
        self._running = True
        for variable in BLAS_THREAD_VARIABLES:
            # before the fork server imports numpy (the libraries read them once, at load);
            # an operator's own setting wins
            os.environ.setdefault(variable, "1")
        if self.preload:
            # takes effect when the fork server starts (the first pool of the process)
            _CTX.set_forkserver_preload([*self.preload, *_main_script_imports()])
        spawns = [self._spawn() for _ in range(self.size)]
        if wait_ready:
            await asyncio.gather(*spawns)
        else:
            for coro in spawns:
                self._background(coro)

    async def stop(self) -> None:
        self._running = False
        # a task may start another while it ends (a worker lost during the stop is
        # "replaced": killed, and no new one spawned): loop until none is left
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosed())
        self._idle.clear()
        for worker in list(self._workers):
            self._unwatch(worker)
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(None)
        deadline = time.monotonic() + 2.0
        for worker in list(self._workers):
            if await self._exit_code(worker, max(0.0, deadline - time.monotonic())) is None:
                await self._kill(worker)
            self._discard(worker)

    @property
    def alive_workers(self) -> int:
        """Workers loaded and not known to be dead (idle or running a job)."""
        return sum(1 for w in self._workers if w.state in ("idle", "busy"))

    @property
    def idle_workers(self) -> int:
        return len(self._idle)

    @property
    def busy_workers(self) -> int:
        return sum(1 for w in self._workers if w.state == "busy")

    @property
    def starting_workers(self) -> int:
        return sum(1 for w in self._workers if w.state == "starting")

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> bool:
        return self._running

    def worker_states(self) -> list[tuple[int, WorkerState]]:
        """(process id, state) of every worker process, for operators (``ps``, ``py-spy``)."""
        return sorted(
            (w.process.pid, w.state)
            for w in self._workers
            if w.process.pid is not None and w.state != "gone"
        )

    def overrun_s(self, fn: Callable[..., Any]) -> float:
        """The overrun currently reserved for jobs running ``fn`` (see :class:`OverrunEstimate`)."""
        return self._overrun_of(fn).reserve_s()

    def _overrun_of(self, fn: Callable[..., Any]) -> OverrunEstimate:
        key = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        estimate = self._overruns.get(key)
        if estimate is None:
            estimate = self._overruns[key] = OverrunEstimate(self.initial_overrun_s)
        return estimate

    def _background(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        """Forget a finished background task and retrieve its outcome: an exception is logged
        here, never left to asyncio's "Task exception was never retrieved" at shutdown."""
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if not self._running and isinstance(exc, RuntimeError):
            # the loop's executor is shut down under a replacement started before the stop
            # ("cannot schedule new futures after shutdown"): nothing is left to replace
            log.debug("background task ended by the shutdown", extra={"error": repr(exc)})
            return
        log.error("pool background task failed", exc_info=exc)

    async def _spawn(self) -> None:
        """Start one worker and hand it to a waiter (or the idle set) once it has loaded.

        A worker that fails to start is retried at once, then with a growing pause, so a broken
        start-up does not spin while a worker killed during its start is replaced without delay.
        """
        failures = 0
        while self._running:
            worker = await self._start_one()
            if worker is not None:
                self._hand_over(worker)
                return
            failures += 1
            if failures > 1:
                await asyncio.sleep(min(5.0, 0.25 * 2 ** (failures - 2)))

    async def _start_one(self) -> _Worker | None:
        assert self._start_lock is not None  # set by start()
        parent, child = _CTX.Pipe(duplex=True)
        process = _CTX.Process(
            target=_worker_main,
            args=(child, self.memory_limit_bytes, self.preload, self.nice, dict(os.environ)),
            name="kperf-worker",
            daemon=True,
        )
        # in a thread: when the fork server itself has to (re)start, the start waits for its
        # imports, which must not stall the event loop (health checks, cache hits)
        async with self._start_lock:
            try:
                await asyncio.to_thread(process.start)
            except OSError as exc:
                log.error("worker failed to start", extra={"error": repr(exc)})
                child.close()
                parent.close()
                return None
        child.close()
        worker = _Worker(process, parent)
        self._workers.add(worker)
        try:
            message = await asyncio.wait_for(_read(parent), self.startup_timeout_s)
        except (TimeoutError, EOFError, OSError) as exc:
            log.error("worker failed to start", extra={"error": repr(exc)})
            await self._kill(worker)
            return None
        if message[0] != "ready" or not self._running:
            await self._kill(worker)
            return None
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.state = "gone"
        self._unwatch(worker)
        self._workers.discard(worker)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)
        with contextlib.suppress(OSError):
            worker.conn.close()

    async def _exit_code(self, worker: _Worker, timeout_s: float) -> int | None:
        """The worker's exit code once it has exited, waiting up to ``timeout_s``; else None."""
        loop = asyncio.get_running_loop()
        end = time.monotonic() + timeout_s
        process = worker.process
        while True:
            try:
                code = process.exitcode
                sentinel = process.sentinel
            except ValueError:  # the process object was closed: long gone
                return None
            if code is not None:
                return code
            left = end - time.monotonic()
            if left <= 0:
                return None
            # the sentinel becomes readable when the process ends; no thread needed
            ready: asyncio.Future[None] = loop.create_future()

            def wake(fut: asyncio.Future[None] = ready) -> None:
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(sentinel, wake)
            try:
                await asyncio.wait_for(ready, min(left, 0.05))
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(sentinel)

    async def _kill(self, worker: _Worker) -> int | None:
        """SIGKILL the worker (if it still runs), wait for its exit, forget it."""
        worker.state = "gone"
        self._unwatch(worker)
        code: int | None = None
        with contextlib.suppress(ValueError):
            code = worker.process.exitcode
        if code in (None, _STATUS_LOST) and worker.process.pid is not None:
            # os.kill, not Process.kill: once the fork server has gone, the exit status reads
            # 255 and Process.kill does nothing, though the worker may still run
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(worker.process.pid, signal.SIGKILL)
            code = await self._exit_code(worker, 5.0)
        self._discard(worker)
        with contextlib.suppress(ValueError):
            worker.process.close()
        return code

    async def _replace(self, worker: _Worker, reason: str) -> None:
        pid = worker.process.pid
        code = await self._kill(worker)
        self.restarts += 1
        log.warning("worker replaced", extra={"reason": reason, "pid": pid, "exitcode": code})
        if self._on_restart is not None:
            self._on_restart(reason)
        if self._running:
            await self._spawn()

    def _report_depth(self) -> None:
        if self._on_queue_depth is not None:
            self._on_queue_depth(self._waiting)

    # ----------------------------------------------------------------- idle supervision

    def _watch(self, worker: _Worker) -> None:
        """While idle, the worker's pipe must stay silent: readable means it died."""
        with contextlib.suppress(OSError, ValueError):
            asyncio.get_running_loop().add_reader(
                worker.conn.fileno(), self._idle_worker_readable, worker
            )

    def _unwatch(self, worker: _Worker) -> None:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(worker.conn.fileno())

    def _idle_worker_readable(self, worker: _Worker) -> None:
        self._unwatch(worker)
        if worker.state != "idle":
            return
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)
        worker.state = "gone"
        log.warning("idle worker died", extra={"pid": worker.process.pid})
        self._background(self._replace(worker, "idle"))

    def _hand_over(self, worker: _Worker) -> None:
        """A loaded worker is free: to the longest-waiting caller, else to the idle set."""
        if not self._running:
            self._background(self._kill(worker))
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                worker.state = "busy"
                waiter.set_result(worker)
                return
        worker.state = "idle"
        self._idle.append(worker)
        self._watch(worker)

    def _take_idle(self) -> _Worker | None:
        while self._idle:
            worker = self._idle.popleft()
            self._unwatch(worker)
            if worker.state == "idle":
                worker.state = "busy"
                return worker
        return None

    async def _acquire(self, wait_s: float, *, front: bool) -> _Worker:
        """A free worker within ``wait_s``, else :class:`_TooLate`. ``front``: jump the queue
        (a job retried after its worker died has waited its turn already)."""
        worker = self._take_idle()
        if worker is not None:
            return worker
        if wait_s <= 0:
            raise _TooLate()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_Worker] = loop.create_future()
        if front:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)

        def expire() -> None:
            if not waiter.done():
                waiter.set_exception(_TooLate())

        timer = loop.call_later(wait_s, expire)
        self._waiting += 1
        self._report_depth()
        try:
            return await waiter
        except BaseException:
            # handed a worker just as we gave up (cancelled): pass it on, never leak it
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._hand_over(waiter.result())
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            self._waiting -= 1
            self._report_depth()

    # ----------------------------------------------------------------- jobs

    def admit(self) -> None:
        """Raise :class:`PoolSaturated` when a new caller would exceed the wait queue."""
        if not self._running:
            raise PoolClosed()
        if len(self._idle) <= self._waiting and self._waiting >= self.queue_size:
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
        elapsed_s: float = 0.0,
        margin_s: float = 0.0,
    ) -> JobOutcome:
        """Run ``fn(**kwargs)`` in a worker, answering within ``hard_deadline_s``.

        ``time_limit_s`` and ``hard_deadline_s`` are the request's own (named in a 504), counted
        from its arrival ``elapsed_s`` ago; ``margin_s`` of the bound is kept back for writing
        the answer. ``admitted=True`` skips the queue-length check, for a caller (a batch) that
        was admitted once for several jobs.
        """
        called = time.monotonic()
        arrived = called - elapsed_s
        deadline = arrived + hard_deadline_s - margin_s
        limit_end = arrived + time_limit_s
        if not admitted:
            self.admit()
        if not self._running:
            raise PoolClosed()
        estimate = self._overrun_of(fn)
        crashes = 0
        lost_before_start = 0
        while True:
            if not self._running:
                raise PoolClosed()
            reserve_s = estimate.reserve_s()
            latest_dispatch = deadline - reserve_s - self.min_job_time_limit_s
            try:
                worker = await self._acquire(
                    latest_dispatch - time.monotonic(), front=crashes + lost_before_start > 0
                )
            except _TooLate:
                raise self._not_dispatched(
                    time_limit_s, hard_deadline_s, called, deadline, reserve_s, crashes > 0
                ) from None
            job = _Job(
                fn=fn,
                kwargs=dict(kwargs),
                dispatched=time.monotonic(),
                time_limit_s=0.0,
                deadline=deadline,
                estimate=estimate if pass_time_limit else None,
            )
            job.time_limit_s = min(limit_end, deadline - reserve_s) - job.dispatched
            if job.time_limit_s < self.min_job_time_limit_s:
                self._hand_over(worker)
                raise self._not_dispatched(
                    time_limit_s, hard_deadline_s, called, deadline, reserve_s, crashes > 0
                )
            if pass_time_limit:
                job.kwargs["time_limit_s"] = job.time_limit_s
            try:
                kind, value, solve_time_s = await self._execute(worker, job)
            except _LateAnswer:
                raise WorkerTimeout(
                    time_limit_s,
                    hard_deadline_s,
                    dispatched=True,
                    detail=(
                        "the job did not answer in time (it is stopped if it runs "
                        f"{KILL_GRACE_S:g} s past the limit it was given)"
                    ),
                ) from None
            except _WorkerLost as lost:
                if not lost.started:
                    lost_before_start += 1
                    if lost_before_start <= MAX_LOST_BEFORE_START:
                        continue  # not the job's fault: another worker takes it
                    raise WorkerCrashed(lost.exitcode, crashes) from None
                if self.memory_limit_bytes > 0 and lost.exitcode == -signal.SIGABRT:
                    # a C++ allocation failure under RLIMIT_AS aborts the process
                    raise WorkerMemoryExceeded(self.memory_limit_bytes) from None
                crashes += 1
                if crashes >= 2:
                    raise WorkerCrashed(lost.exitcode, crashes) from None
                log.warning(
                    "worker died during a job; retrying it on another worker",
                    extra={"exitcode": lost.exitcode},
                )
                continue
            if kind == "memory":
                # the allocation failed cleanly, but the heap may be fragmented: start afresh
                self._background(self._replace(worker, "memory"))
                raise WorkerMemoryExceeded(self.memory_limit_bytes)
            self._hand_over(worker)
            if kind == "error":
                raise value.rebuild()
            return JobOutcome(value, solve_time_s, job.dispatched - called)

    def _not_dispatched(
        self,
        time_limit_s: float,
        hard_deadline_s: float,
        called: float,
        deadline: float,
        reserve_s: float,
        after_crash: bool,
    ) -> WorkerTimeout:
        now = time.monotonic()
        left_s = max(0.0, deadline - now)
        if after_crash:
            why = "the worker running it died (not because of this request) and"
        else:
            why = f"it waited {now - called:.3f} s for a free worker and"
        return WorkerTimeout(
            time_limit_s,
            hard_deadline_s,
            dispatched=False,
            detail=(
                f"{why} the {left_s:.3f} s left cannot fit a solve, which needs at least "
                f"{reserve_s + self.min_job_time_limit_s:.3f} s here; it was not started"
            ),
        )

    async def _execute(self, worker: _Worker, job: _Job) -> tuple[str, Any, float]:
        """Send ``job`` to ``worker`` and await its answer until the job's deadline.

        A late job keeps its worker until it answers (recording its overrun) or runs
        :data:`KILL_GRACE_S` past its own limit, when the worker is killed and replaced.
        """
        worker.job_started = False
        try:
            worker.conn.send((job.fn, job.kwargs))
        except (OSError, ValueError):
            code = await self._exit_code(worker, 1.0)
            self._background(self._replace(worker, "idle"))
            raise _WorkerLost(False, code) from None
        read = asyncio.ensure_future(self._exchange(worker))
        try:
            answer = await asyncio.wait_for(
                asyncio.shield(read), max(0.0, job.deadline - time.monotonic())
            )
        except TimeoutError:
            # answer the client now; the worker finishes (or is killed) in the background
            self._background(self._drain(worker, read, job))
            raise _LateAnswer() from None
        except asyncio.CancelledError:
            # the client went away: let the job finish (or be killed) on its own
            self._background(self._drain(worker, read, job))
            raise
        except EOFError:
            code = await self._exit_code(worker, 1.0)
            started = worker.job_started
            self._background(self._replace(worker, "crash" if started else "idle"))
            raise _WorkerLost(started, code) from None
        except Exception:
            # unpicklable/garbled answer: the worker's state is unknown, replace it
            self._background(self._replace(worker, "crash"))
            raise
        job.record_overrun()
        return answer

    async def _exchange(self, worker: _Worker) -> tuple[str, Any, float]:
        """The job's acknowledgement, then its answer."""
        ack = await _read(worker.conn)
        if ack[0] != "started":  # pragma: no cover - protocol guard
            raise RemoteError(f"unexpected message from a worker: {ack[0]!r}")
        worker.job_started = True
        answer: tuple[str, Any, float] = await _read(worker.conn)
        return answer

    async def _drain(self, worker: _Worker, read: asyncio.Future[Any], job: _Job) -> None:
        """Wait for an answer nobody awaits any more; kill the worker if it never comes."""
        try:
            kind, _, _ = await asyncio.wait_for(read, max(0.0, job.kill_at - time.monotonic()))
        except TimeoutError:
            read.cancel()
            await self._replace(worker, "timeout")
        except EOFError:
            await self._replace(worker, "crash")
        except asyncio.CancelledError:
            read.cancel()
            await self._kill(worker)
            raise
        except Exception:  # noqa: BLE001
            await self._replace(worker, "crash")
        else:
            job.record_overrun()
            if kind == "memory":
                await self._replace(worker, "memory")
            else:
                self._hand_over(worker)
