"""What a library and its timing harness add around the GEMM kernel the model predicts.

Two mechanisms, each a fact about how the runs were produced, not about the GPU:

- **Framework floor.** A timing taken with CUDA events around a framework call (PyTorch's
  ``nn.Linear``, NeuSight's collector) starts when the GPU reaches the first event, which it
  does at once; the kernel starts when the host has dispatched it, and the end event runs when
  the host has recorded it AND the kernel has finished. So the time is max(the host's whole
  call, the host's time to the launch + the kernel): a floor, not an added constant. T_INIT
  plays the time to the launch; ``floor_us`` the whole host call. Off (0) for kernel times
  (CUPTI, nsys), where the model's additive T_INIT is the launch itself.
- **Serial split-K.** A library that splits K without a workspace for the partial sums reduces
  them inside the GEMM kernel: the slices of an output tile add their partial sums into C in
  turn, each waiting on a flag the previous one releases (CUTLASS's ``Gemm<..., SplitKSerial>``
  does this with a semaphore in global memory; ``GemmSplitKParallel`` + ``ReduceSplitK`` is the
  two-kernel form the model's reduction term describes). No second kernel is launched, and the
  s slices' epilogues run one after another: s - 1 hand-offs (``serial_handoff_us`` each: the
  flag's acquire, the C tile's read and write, the fence and release), while the C tile's bytes
  are those the parallel form moves (2 s m n x 4). cuBLAS is closed source; the NeuSight
  collector's kernel list shows which form ran (a ``splitKreduce_kernel`` launch or none), and
  the partial sums decide it (docs/model-notes.md, "Memory hierarchy" 4b).
"""

from __future__ import annotations

from dataclasses import dataclass

#: a hand-off of serial split-K costs about this many L2 round trips: acquire the flag, read the
#: C tile, write it and fence, release the flag (the base of its prior)
SERIAL_HANDOFF_L2_ROUND_TRIPS = 4
#: exponent of the smooth maximum of the floor and the kernel arm (observed_us)
FLOOR_SHARPNESS = 8.0


@dataclass(frozen=True, slots=True)
class Harness:
    """Figures of the harness around the kernel (us); 0 = the mechanism is absent."""

    floor_us: float = 0.0
    serial_handoff_us: float = 0.0


#: no floor, no serial split-K: the model's kernel time is the run's time
KERNEL_TIMES = Harness()


def serial_split_k_us(split_k: int, handoff_us: float) -> float:
    """The in-kernel reduction's hand-offs: the s slices of a tile add into C in turn."""
    return max(split_k - 1, 0) * handoff_us


def observed_us(kernel_us: float, harness: Harness) -> float:
    """The time a harness reports for a kernel (and its launch offset) of ``kernel_us``: the
    larger of the two, as a smooth maximum (the p-norm, FLOOR_SHARPNESS): the two arms meet
    1.09x above either, and the floor keeps a gradient where the kernel arm leads, so a fit
    started below the floor can find it."""
    if harness.floor_us <= 0:
        return kernel_us
    p = FLOOR_SHARPNESS
    big = max(kernel_us, harness.floor_us)
    return float(big * ((kernel_us / big) ** p + (harness.floor_us / big) ** p) ** (1 / p))
