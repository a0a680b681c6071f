"""Triton's autotuning vocabulary mapped onto kperf's (pure functions: no I/O, no triton import).

A ``triton.Config`` carries the kernel's meta-parameters in ``kwargs`` (``BLOCK_SIZE_M`` ...)
and the compiler's in attributes (``num_warps``, ``num_stages`` ...); ``Config.all_kwargs()``
merges both. Its tile sizes are the GeMM-WS tile (TM, TN, TK) and its ``num_stages`` sets the
buffer depth, the paper's circular buffer of A and B tiles in shared memory: how many buffers
Triton's software pipeliner allocates for ``num_stages`` depends on the GPU
(:func:`buffer_depth_of`). Everything else (``num_warps``, ``GROUP_SIZE_M``, ...) the model does
not see: it travels as the candidate's opaque ``params``, and configs equal in tiles and depth
form one group, kept or dropped together.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: kperf's element types, as /optimize-tiling's ``dtype`` spells them
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
#: substrings of a dtype's name (torch ``torch.bfloat16``, numpy ``float16``, triton ``fp16``,
#: ``fp8e4nv``), most specific first: "bfloat16" contains "float16"
_DTYPE_SPELLINGS: tuple[tuple[str, str], ...] = (
    ("bfloat16", "bf16"),
    ("bf16", "bf16"),
    ("float8", "fp8"),
    ("fp8", "fp8"),
    ("float16", "fp16"),
    ("fp16", "fp16"),
    ("half", "fp16"),
    ("tf32", "tf32"),
    ("float32", "fp32"),
    ("fp32", "fp32"),
)
#: Triton's ``do_bench`` reports milliseconds (``triton.testing.do_bench``: "The runtime(s) in
#: milliseconds"); kperf's measurements are microseconds
US_PER_MS = 1000.0


#: the Config attribute holding the pipeliner's stage count
NUM_STAGES = "num_stages"


class TritonConfig(Protocol):
    """What is read of a ``triton.Config``."""

    def all_kwargs(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class TritonNames:
    """Where kperf's quantities are in a Triton kernel: meta-parameter and argument names.

    Each tile and the buffer depth may go by several names (the first present wins); ``m``,
    ``n``, ``k`` name the kernel arguments holding the GEMM's sizes; ``dtype_args`` the tensor
    arguments whose ``.dtype`` is the element type of A and B (empty: the first argument that
    has a ``dtype``)."""

    tile_m: tuple[str, ...] = ("BLOCK_SIZE_M", "BLOCK_M")
    tile_n: tuple[str, ...] = ("BLOCK_SIZE_N", "BLOCK_N")
    tile_k: tuple[str, ...] = ("BLOCK_SIZE_K", "BLOCK_K")
    #: ``num_stages`` is translated by :func:`buffer_depth_of`; any other name is the depth
    buffer_depth: tuple[str, ...] = (NUM_STAGES,)
    m: str = "M"
    n: str = "N"
    k: str = "K"
    dtype_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, order=True)
class Tiling:
    """One GeMM-WS tiling: tile sizes in elements and the buffer depth in stages."""

    tile_m: int
    tile_n: int
    tile_k: int
    buffer_depth: int


@dataclass(frozen=True, slots=True)
class Problem:
    """One GEMM: C (m x n) = A (m x k) B (k x n), elements, and the element type of A and B."""

    m: int
    n: int
    k: int
    dtype: str


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a positive integer, got {value!r}")
    try:
        number = operator.index(value)  # int, numpy integers; never a float
    except TypeError:
        raise ValueError(f"{what}: expected a positive integer, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{what}: expected a positive integer, got {number}")
    return number


def _first(values: Mapping[str, Any], names: Sequence[str]) -> tuple[str, Any] | None:
    for name in names:
        if name in values:
            return name, values[name]
    return None


def buffer_depth_of(num_stages: int, compute_capability: str | None) -> int:
    """The A and B tile buffers Triton 3.9's software pipeliner allocates in shared memory for
    ``num_stages`` on a GPU of this compute capability ("8.6"), i.e. the GeMM-WS buffer depth.

    Read off the compiler itself (``tests/kperf_client/test_triton_configs.py`` compiles a
    tiled matmul for sm_75, sm_86 and sm_90 and checks the shared memory it allocates):
    before sm_80 (no asynchronous copy) the loads are not multi-buffered, one buffer; on sm_8x
    (``cp.async``) ``num_stages - 1`` buffers, the stage being computed on reading the oldest;
    from sm_90 (``wgmma``, TMA) ``num_stages`` buffers. Unknown capability: ``num_stages``."""
    major = _major(compute_capability)
    if major is None:
        return num_stages
    if major < 8:
        return 1
    if major < 9:
        return max(1, num_stages - 1)
    return num_stages


def _major(compute_capability: str | None) -> int | None:
    head = (compute_capability or "").split(".")[0]
    return int(head) if head.isdigit() else None


def tiling_and_params(
    values: Mapping[str, Any], names: TritonNames, compute_capability: str | None = None
) -> tuple[Tiling, dict[str, Any]] | None:
    """A config's tiling and the rest of its meta-parameters (``params``, JSON values), from
    its ``Config.all_kwargs()``; None when one of the tile sizes or the depth is missing or
    not a positive integer (a config kperf cannot judge). ``num_stages`` becomes the buffer
    depth of the GPU's compute capability (:func:`buffer_depth_of`)."""
    found = [
        _first(values, names.tile_m),
        _first(values, names.tile_n),
        _first(values, names.tile_k),
        _first(values, names.buffer_depth),
    ]
    if any(item is None for item in found):
        return None
    try:
        sizes = [_positive_int(item[1], item[0]) for item in found if item is not None]
    except ValueError:
        return None
    used = {item[0] for item in found if item is not None}
    if found[3] is not None and found[3][0] == NUM_STAGES:
        sizes[3] = buffer_depth_of(sizes[3], compute_capability)
    params = {key: _json_value(value) for key, value in values.items() if key not in used}
    return Tiling(*sizes), params


def _json_value(value: Any) -> Any:
    """Echoed untouched by the service, so anything JSON; other objects by their text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def candidate(tiling: Tiling, params: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of /optimize-tiling's ``candidates``."""
    return {
        "tile_m": tiling.tile_m,
        "tile_n": tiling.tile_n,
        "tile_k": tiling.tile_k,
        "buffer_depth": tiling.buffer_depth,
        "params": dict(params),
    }


def dtype_of(value: object) -> str | None:
    """kperf's name of an element type given as a dtype object or its name (torch, numpy,
    triton), or None when kperf has no such type (int8, fp64 ...)."""
    text = str(value).lower()
    for spelling, dtype in _DTYPE_SPELLINGS:
        if spelling in text:
            return dtype
    return None


def problem_of(args: Mapping[str, Any], names: TritonNames, default_dtype: str) -> Problem:
    """The GEMM of one kernel call from its named arguments; ValueError naming the argument
    when a size is missing or not a positive integer, or the tensors' type is not kperf's."""
    sizes = []
    for name in (names.m, names.n, names.k):
        if name not in args:
            raise ValueError(
                f"{name}: no such kernel argument (have {', '.join(args) or 'none'}); name the "
                "GEMM's sizes with TritonNames(m=..., n=..., k=...)"
            )
        sizes.append(_positive_int(args[name], name))
    m, n, k = sizes
    return Problem(m, n, k, _dtype_from_args(args, names, default_dtype))


def _dtype_from_args(args: Mapping[str, Any], names: TritonNames, default_dtype: str) -> str:
    candidates = names.dtype_args or tuple(args)
    for name in candidates:
        dtype = getattr(args.get(name), "dtype", None)
        if dtype is None:
            continue
        found = dtype_of(dtype)
        if found is None:
            raise ValueError(f"{name}: element type {dtype} is not one of kperf's {DTYPES}")
        return found
    return default_dtype


def problem_from_key(
    key: Sequence[Any], key_names: Sequence[str], names: TritonNames, default_dtype: str
) -> Problem:
    """The GEMM from an autotuning key: Triton's key is the values of the autotuner's ``key``
    arguments in their order, then ``str(arg.dtype)`` of every argument with a dtype."""
    sizes = []
    for name in (names.m, names.n, names.k):
        if name not in key_names:
            raise ValueError(f"key_names: {name} is not among {list(key_names)}")
        position = list(key_names).index(name)
        if position >= len(key):
            raise ValueError(f"key: {len(key)} values, no {name} at position {position}")
        sizes.append(_positive_int(key[position], name))
    dtype = next((d for d in map(dtype_of, key[len(key_names) :]) if d is not None), default_dtype)
    m, n, k = sizes
    return Problem(m, n, k, dtype)


def select_groups(
    ranked: Sequence[tuple[Tiling, float | None]],
    top_k: int | None,
    probability_mass: float | None,
) -> list[Tiling]:
    """The tilings to keep, best first: groups in rank order (``ranked``: each tiling once,
    with its ``probability_best``) until ``top_k`` of them or until the kept ones' probability
    of holding the fastest reaches ``probability_mass``, whichever comes first; at least one.
    Without probabilities (the service drew none) the mass cannot be judged: ``top_k`` alone
    decides, or every tiling is kept."""
    kept: list[Tiling] = []
    mass = 0.0
    for tiling, probability in ranked:
        if top_k is not None and len(kept) >= top_k:
            break
        if probability_mass is not None and kept and mass >= probability_mass:
            break
        kept.append(tiling)
        mass += probability or 0.0
    return kept


def median_ms(timing: Any) -> float | None:
    """The time of one benchmarked config, ms: ``Autotuner._bench`` asks ``do_bench`` for the
    quantiles (0.5, 0.2, 0.8), so a list's first entry is the median; a custom ``do_bench``
    may give one number. None for a config that failed (Triton times it as inf)."""
    value = timing[0] if isinstance(timing, list | tuple) and timing else timing
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def measured_runs(
    problem: Problem,
    timings: Iterable[tuple[Mapping[str, Any], Any]],
    names: TritonNames,
    compute_capability: str | None = None,
) -> list[dict[str, Any]]:
    """GeMM-WS measurements (POST /devices/{id}/measurements) of benchmarked configs, given as
    (``Config.all_kwargs()``, Triton's timing): one per tiling, its fastest config's median
    time in us. The model predicts a tiling's time without the parameters it does not see
    (num_warps ...), i.e. the best that tiling reaches, so a slower config of the same tiling
    is not a measurement of it."""
    fastest: dict[Tiling, float] = {}
    for values, timing in timings:
        time_ms = median_ms(timing)
        mapped = tiling_and_params(values, names, compute_capability)
        if time_ms is None or mapped is None:
            continue
        tiling = mapped[0]
        fastest[tiling] = min(time_ms, fastest.get(tiling, math.inf))
    return [
        {
            "m": problem.m,
            "n": problem.n,
            "k": problem.k,
            "dtype": problem.dtype,
            "tile_m": tiling.tile_m,
            "tile_n": tiling.tile_n,
            "tile_k": tiling.tile_k,
            "buffer_depth": tiling.buffer_depth,
            "measured_time_us": time_ms * US_PER_MS,
        }
        for tiling, time_ms in sorted(fastest.items())
    ]
