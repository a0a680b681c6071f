"""The Triton plug-in against ``kperf serve`` on 127.0.0.1, driven by the real ``triton``
package on the CPU: real ``triton.Config`` objects and a real ``Autotuner`` around a real
``@triton.jit`` kernel. The kernel's launch is the one thing replaced (no GPU): its ``run``
records the meta-parameters and ``do_bench`` turns them into a time, so Triton itself prunes,
benchmarks and calls the listener with its own argument names."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
import pytest

from kperf_client.triton import KperfTriton
from tests.app.service_helpers import clean_environ, free_port, live_server
from tests.kperf_client.conftest import SERVER_SIDE, loaded_on_import, warnings_of

__all__ = ["clean_environ", "live_server"]

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

LOGGER = "kperf_client.triton"
A6000 = "rtx-a6000"


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    tl.program_id(axis=0)


def config(m: int, n: int, k: int, stages: int, warps: int = 4) -> Any:
    kwargs = {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": 8}
    return triton.Config(kwargs, num_stages=stages, num_warps=warps)


#: 8 tilings x 2 num_warps (groups of two), one tiling no GPU's shared memory holds
#: (8 x (256 x 256 + 256 x 256) x 2 bytes = 2 MiB) and one config without tile sizes
CONFIGS = [
    config(m, n, k, stages, warps)
    for m, n, k, stages in [
        (128, 128, 32, 3),
        (128, 64, 32, 4),
        (64, 128, 64, 3),
        (64, 64, 32, 2),
        (128, 256, 64, 3),
        (256, 128, 32, 4),
        (32, 32, 32, 2),
        (64, 32, 64, 5),
    ]
    for warps in (4, 8)
] + [config(256, 256, 256, 8), triton.Config({"GROUP_SIZE_M": 8}, num_stages=3)]


def depth_on(device: str, num_stages: int) -> int:
    """Shared-memory stage buffers Triton 3.9 allocates for num_stages (docs/model-notes.md,
    measured off its compiler and rechecked by test_triton_configs.py): num_stages on sm_90
    (h100 and its calibrations), num_stages - 1 on sm_8x (rtx-a6000 8.6, a100 8.0)."""
    return num_stages if device.startswith("h100") else max(1, num_stages - 1)


def tiling(cfg: Any, device: str = A6000) -> tuple[int, int, int, int] | None:
    kw = cfg.kwargs
    if "BLOCK_SIZE_M" not in kw:
        return None
    depth = depth_on(device, cfg.num_stages)
    return (kw["BLOCK_SIZE_M"], kw["BLOCK_SIZE_N"], kw["BLOCK_SIZE_K"], depth)


def tensors(dtype: Any = np.float16) -> tuple[Any, Any, Any]:
    return np.zeros((2, 2), dtype), np.zeros((2, 2), dtype), np.zeros((2, 2), np.float32)


def autotuner(prune: Any, do_bench: Any = None) -> Any:
    return triton.autotune(
        configs=CONFIGS,
        key=["M", "N", "K"],
        prune_configs_by={"early_config_prune": prune},
        do_bench=do_bench,
    )(matmul_kernel)


def prune_as_triton_does(tuner: Any, args: tuple[Any, ...], **kwargs: Any) -> list[Any]:
    """What ``Autotuner.run`` does before benchmarking: nargs by name, then prune_configs."""
    tuner.nargs = dict(zip(tuner.arg_names, args, strict=False))
    kept: list[Any] = tuner.prune_configs(kwargs)
    tuner.nargs = None
    return kept


def server_ranking(url: str, problem: dict[str, Any], device: str) -> dict[str, Any]:
    """The service's answer for CONFIGS' tilings, asked independently of the plug-in."""
    candidates = [
        dict(zip(("tile_m", "tile_n", "tile_k", "buffer_depth"), t, strict=True))
        for t in (tiling(c, device) for c in CONFIGS)
        if t is not None
    ]
    body = {**problem, "device": device, "candidates": candidates}
    answer = httpx.post(f"{url}/optimize-tiling", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def expected_kept(
    answer: dict[str, Any], top_k: int | None = None, mass: float | None = None
) -> list[Any]:
    """Groups of equal tiling in the service's rank order, cut by top_k or by the mass of
    probability_best, expanded to their configs (request order), then the unjudged config.
    (Tilings compare equal on any device: CONFIGS has one num_stages per tile triple.)"""
    judged = [t for t in map(tiling, CONFIGS) if t is not None]
    groups: list[tuple[int, int, int, int]] = []
    total = 0.0
    for entry in sorted(answer["candidates"], key=lambda e: e["rank"]):
        group = judged[entry["input_index"]]
        if group in groups:
            continue
        if (top_k is not None and len(groups) == top_k) or (mass is not None and total >= mass):
            break
        groups.append(group)
        total += entry["probability_best"]
    kept = [c for g in groups for c in CONFIGS if tiling(c) == g]
    return kept + [c for c in CONFIGS if tiling(c) is None]


def new_session(made: list[KperfTriton], url: str, device: str, **options: Any) -> KperfTriton:
    options.setdefault("timeout_s", 30.0)  # generous: the machine is shared under tests
    session = KperfTriton(url, device, **options)
    made.append(session)
    return session


def kperf_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return warnings_of(caplog, LOGGER)


# ---------------------------------------------------------------- prune: the server's ranking


@pytest.mark.parametrize(("top_k", "mass"), [(3, None), (1, None), (None, 0.8)])
def test_prune_keeps_the_servers_first_groups(
    live_server: str,
    sessions: list[KperfTriton],
    caplog: pytest.LogCaptureFixture,
    top_k: int | None,
    mass: float | None,
) -> None:
    session = new_session(sessions, live_server, A6000)
    tuner = autotuner(session.prune(top_k=top_k, probability_mass=mass))
    a, b, c = tensors()
    kept = prune_as_triton_does(tuner, (a, b, c, 4096, 2048, 1024), grid=(1,))
    answer = server_ranking(live_server, {"m": 4096, "n": 2048, "k": 1024, "dtype": "fp16"}, A6000)
    assert kept == expected_kept(answer, top_k, mass)
    # the infeasible tiling is dropped, groups are whole, the unjudged config stays
    assert config(256, 256, 256, 8) not in kept
    assert any(i["input_index"] == 16 for i in answer["infeasible"])
    assert kperf_warnings(caplog) == []


def test_prune_reads_the_dtype_and_caches_answers(
    live_server: str, sessions: list[KperfTriton], monkeypatch: pytest.MonkeyPatch
) -> None:
    session = new_session(sessions, live_server, A6000)
    tuner = autotuner(session.prune(top_k=2))
    a, b, c = tensors(np.float32)
    problem = {"m": 1000, "n": 3000, "k": 500, "dtype": "fp32"}
    kept = prune_as_triton_does(tuner, (a, b, c, 1000, 3000, 500))
    assert kept == expected_kept(server_ranking(live_server, problem, A6000), top_k=2)
    # the same (M, N, K, dtype) again: answered from the process' cache, no request
    asked: list[Any] = []
    original = session.portal.call

    def counted(*args: Any) -> Any:
        asked.append(args)
        return original(*args)

    monkeypatch.setattr(session.portal, "call", counted)
    assert prune_as_triton_does(tuner, (a, b, c, 1000, 3000, 500)) == kept
    assert asked == []
    # M, N, K passed by keyword reach the prune function through Triton's kwargs
    tuner.nargs = dict(zip(tuner.arg_names, (a, b, c), strict=False))
    assert tuner.prune_configs({"M": 1000, "N": 3000, "K": 500}) == kept


def test_prune_inside_a_running_event_loop(live_server: str, sessions: list[KperfTriton]) -> None:
    """A caller with its own loop (Jupyter, an async trainer): no loop conflict."""
    session = new_session(sessions, live_server, A6000)
    tuner = autotuner(session.prune(top_k=2))
    a, b, c = tensors()

    async def main() -> list[Any]:
        return prune_as_triton_does(tuner, (a, b, c, 2048, 2048, 2048))

    kept = asyncio.run(main())
    problem = {"m": 2048, "n": 2048, "k": 2048, "dtype": "fp16"}
    assert kept == expected_kept(server_ranking(live_server, problem, A6000), top_k=2)


# ---------------------------------------------------------------- prune: never fails the kernel


@pytest.mark.parametrize("trouble", ["down", "slow", "refused"])
def test_trouble_keeps_every_config_with_one_warning(
    trouble: str,
    request: pytest.FixtureRequest,
    sessions: list[KperfTriton],
    caplog: pytest.LogCaptureFixture,
) -> None:
    if trouble == "down":
        url, device = f"http://127.0.0.1:{free_port()}", A6000  # nothing listens
    elif trouble == "slow":
        url, device = request.getfixturevalue("silent_server"), A6000
    else:  # a 4xx: no such device
        url, device = request.getfixturevalue("live_server"), "no-such-gpu"
    session = new_session(sessions, url, device, timeout_s=0.5, retry_after_s=0)
    tuner = autotuner(session.prune(top_k=1))
    a, b, c = tensors()
    started = time.monotonic()
    for shape in (512, 1024):  # two shapes: two failed asks, still one warning
        assert prune_as_triton_does(tuner, (a, b, c, shape, shape, shape)) == CONFIGS
    assert time.monotonic() - started < 2 * 0.5 + 2.0  # bounded by the timeout
    warnings = kperf_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "keeping all" in warnings[0]
    if trouble == "refused":
        assert "404" in warnings[0] or "422" in warnings[0]


def test_a_call_without_m_n_k_keeps_every_config(
    sessions: list[KperfTriton], caplog: pytest.LogCaptureFixture
) -> None:
    session = new_session(sessions, f"http://127.0.0.1:{free_port()}", A6000)
    tuner = autotuner(session.prune(top_k=1))
    tuner.nargs = {"a_ptr": None}
    assert tuner.prune_configs({}) == CONFIGS
    (warning,) = kperf_warnings(caplog)
    assert "M: no such kernel argument" in warning


# ---------------------------------------------------------------- listener: Triton's timings


class FakeLaunch:
    """Stands in for the GPU: ``run`` records what Triton launches, ``do_bench`` times it
    with a made-up but deterministic device, in ms as Triton's benchmarker reports."""

    def __init__(self) -> None:
        self.launched: list[dict[str, Any]] = []

    def run(self, *args: Any, **kwargs: Any) -> None:
        self.launched.append({**dict(zip(matmul_kernel.arg_names, args, strict=False)), **kwargs})

    def do_bench(self, kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        kw = self.launched[-1]
        m, n, k = kw["M"], kw["N"], kw["K"]
        # (the config without tile sizes would not compile; here it runs with 16 x 16 tiles)
        tm, tn = kw.get("BLOCK_SIZE_M", 16), kw.get("BLOCK_SIZE_N", 16)
        time_ms = 1e-9 * m * n * k * (1 + 64 / tm + 64 / tn)
        time_ms += 0.004 * kw["num_stages"] + (0.01 if kw["num_warps"] == 4 else 0.0)
        return [time_ms, 0.9 * time_ms, 1.1 * time_ms]


def time_ms_of(launch: FakeLaunch, cfg: Any, m: int, n: int, k: int) -> float:
    launch.launched.append({"M": m, "N": n, "K": k, **cfg.all_kwargs()})
    return launch.do_bench(lambda: None, None)[0]


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> FakeLaunch:
    fake = FakeLaunch()
    monkeypatch.setattr(matmul_kernel, "run", fake.run)
    return fake


@pytest.fixture
def previous_listener(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A listener installed before ours (it must still be called)."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(triton.knobs.autotuning, "listener", lambda **kw: seen.append(kw))
    return seen


def recorded_runs(url: str, device: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/devices/{device}/measurements", timeout=30)
    assert answer.status_code == 200, answer.text
    runs: list[dict[str, Any]] = answer.json()["gemm_ws"]
    return runs


def key_of(run: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(run[f] for f in ("m", "n", "k", "dtype", "tile_m", "tile_n", "tile_k"))


def test_listener_posts_triton_timings_and_recalibrates(
    live_server: str,
    sessions: list[KperfTriton],
    launch: FakeLaunch,
    previous_listener: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    device = "h100"  # no other test posts runs to it
    session = new_session(sessions, live_server, device)
    tuner = autotuner(session.prune(top_k=3), do_bench=launch.do_bench)
    listener = session.install_listener(recalibrate_every=5, max_delay_s=0.05)
    try:
        a, b, c = tensors()
        tuner.run(a, b, c, 4096, 4096, 4096, grid=(1,))  # Triton prunes, benchmarks, calls
        session.flush()
        first = dict(previous_listener[0])
        timed = first["configs_timings"]
        # one run per tiling of what Triton benchmarked, its fastest config, ms -> us
        expected: dict[tuple[Any, ...], float] = {}
        for cfg in timed:
            t = tiling(cfg, device)
            if t is None:  # the config without tile sizes: kept and benchmarked, not a run
                continue
            run_key = (4096, 4096, 4096, "fp16", *t)
            expected[run_key] = min(expected.get(run_key, 1e30), 1000 * timed[cfg][0])
        runs = recorded_runs(live_server, device)
        assert {key_of(r) + (r["buffer_depth"],): r["measured_time_us"] for r in runs} == (
            pytest.approx(expected)
        )
        assert len(runs) == 3 == len(expected)  # top_k=3 groups
        detail = httpx.get(f"{live_server}/devices/{device}", timeout=30).json()
        assert detail["history"]["recorded_runs"] == 3
        assert session.device == device and session.feedback is not None
        assert session.feedback.recalibrations == 0

        # a second shape: 6 runs in all, past recalibrate_every: the device is refit
        tuner.run(a, b, c, 2048, 8192, 1024, grid=(1,))
        session.flush()
        assert session.feedback.recalibrations == 1
        calibrated = session.device
        assert calibrated != device
        detail = httpx.get(f"{live_server}/devices/{calibrated}", timeout=30).json()
        assert detail["history"]["fit_measurement_count"] == 6
        # the refit profile's record: every run posted for the device so far
        all_runs = recorded_runs(live_server, device)
        assert len(all_runs) == 6
        assert sorted(map(key_of, recorded_runs(live_server, calibrated))) == sorted(
            map(key_of, all_runs)
        )

        # the next shape is pruned with the calibrated profile's ranking
        kept_next = prune_as_triton_does(tuner, (a, b, c, 1024, 1024, 4096))
        answer = server_ranking(
            live_server, {"m": 1024, "n": 1024, "k": 4096, "dtype": "fp16"}, calibrated
        )  # (a calibration of h100: sm_90 depths)
        assert kept_next == expected_kept(answer, top_k=3)
        assert len(previous_listener) == 2  # the listener installed before ours, chained
        assert kperf_warnings(caplog) == []
    finally:
        listener.uninstall()
    assert triton.knobs.autotuning.listener is not listener


def test_listener_never_raises_when_the_service_is_down(
    sessions: list[KperfTriton],
    launch: FakeLaunch,
    previous_listener: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = new_session(
        sessions, f"http://127.0.0.1:{free_port()}", A6000, timeout_s=0.5, retry_after_s=60
    )
    tuner = autotuner(session.prune(top_k=1), do_bench=launch.do_bench)
    listener = session.install_listener(max_delay_s=0.05)
    try:
        a, b, c = tensors()
        tuner.run(a, b, c, 512, 512, 512, grid=(1,))  # every config benchmarked
        assert len(previous_listener[0]["configs_timings"]) == len(CONFIGS)
        assert not session.flush(timeout_s=5)
        tuner.run(a, b, c, 1024, 1024, 1024, grid=(1,))  # and again: no new warning
        assert not session.flush(timeout_s=5)
        # the prune function and the feedback each say so once
        warnings = kperf_warnings(caplog)
        assert len(warnings) == 2, warnings
        assert "keeping all" in warnings[0] and "not posted" in warnings[1]
        assert session.feedback is not None and session.feedback.posted == 0
    finally:
        listener.uninstall()


def test_listener_from_the_key_without_our_prune(
    live_server: str, sessions: list[KperfTriton], launch: FakeLaunch
) -> None:
    """A kernel tuned without the prune function: the GEMM comes from Triton's key."""
    device = "a100"  # no other test posts runs to it
    session = new_session(sessions, live_server, device)
    listener = session.install_listener(key_names=["M", "N", "K"], max_delay_s=0.05)
    benchmarked = CONFIGS[:4]  # two tilings, two num_warps each
    try:
        tuner = autotuner(lambda configs, named_args, **kw: benchmarked, do_bench=launch.do_bench)
        a, b, c = tensors(np.float32)
        tuner.run(a, b, c, 768, 640, 512, grid=(1,))
        session.flush()
        runs = {
            (key_of(r), r["buffer_depth"]): r["measured_time_us"]
            for r in recorded_runs(live_server, device)
        }
        expected = {}
        for cfg in benchmarked:
            t = tiling(cfg, device)
            assert t is not None
            fastest_ms = min(
                time_ms_of(launch, other, 768, 640, 512)
                for other in benchmarked
                if tiling(other, device) == t
            )
            expected[((768, 640, 512, "fp32", *t[:3]), t[3])] = 1000 * fastest_ms
        assert len(expected) == 2 and runs == pytest.approx(expected)
    finally:
        listener.uninstall()


def test_importing_the_plugin_loads_no_triton_and_nothing_of_the_server() -> None:
    """triton loads when a listener is installed, not on import (a prune function alone never
    loads it), and nothing of the server or its dependencies comes with the plug-in."""
    assert loaded_on_import("kperf_client.triton", ("triton", *SERVER_SIDE)) == []


class _OldListenerProtocol:
    def __call__(self, *, fn: Any, key: Any, best_config: Any) -> None: ...


@pytest.mark.parametrize("triton_lacks", ["the hook", "configs_timings"])
def test_a_triton_without_the_listener_contract_is_not_hooked(
    triton_lacks: str,
    sessions: list[KperfTriton],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The installed Triton's contract is checked, not assumed: no hook, or a listener
    protocol without configs_timings, leaves Triton as it was, with one warning."""
    if triton_lacks == "the hook":
        monkeypatch.setattr(triton.knobs, "autotuning", object())
    else:
        monkeypatch.setattr(triton.knobs, "AutotuneListener", _OldListenerProtocol)
    before = getattr(triton.knobs.autotuning, "listener", "absent")
    session = new_session(sessions, f"http://127.0.0.1:{free_port()}", A6000)
    listener = session.listener()
    assert listener.install() is False and not listener.installed
    assert getattr(triton.knobs.autotuning, "listener", "absent") is before
    (warning,) = kperf_warnings(caplog)
    assert "listener not installed" in warning


def test_a_candidate_the_service_refuses_is_kept_unjudged(
    live_server: str, sessions: list[KperfTriton], caplog: pytest.LogCaptureFixture
) -> None:
    """A config whose params the request schema refuses (over 1 KiB of JSON) is left out of
    the ranking, not the whole ranking: it is kept, unjudged, after the ranked groups."""
    kwargs = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 8}
    big = triton.Config({**kwargs, "NOTE": "x" * 2000}, num_stages=3)
    session = new_session(sessions, live_server, A6000)
    tuner = triton.autotune(
        configs=[*CONFIGS[:-1], big, CONFIGS[-1]],
        key=["M", "N", "K"],
        prune_configs_by={"early_config_prune": session.prune(top_k=2)},
    )(matmul_kernel)
    a, b, c = tensors()
    kept = prune_as_triton_does(tuner, (a, b, c, 3072, 3072, 3072))
    answer = server_ranking(live_server, {"m": 3072, "n": 3072, "k": 3072, "dtype": "fp16"}, A6000)
    ranked_groups = expected_kept(answer, top_k=2)[:-1]
    assert kept == [*ranked_groups, big, CONFIGS[-1]]
    assert kperf_warnings(caplog) == []


def test_a_full_batch_is_posted_in_the_background(
    live_server: str, sessions: list[KperfTriton], launch: FakeLaunch
) -> None:
    """No flush asked: batch_size waiting configs post themselves from the loop thread."""
    device = "v100"  # no other test posts runs to it; sm_70: one buffer whatever num_stages
    session = new_session(sessions, live_server, device)
    listener = session.install_listener(key_names=["M", "N", "K"], batch_size=2, max_delay_s=600)
    try:
        tuner = autotuner(lambda configs, named_args, **kw: CONFIGS[:2], do_bench=launch.do_bench)
        a, b, c = tensors()
        tuner.run(a, b, c, 640, 640, 640, grid=(1,))
        deadline = time.monotonic() + 20
        while not recorded_runs(live_server, device) and time.monotonic() < deadline:
            time.sleep(0.05)
        (run,) = recorded_runs(live_server, device)  # two num_warps of one tiling: one run
        assert (run["tile_m"], run["tile_n"], run["tile_k"], run["buffer_depth"]) == (
            128,
            128,
            32,
            1,
        )
    finally:
        listener.uninstall()
