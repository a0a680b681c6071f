"""Hopper instructions: their classes, "uncosted" without device figures (warned, never a
silent zero), costed when a profile carries cited figures, and warp-specialized kernels
evaluated per warp role, bounded by the slowest."""

from __future__ import annotations

import pytest

from device_profiles import DeviceProfile, get_profile
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel
from perfmodel.manybsp.classify import classify
from perfmodel.manybsp.frontend import UNCOSTED
from perfmodel.ptx import parse_module
from tests.nvcc_entries import ENTRY_GRIDS, NVCC_DIR, REGISTERS_PER_THREAD, entries

MX = device_from_profile(get_profile("940mx"))

HEAD = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p)
.maxntid 256, 1, 1
{
.reg .pred %p<4>; .reg .b32 %r<40>; .reg .f32 %f<80>; .reg .b64 %rd<8>;
"""

# one line per Hopper family (PTX ISA 8.x syntax) and the class it belongs to
HOPPER = [
    (
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f1, %f2, %f3, %f4}, %rd1, %rd2, "
        "1, 1, 1, 0, 0",
        "wgmma_mma_async",
    ),
    ("wgmma.fence.sync.aligned", "wgmma_sync"),
    ("wgmma.commit_group.sync.aligned", "wgmma_sync"),
    ("wgmma.wait_group.sync.aligned 1", "wgmma_sync"),
    (
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%r1], [%rd1, {%r2, %r3}], [%r4]",
        "tma_copy",
    ),
    ("cp.async.bulk.commit_group", "tma_copy"),
    ("cp.async.bulk.wait_group.read 0", "tma_copy"),
    ("mbarrier.init.shared::cta.b64 [%r1], 1", "mbarrier"),
    ("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r1], 8192", "mbarrier"),
    ("mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1], %r2, %r3", "mbarrier"),
    ("setmaxnreg.inc.sync.aligned.u32 232", "setmaxnreg"),
    ("fence.proxy.async.shared::cta", "fence_proxy_async"),
    ("elect.sync %r5|%p2, -1", "elect_sync"),
    ("mov.u32 %r6, %cluster_ctarank", "cluster_special_register"),
    ("mapa.shared::cluster.u32 %r7, %r1, %r6", "cluster_shared_address"),
    ("barrier.cluster.arrive", "barrier_cluster"),
]


def module(lines: list[str]) -> str:
    return HEAD + "".join(f"{ln};\n" for ln in lines) + "ret;\n}\n"


@pytest.mark.parametrize(
    ("line", "expected"), HOPPER, ids=[h[1] + str(i) for i, h in enumerate(HOPPER)]
)
def test_hopper_families_have_their_own_class(line: str, expected: str) -> None:
    c = classify(parse_module(module([line])).entry(None).instructions[0])
    assert c is not None and c.class_key == expected and c.uncosted_without_figures


@pytest.mark.parametrize(
    ("line", "key", "matrices"),
    [
        ("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%r1, %r2, %r3, %r4}, [%r5]", "ld_shared", 4),
        ("ldmatrix.sync.aligned.x1.trans.m8n8.shared.b16 {%r1}, [%r5]", "ld_shared", 1),
        ("stmatrix.sync.aligned.x2.m8n8.shared.b16 [%r5], {%r1, %r2}", "st_shared", 2),
    ],
)
def test_ldmatrix_stmatrix_take_one_shared_transaction_per_matrix(line, key, matrices) -> None:
    # PTX ISA: .xN moves N 8x8 .b16 matrices, 128 bytes each = one 32-bank access
    result = predict_kernel(_req(module([line])))
    (i,) = [k for k, c in enumerate(result.costs) if c.opcode.startswith(line.split()[0])]
    assert result.class_keys[i] == key and result.costs[i].n_ma == matrices
    assert not result.n_ma_inferred[i]


def _req(ptx: str, **kw: object) -> PredictRequest:
    base: dict[str, object] = {"ptx": ptx, "device": MX, "grid": (8, 1, 1)}
    base.update(block=(256, 1, 1), registers_per_thread=32)
    base.update(kw)
    return PredictRequest(**base)  # type: ignore[arg-type]


def test_without_figures_hopper_instructions_are_uncosted_and_named_in_a_warning() -> None:
    lines = [h[0] for h in HOPPER]
    result = predict_kernel(_req(module(["add.s32 %r9, %r9, 1", *lines])))
    hopper = [k for k, c in enumerate(result.costs) if c.line >= 9]  # after add (line 8)
    assert len(hopper) == len(HOPPER)
    for k in hopper:
        c, row = result.costs[k], result.rows[k]
        assert result.class_keys[k] == UNCOSTED
        # no unit occupancy, comm or wait is invented for it ...
        assert row.fu_cycles == (0.0, 0.0, 0.0, 0.0) and row.comm_cycles == 0.0
        assert row.sync_cycles == 0.0
        # ... it only takes its issue slot, and a warning names its opcode and line
        assert row.issue_cycles > 0
        assert any(
            w.startswith(f"uncosted: {c.opcode} ") and str(c.line) in w for w in result.warnings
        )


def _with_classes(**classes: dict[str, object]) -> PredictRequest:
    raw = get_profile("940mx").model_dump()
    raw["many_bsp"]["instruction_classes"].update(classes)
    figs = device_from_profile(DeviceProfile.model_validate(raw), field_prefix="device_params")
    lines = [
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f1, %f2, %f3, %f4}, %rd1, %rd2, "
        "1, 1, 1, 0, 0",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        + ", ".join(f"%f{k}" for k in range(5, 69))
        + "}, %rd1, %rd2, 1, 1, 1, 0, 0",
    ]
    return _req(module(lines), device=figs)


def test_a_profile_with_figures_costs_wgmma_in_proportion_to_n() -> None:
    fig = {"fu": "SPs", "units_per_ws": 32, "throughput_per_ws": 8.0, "latency_cycles": 30.0}
    result = predict_kernel(_with_classes(wgmma_mma_async={**fig, "source": "test figure"}))
    n8, n128 = [k for k, c in enumerate(result.costs) if c.opcode.startswith("wgmma")]
    assert result.class_keys[n8] == result.class_keys[n128] == "wgmma_mma_async"
    # a warp's share of m64nNk16 is N/8 times the m64n8k16 work the figure is for
    assert result.costs[n8].throughput_per_ws == 8.0
    assert result.costs[n128].throughput_per_ws == pytest.approx(8.0 * 8 / 128)
    assert not any("uncosted" in w and "wgmma.mma_async" in w for w in result.warnings)


# ---- warp-specialized kernels: one evaluation per role, bounded by the slowest

PINGPONG = NVCC_DIR / "cutlass_ws_gemm.pingpong_64x128x64.sm_90a.ptx"


@pytest.fixture(scope="module")
def pingpong():
    text = PINGPONG.read_text()
    return predict_kernel(_req(text, block=(384, 1, 1), registers_per_thread=168))


def test_every_warp_is_in_exactly_one_role(pingpong) -> None:
    warps = sorted(w for r in pingpong.roles for w in r.warps)
    assert warps == list(range(12))
    assert sum(r.threads for r in pingpong.roles) == 384


def test_the_kernel_answer_is_its_slowest_role(pingpong) -> None:
    (bound,) = [r for r in pingpong.roles if r.bounds_kernel]
    slowest = max(r.estimate.kernel_exec_cycle for r in pingpong.roles)
    assert bound.estimate.kernel_exec_cycle == slowest == pingpong.estimate.kernel_exec_cycle
    assert pingpong.costs == bound.costs  # the instruction table reported is that role's


def test_roles_model_only_their_own_path(pingpong) -> None:
    def opcodes(role):
        return {".".join(c.opcode.split(".")[:2]) for c in role.costs}

    mma = [r for r in pingpong.roles if "wgmma.mma_async" in opcodes(r)]
    assert sorted(w for r in mma for w in r.warps) == list(range(4, 12))  # the consumers
    # the producer warp group's roles are shorter than the consumers' paths
    producer = [r for r in pingpong.roles if max(r.warps) < 4]
    assert producer and all(len(p.costs) < min(len(m.costs) for m in mma) for p in producer)


def test_an_spmd_kernel_reports_no_roles() -> None:
    text = (NVCC_DIR / "matmul_tiled.sm_75.ptx").read_text()
    result = predict_kernel(_req(text, kernel="matmul_tiled", block=(16, 16, 1)))
    assert result.roles == ()


# ---- every fixture entry: predictions grow with the grid (eq. (22)-(25): n_b / n_sm rounds)


@pytest.mark.parametrize(("fixture", "entry", "block"), entries(), ids=lambda v: str(v)[:40])
def test_predictions_grow_with_the_grid(fixture, entry, block) -> None:
    text = (NVCC_DIR / fixture).read_text()
    cycles = [
        predict_kernel(
            _req(
                text,
                kernel=entry,
                grid=grid,
                block=block,
                registers_per_thread=REGISTERS_PER_THREAD,
            )
        ).estimate.kernel_exec_cycle
        for grid in ENTRY_GRIDS
    ]
    assert all(a < b for a, b in zip(cycles, cycles[1:], strict=False)), cycles


def test_ptxas_runs_once_per_module_and_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfmodel.manybsp import ptxas

    calls: list[tuple[str, str]] = []

    def fake_run(exe: str, ptx: str, kernel: str, target: str) -> int | None:
        calls.append((exe, target))
        return None if target == "sm_90a" else 40  # as if this ptxas lacked sm_90a

    monkeypatch.setattr(ptxas, "_run", fake_run)
    ptxas._registers.cache_clear()
    monkeypatch.setattr("shutil.which", lambda name: "/opt/a/ptxas")
    text = module(["add.s32 %r1, %r1, 1"])
    assert ptxas.ptxas_registers(text, "k", "sm_90a") == (40, ptxas.FALLBACK_TARGET)
    assert ptxas.ptxas_registers(text, "k", "sm_90a") == (40, ptxas.FALLBACK_TARGET)
    assert calls == [("/opt/a/ptxas", "sm_90a"), ("/opt/a/ptxas", ptxas.FALLBACK_TARGET)]
    # another module, or another ptxas, is compiled again
    ptxas.ptxas_registers(text + "\n", "k", "sm_90a")
    monkeypatch.setattr("shutil.which", lambda name: "/opt/b/ptxas")
    ptxas.ptxas_registers(text, "k", "sm_90a")
    assert len(calls) == 6
    ptxas._registers.cache_clear()
