"""Fault injection against a real ``kperf serve`` on 127.0.0.1 (crash containment).

Workers are killed with SIGKILL (idle, both idle, busy, during a batch, and the fork server they
are forked from); a burst of short time limits must not kill any. Requests that did not cause a
crash must never get a 5xx other than a deliberate 504, /readyz must report true counts and be
ready again within 2 s, and no request may hang (every one has a client timeout and a bound).

Timing bounds carry allowances for the shared 2-core machine; every test is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.load_test import SLOW_SPACE
from tests.app.service_helpers import (
    A6000,
    clean_environ,
    metric_value,
    start_server,
    stop_server,
)

__all__ = ["clean_environ"]

pytestmark = pytest.mark.timeout(60)

#: /readyz must be ready again this soon after a kill (the issue's acceptance)
READY_WITHIN_S = 2.0
#: client-side allowance on top of the service's bound (HTTP, JSON, 16 clients on 2 cores)
CLIENT_ALLOWANCE_S = 0.5


@dataclass
class Server:
    proc: Any
    url: str

    @property
    def pid(self) -> int:
        return int(self.proc.pid)


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, comm) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        table[int(entry.name)] = (ppid, comm)
    return table


def descendants(root: int) -> dict[int, str]:
    """pid -> comm of every process below ``root`` (workers are children of the fork server)."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = {}, [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found[child] = table[child][1]
            stack.append(child)
    return found


def fork_server_pid(server: Server) -> int:
    for pid in descendants(server.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in cmdline:
            return pid
    raise AssertionError("no fork server below the service")


def kill(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def ready_body(server: Server) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{server.url}/readyz", timeout=10)
    return response.status_code, response.json()


def workers_in(body: dict[str, Any], state: str) -> list[int]:
    return [w["pid"] for w in body["workers"] if w["state"] == state]


def wait_until_ready(server: Server, killed: list[int], started: float) -> float:
    """Seconds from ``started`` until /readyz is 200 with both workers loaded and none of
    ``killed`` listed; checks on the way that the counts are true (idle never exceeds alive)."""
    while True:
        status, body = ready_body(server)
        assert body["workers_idle"] <= body["workers_alive"], body
        listed = {w["pid"] for w in body["workers"]}
        elapsed = time.monotonic() - started
        if status == 200 and body["workers_alive"] == 2 and not listed & set(killed):
            return elapsed
        if elapsed > 10 * READY_WITHIN_S:
            raise AssertionError(f"not ready {elapsed:.1f} s after the kill: {body}")
        time.sleep(0.02)


def restarts(server: Server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {
        reason: metric_value(text, "kperf_worker_restarts_total", reason=reason)
        for reason in ("idle", "crash", "timeout", "memory")
    }


_counter = [0]


def fresh_problem(**overrides: Any) -> dict[str, Any]:
    """A problem never asked before (the in-memory cache is off too): it needs a worker."""
    _counter[0] += 1
    return {"m": 1000 + _counter[0], "n": 1024, "k": 1024, "device": A6000, **overrides}


def slow_problem(**overrides: Any) -> dict[str, Any]:
    """A solve that keeps a worker busy for about a second (48^3 tile shapes x 8 depths)."""
    _counter[0] += 1
    return {
        "m": 100_003 + _counter[0],
        "n": 99_991,
        "k": 65_537,
        "device": A6000,
        "search_space": SLOW_SPACE,
        # no raster dimensions: 48^3 x 8 stays under the service's space limit
        "memory_model": "dram-stream",
        **overrides,
    }


async def post_all(server: Server, path: str, bodies: list[dict[str, Any]]) -> list[Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:

        async def one(body: dict[str, Any]) -> tuple[httpx.Response, float]:
            started = time.monotonic()
            response = await http.post(path, json=body)
            return response, time.monotonic() - started

        return await asyncio.gather(*(one(b) for b in bodies))


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    proc, url = start_server(
        {
            "KPERF_WORKERS": "2",
            "KPERF_CACHE_MEMORY_ITEMS": "0",
            "KPERF_QUEUE_SIZE": "32",
            # these tests kill workers by the pid /readyz gives
            "KPERF_READYZ_WORKER_PIDS": "true",
        }
    )
    live = Server(proc, url)
    try:
        yield live
    finally:
        below = list(descendants(live.pid))
        stop_server(proc)
        # nothing the service started outlives it
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in below):
            if time.monotonic() > deadline:
                for pid in below:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                raise AssertionError("worker processes outlived the service")
            time.sleep(0.05)


@pytest.fixture
def healthy(server: Server) -> Server:
    """Each test starts from a ready service with two idle workers."""
    wait_until_ready(server, [], time.monotonic())
    return server


def test_idle_worker_killed_is_noticed_replaced_and_costs_no_request(healthy: Server) -> None:
    _, before = ready_body(healthy)
    victim = workers_in(before, "idle")[0]
    counts = restarts(healthy)
    started = time.monotonic()
    kill([victim])
    # the next requests may land where the dead worker was: neither may fail
    answers = asyncio.run(post_all(healthy, "/optimize-tiling", [fresh_problem(), fresh_problem()]))
    assert [r.status_code for r, _ in answers] == [200, 200], [r.text for r, _ in answers]
    assert wait_until_ready(healthy, [victim], started) <= READY_WITHIN_S
    assert restarts(healthy)["idle"] == counts["idle"] + 1


def test_idle_worker_death_is_seen_without_any_request(healthy: Server) -> None:
    _, before = ready_body(healthy)
    victim = workers_in(before, "idle")[0]
    started = time.monotonic()
    kill([victim])
    # no request is sent: the pool's own supervision must notice (not the next job)
    elapsed = wait_until_ready(healthy, [victim], started)
    assert elapsed <= READY_WITHIN_S, elapsed


def test_both_idle_workers_killed_requests_wait_for_the_replacements(healthy: Server) -> None:
    _, before = ready_body(healthy)
    victims = workers_in(before, "idle")
    assert len(victims) == 2
    started = time.monotonic()
    kill(victims)
    answers = asyncio.run(post_all(healthy, "/optimize-tiling", [fresh_problem(), fresh_problem()]))
    assert [r.status_code for r, _ in answers] == [200, 200], [r.text for r, _ in answers]
    assert wait_until_ready(healthy, victims, started) <= READY_WITHIN_S


def _busy_workers(server: Server, count: int, timeout_s: float = 20.0) -> list[int]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        busy = workers_in(ready_body(server)[1], "busy")
        if len(busy) >= count:
            return busy
        time.sleep(0.01)
    raise AssertionError(f"{count} workers never became busy")


async def _kill_when_busy(server: Server, count: int) -> list[int]:
    busy = await asyncio.to_thread(_busy_workers, server, count)
    kill(busy)
    return busy


def test_busy_worker_killed_its_request_is_retried_not_failed(healthy: Server) -> None:
    limit = 8.0  # the retry needs a whole solve after the first attempt died

    async def scenario() -> tuple[list[Any], list[int]]:
        answers = asyncio.ensure_future(
            post_all(healthy, "/optimize-tiling", [slow_problem(time_limit_s=limit)])
        )
        killed = await _kill_when_busy(healthy, 1)
        return await answers, killed

    counts = restarts(healthy)
    started = time.monotonic()
    [(response, elapsed)], killed = asyncio.run(scenario())
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("optimal", "timeout")
    assert elapsed <= limit * 1.2 + 0.1 + CLIENT_ALLOWANCE_S
    wait_until_ready(healthy, killed, started)
    assert restarts(healthy)["crash"] == counts["crash"] + 1


def test_workers_killed_during_a_batch_every_item_still_answers(healthy: Server) -> None:
    problems = [slow_problem(time_limit_s=8.0) for _ in range(3)]

    async def scenario() -> tuple[list[Any], list[int]]:
        answers = asyncio.ensure_future(
            post_all(healthy, "/optimize-tiling/batch", [{"problems": problems}])
        )
        killed = await _kill_when_busy(healthy, 2)
        return await answers, killed

    started = time.monotonic()
    [(response, _)], killed = asyncio.run(scenario())
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["status"] for item in items] == ["ok"] * 3, [item.get("error") for item in items]
    assert wait_until_ready(healthy, killed, started) <= 10 * READY_WITHIN_S


def test_fork_server_killed_workers_keep_serving_and_are_still_replaced(
    healthy: Server,
) -> None:
    # `ps --ppid <service>` lists the fork server, not the workers: killing it must not hurt
    kill([fork_server_pid(healthy)])
    status, body = ready_body(healthy)
    assert status == 200 and body["workers_alive"] == 2
    answers = asyncio.run(post_all(healthy, "/optimize-tiling", [fresh_problem(), fresh_problem()]))
    assert [r.status_code for r, _ in answers] == [200, 200]
    # a replacement now needs a new fork server (which imports Z3 again): slower, still automatic
    victim = workers_in(ready_body(healthy)[1], "idle")[0]
    started = time.monotonic()
    kill([victim])
    answers = asyncio.run(post_all(healthy, "/optimize-tiling", [fresh_problem()]))
    assert [r.status_code for r, _ in answers] == [200]
    wait_until_ready(healthy, [victim], started)
    fork_server_pid(healthy)  # a new one runs


def test_burst_of_short_limits_kills_no_worker_and_counts_timeouts(healthy: Server) -> None:
    limits = [round(0.1 + 0.4 * i / 15, 3) for i in range(16)]
    # half of them can finish in time (small default space), half cannot (48^3 x 8 tilings)
    bodies = [
        (slow_problem if i % 2 else fresh_problem)(time_limit_s=limit)
        for i, limit in enumerate(limits)
    ]
    workers_before = {w["pid"] for w in ready_body(healthy)[1]["workers"]}
    text = httpx.get(f"{healthy.url}/metrics", timeout=10).text

    def count(outcome: str) -> float:
        return metric_value(
            text, "kperf_solve_duration_seconds_count", kind="optimize-tiling", outcome=outcome
        )

    outcomes_before = {o: count(o) for o in ("ok", "partial", "timeout", "crash", "error")}
    deadline_before = metric_value(text, "kperf_rejected_requests_total", reason="deadline")
    restarts_before = restarts(healthy)

    answers = asyncio.run(post_all(healthy, "/optimize-tiling", bodies))

    statuses = [r.status_code for r, _ in answers]
    assert set(statuses) <= {200, 504}, [r.text for r, _ in answers]
    not_started = 0
    for limit, (response, elapsed) in zip(limits, answers, strict=True):
        bound_s = limit * 1.2 + 0.1
        server_s = float(response.headers["server-timing"].split("dur=")[1]) / 1000
        assert server_s <= bound_s + 0.02, (limit, server_s, response.text)
        assert elapsed <= bound_s + CLIENT_ALLOWANCE_S, (limit, elapsed)
        if response.status_code == 504:
            problem = response.json()
            # the client's limit, not what was left of it when (if) a job started
            assert f"{limit} s" in problem["detail"], problem["detail"]
            assert problem["errors"][0]["field"] == "time_limit_s"
            not_started += "not started" in problem["detail"]
    assert restarts(healthy) == restarts_before, "a worker was killed"
    assert {w["pid"] for w in ready_body(healthy)[1]["workers"]} == workers_before
    text = httpx.get(f"{healthy.url}/metrics", timeout=10).text
    delta = {o: count(o) - before for o, before in outcomes_before.items()}
    partial = sum(r.status_code == 200 and r.json()["status"] == "timeout" for r, _ in answers)
    assert delta["timeout"] == statuses.count(504)
    assert delta["partial"] == partial
    assert delta["ok"] == statuses.count(200) - partial
    assert delta["crash"] == delta["error"] == 0
    deadline_after = metric_value(text, "kperf_rejected_requests_total", reason="deadline")
    assert deadline_after - deadline_before == not_started
