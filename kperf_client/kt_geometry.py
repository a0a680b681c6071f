"""Kernel Tuner's launch geometry and per-configuration source, reproduced without importing it.

Kernel Tuner (``kernel_tuner/util.py``, the same in 0.4.5, 1.0, 1.1 and 1.5) launches each
configuration with

- ``block = (params[block_size_x], params[block_size_y], params[block_size_z])``, defaults
  256, 1, 1 (``get_thread_block_dimensions``);
- ``grid[i] = ceil(problem_size[i] / divisor[i])`` (``get_grid_dimensions``), where a
  divisor is, per dimension, ``grid_div_x/y/z``: absent = the block size parameter of that
  dimension, an int, an expression over the parameters, or a list whose items multiply;
- ``problem_size`` items are ints or expressions over the parameters (``get_problem_size``),
  missing dimensions 1;

and compiles the source with ``#define`` lines in front (``prepare_kernel_string`` with
``defines=None``): ``grid_size_x/y/z``, the three block size names, every tunable, then
``kernel_tuner 1`` and ``#line 1``; in a string value, tokens naming tunables are replaced by
their values. A tunable whose name contains ``loop_unroll_factor`` is
special in CUDA: value 0 deletes the source's ``#pragma unroll NAME`` line and defines
nothing, any other value adds ``constexpr int NAME = V;``.

Kernel Tuner ``eval``s expressions; here they are parsed and only arithmetic on numbers and
parameter names is evaluated.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence

#: a tunable's value as a Kernel Tuner cache stores it
ParamValue = int | float | str
Params = Mapping[str, ParamValue]
#: one dimension's divisor: None (its block size), an int, an expression, or a product of them
Divisor = int | str | Sequence[int | str] | None

BLOCK_SIZE_NAMES = ("block_size_x", "block_size_y", "block_size_z")
GRID_SIZE_NAMES = ("grid_size_x", "grid_size_y", "grid_size_z")
#: get_thread_block_dimensions' defaults for an absent block size parameter
DEFAULT_BLOCK = (256, 1, 1)

_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class GeometryError(ValueError):
    """A problem size or grid divisor that cannot be evaluated for a configuration."""


def evaluate(expression: str, params: Params) -> float:
    """The value of an arithmetic expression over numbers and parameter names."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise GeometryError(f"cannot parse {expression!r}: {exc.msg}") from None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in params:
                raise GeometryError(f"{expression!r} names {node.id!r}, which is no tunable")
            raw = params[node.id]
            if isinstance(raw, str):
                raise GeometryError(f"{expression!r}: tunable {node.id!r} is not a number")
            return float(raw)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise GeometryError(f"{expression!r}: only + - * / // % ** on numbers and tunables")

    try:
        return value(tree.body)
    except ZeroDivisionError:
        raise GeometryError(f"{expression!r} divides by zero") from None


def _positive_int(raw: ParamValue, what: str) -> int:
    if isinstance(raw, str) or raw != int(raw) or raw < 1:
        raise GeometryError(f"{what} must be a positive whole number, got {raw!r}")
    return int(raw)


def block_dimensions(
    params: Params, block_size_names: Sequence[str] = BLOCK_SIZE_NAMES
) -> tuple[int, int, int]:
    """Threads per block in x, y, z, as Kernel Tuner reads them from the tunables."""
    dims = [
        _positive_int(params.get(name, default), name)
        for name, default in zip(block_size_names, DEFAULT_BLOCK, strict=True)
    ]
    return dims[0], dims[1], dims[2]


def problem_dimensions(problem_size: Sequence[int | str], params: Params) -> tuple[int, int, int]:
    """The problem size in x, y, z (missing dimensions 1), expressions evaluated."""
    if not 1 <= len(problem_size) <= 3:
        raise GeometryError(f"a problem size has 1 to 3 dimensions, got {len(problem_size)}")
    dims = [1, 1, 1]
    for i, item in enumerate(problem_size):
        raw = evaluate(item, params) if isinstance(item, str) else item
        dims[i] = _positive_int(raw, f"problem size {'xyz'[i]}")
    return dims[0], dims[1], dims[2]


def _divisor(divisor: Divisor, block_size_name: str, params: Params) -> int:
    if divisor is None:
        return _positive_int(params.get(block_size_name, 1), block_size_name)
    if isinstance(divisor, int):
        return _positive_int(divisor, "grid divisor")
    if isinstance(divisor, str):
        return _positive_int(evaluate(divisor, params), f"grid divisor {divisor!r}")
    product = 1
    for item in divisor:
        product *= _divisor(item, block_size_name, params)
    return product


def grid_dimensions(
    problem_size: Sequence[int | str],
    params: Params,
    grid_div: Sequence[Divisor] = (None, None, None),
    block_size_names: Sequence[str] = BLOCK_SIZE_NAMES,
) -> tuple[int, int, int]:
    """Blocks in x, y, z: ceil(problem size / divisor) per dimension, Kernel Tuner's rule."""
    size = problem_dimensions(problem_size, params)
    divisors = [
        _divisor(div, name, params) for div, name in zip(grid_div, block_size_names, strict=True)
    ]
    grid = [math.ceil(s / d) for s, d in zip(size, divisors, strict=True)]
    return grid[0], grid[1], grid[2]


def _substitute(text: str, params: Params) -> str:
    """A string value with every token naming a tunable replaced by its value (Kernel Tuner's
    replace_param_occurrences)."""
    parts = re.split(r"([a-zA-Z0-9_]+)", text)
    return "".join(str(params[part]) if part in params else part for part in parts)


def kernel_tuner_source(
    source: str,
    params: Params,
    grid: Sequence[int],
    block: Sequence[int],
    block_size_names: Sequence[str] = BLOCK_SIZE_NAMES,
) -> str:
    """The source text Kernel Tuner compiles for one configuration (CUDA, default defines)."""
    defines: dict[str, ParamValue] = dict(zip(GRID_SIZE_NAMES, grid, strict=True))
    defines.update(zip(block_size_names, block, strict=True))
    defines.update(params)
    defines["kernel_tuner"] = 1
    prefix = []
    for name, raw in defines.items():
        if not name.isidentifier():
            raise GeometryError(f"tunable name {name!r} is not a C identifier")
        text = (_substitute(raw, params) if isinstance(raw, str) else str(raw)).replace(
            "\n", "\\\n"
        )
        if "loop_unroll_factor" in name:
            if text == "0":
                source = re.sub(r"\n\s*#pragma\s+unroll\s+" + name, "\n", source)
            else:
                prefix.append(f"constexpr int {name} = {text};\n")
        else:
            prefix.append(f"#define {name} {text}\n")
    prefix.append("#line 1\n")
    return "".join(prefix) + source
