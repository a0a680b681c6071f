"""Acceptance 3: predictions move the right way. More blocks, more loop iterations,
uncoalesced instead of coalesced accesses and more barriers each increase predicted cycles.
Hypothesis draws the kernel shape; the property is checked on the whole pipeline."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from device_profiles import get_profile
from perfmodel.manybsp import PredictRequest, device_from_profile, predict_kernel

DEVICES = {d: device_from_profile(get_profile(d)) for d in ("gtx-760", "940mx")}


def kernel_ptx(stride_bytes: int = 4, barriers: int = 1, body_flops: int = 2) -> str:
    """A loop that loads a[tid * stride], accumulates, syncs ``barriers`` times per trip."""
    flops = "\n".join("\tfma.rn.f32 %f2, %f1, %f1, %f2;" for _ in range(body_flops))
    bars = "\n".join("\tbar.sync 0;" for _ in range(barriers))
    return f""".version 7.0
.target sm_70
.address_size 64

.visible .entry k(
\t.param .u64 k_param_0,
\t.param .u32 k_param_1
)
{{
\t.reg .pred %p<2>;
\t.reg .b32 %r<6>;
\t.reg .f32 %f<4>;
\t.reg .b64 %rd<6>;

\tld.param.u64 %rd1, [k_param_0];
\tld.param.u32 %r1, [k_param_1];
\tcvta.to.global.u64 %rd2, %rd1;
\tmov.u32 %r2, %tid.x;
\tmul.wide.u32 %rd3, %r2, {stride_bytes};
\tadd.s64 %rd4, %rd2, %rd3;
\tmov.f32 %f2, 0f00000000;
\tmov.u32 %r3, 0;
LOOP:
\tld.global.f32 %f1, [%rd4];
{flops}
{bars}
\tadd.s32 %r3, %r3, 1;
\tsetp.lt.s32 %p1, %r3, %r1;
\t@%p1 bra LOOP;
\tst.global.f32 [%rd4], %f2;
\tret;
}}
"""


def cycles(
    ptx: str, *, device: str = "gtx-760", blocks: int = 64, trips: int = 4, threads: int = 256
) -> float:
    req = PredictRequest(
        ptx=ptx,
        device=DEVICES[device],
        grid=(blocks, 1, 1),
        block=(threads, 1, 1),
        registers_per_thread=16,
        shared_bytes_per_block=0,
        loop_trip_counts={"LOOP": trips},
    )
    return predict_kernel(req).estimate.kernel_exec_cycle


devices = st.sampled_from(sorted(DEVICES))
threads = st.sampled_from([64, 128, 256, 512, 1024])


@settings(max_examples=25, deadline=None)
@given(devices, threads, st.integers(1, 2000), st.integers(1, 2000))
def test_more_blocks_cost_more(device: str, n_t: int, a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    ptx = kernel_ptx()
    if lo == hi:
        return
    assert cycles(ptx, device=device, blocks=hi, threads=n_t) > cycles(
        ptx, device=device, blocks=lo, threads=n_t
    )


@settings(max_examples=25, deadline=None)
@given(devices, threads, st.integers(1, 200), st.integers(1, 200))
def test_more_iterations_cost_more(device: str, n_t: int, a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    if lo == hi:
        return
    ptx = kernel_ptx()
    assert cycles(ptx, device=device, trips=hi, threads=n_t) > cycles(
        ptx, device=device, trips=lo, threads=n_t
    )


@settings(max_examples=25, deadline=None)
@given(devices, threads, st.sampled_from([8, 16, 32, 64, 128, 256, 1024]), st.integers(1, 50))
def test_uncoalesced_costs_more_than_coalesced(
    device: str, n_t: int, stride: int, trips: int
) -> None:
    coalesced = cycles(kernel_ptx(stride_bytes=4), device=device, threads=n_t, trips=trips)
    strided = cycles(kernel_ptx(stride_bytes=stride), device=device, threads=n_t, trips=trips)
    assert strided > coalesced


@settings(max_examples=25, deadline=None)
@given(devices, threads, st.integers(0, 6), st.integers(0, 6), st.integers(1, 20))
def test_more_barriers_cost_more(device: str, n_t: int, a: int, b: int, trips: int) -> None:
    lo, hi = sorted((a, b))
    if lo == hi:
        return
    few = cycles(kernel_ptx(barriers=lo), device=device, threads=n_t, trips=trips)
    many = cycles(kernel_ptx(barriers=hi), device=device, threads=n_t, trips=trips)
    assert many > few


def test_stride_sets_n_ma_against_segment_count() -> None:
    """Independent count: segments of 128 B touched by 32 threads ``stride`` bytes apart."""
    for stride in (0, 4, 8, 16, 64, 128, 256):
        req = PredictRequest(
            ptx=kernel_ptx(stride_bytes=stride),
            device=DEVICES["gtx-760"],
            grid=(1, 1, 1),
            block=(256, 1, 1),
            registers_per_thread=16,
            shared_bytes_per_block=0,
            loop_trip_counts={"LOOP": 1},
        )
        result = predict_kernel(req)
        loads = [i for i, c in enumerate(result.costs) if c.opcode == "ld.global.f32"]
        segments = len({(t * stride) // 128 for t in range(32)})
        assert [result.costs[i].n_ma for i in loads] == [segments]
        assert result.n_ma_inferred[loads[0]]


@settings(max_examples=30, deadline=None)
@given(devices, threads, st.integers(1, 64), st.sampled_from([4, 64, 256, 1024]))
def test_prediction_never_below_one_block_launch(
    device: str, n_t: int, blocks: int, stride: int
) -> None:
    """eq. (24)/(25) start from block_lnch_ovh and only add non-negative terms, also when
    there are fewer blocks than resident slots (K < 1)."""
    got = cycles(kernel_ptx(stride_bytes=stride), device=device, blocks=blocks, threads=n_t)
    assert got >= DEVICES[device].device.block_launch_overhead_cycles
