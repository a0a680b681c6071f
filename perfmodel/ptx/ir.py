"""PTX parser: module text -> frozen IR (functions, instructions, operands).

Covers what nvcc emits for PTX ISA 6.x-8.x and later (any ``.target``): module directives,
``.entry``/``.func`` with parameter lists and performance-tuning directives, ``.reg``/``.shared``/
``.local``/``.const``/``.global`` declarations, labels, ``@%p``/``@!%p`` guards, vector, address
and call operands, ``{ ... }`` blocks with labels and registers of their own (a name declared in
one becomes ``name@line``, :mod:`perfmodel.ptx.scopes`), comments, and
``.loc``/``.file``/``.pragma``/``.section`` (ignored). Opcodes are not checked against a list so
later ISA versions still parse; the model classifies what it does not know. Anything that is not
PTX raises :class:`~perfmodel.errors.PTXSyntaxError` with a 1-based line and column.
"""

from __future__ import annotations

import gc
import re
from bisect import bisect_right
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from perfmodel.errors import AmbiguousKernel, PTXSyntaxError, UnknownKernel
from perfmodel.ptx.scopes import ScopeTree

__all__ = ["Function", "Instruction", "Module", "Operand", "parse_module"]

#: state spaces a memory instruction may name (``shared::cta`` etc. are reported as ``shared``)
_STATE_SPACES = frozenset({"global", "shared", "local", "param", "const", "tex", "generic"})

#: opcodes that access memory; ``state_space`` is defined for these
_MEMORY_OPCODES = frozenset(
    {
        "ld",
        "ldu",
        "st",
        "atom",
        "red",
        "prefetch",
        "prefetchu",
        "cp",
        "ldmatrix",
        "stmatrix",
        "mbarrier",
        "multimem",
        "tex",
        "tld4",
        "suld",
        "sust",
        "sured",
        "wmma",
        "applypriority",
        "discard",
    }
)

_TEXTURE_OPCODES = frozenset({"tex", "tld4", "suld", "sust", "sured"})

#: opcodes whose first operand is read, not written (stores, reductions, control, barriers)
_NO_DEST_OPCODES = frozenset(
    {
        "st",
        "red",
        "bar",
        "barrier",
        "bra",
        "brx",
        "ret",
        "exit",
        "membar",
        "fence",
        "prefetch",
        "prefetchu",
        "trap",
        "brkpt",
        "pmevent",
        "cp",
        "stmatrix",
        "sust",
        "sured",
        "nanosleep",
        "griddepcontrol",
        "setmaxnreg",
        "applypriority",
        "discard",
        "multimem",
        "st_async",
        "tensormap",
    }
)

#: special registers holding the same value for every thread of a block (PTX ISA chapter
#: "Special Registers"); names before any ``.x`` suffix
UNIFORM_SPECIAL_REGISTERS = frozenset(
    {
        "%ntid",
        "%ctaid",
        "%nctaid",
        "%gridid",
        "%nsmid",
        "%smid",
        "%warpid",
        "%nwarpid",
        "%clusterid",
        "%nclusterid",
        "%cluster_ctaid",
        "%cluster_nctaid",
        "%cluster_ctarank",
        "%cluster_nctarank",
        "%is_explicit_cluster",
        "%total_smem_size",
        "%dynamic_smem_size",
        "%aggr_smem_size",
    }
)

#: every special register: the uniform ones, and those that differ by thread or by read
_SPECIAL_REGISTERS = UNIFORM_SPECIAL_REGISTERS | {
    "%tid",
    "%laneid",
    "%lanemask_eq",
    "%lanemask_le",
    "%lanemask_lt",
    "%lanemask_ge",
    "%lanemask_gt",
    "%clock",
    "%clock_hi",
    "%clock64",
    "%globaltimer",
    "%globaltimer_lo",
    "%globaltimer_hi",
    "%current_graph_exec",
}
_SPECIAL_NUMBERED = re.compile(r"%(?:envreg\d+|pm\d+(?:_64)?|reserved_smem_\w+)\Z")

#: bytes per element of each fundamental type (PTX ISA "Fundamental Types")
_TYPE_BYTES = {
    "b8": 1,
    "s8": 1,
    "u8": 1,
    "e4m3": 1,
    "e5m2": 1,
    "b16": 2,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "e4m3x2": 2,
    "e5m2x2": 2,
    "b32": 4,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "f16x2": 4,
    "bf16x2": 4,
    "tf32": 4,
    "b64": 8,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "b128": 16,
    "pred": 1,
}


@dataclass(frozen=True, slots=True)
class Operand:
    """One instruction operand as written, classified."""

    #: as written, e.g. ``%r1``, ``[%rd8+4]``, ``{%f1, %f2}``, ``0f3F800000``, ``$L__BB0_2``
    text: str
    #: ``register``, ``immediate``, ``address``, ``vector``, ``label``, ``symbol`` or ``special``
    kind: str
    #: registers (and special registers) named inside, e.g. ``("%rd8",)`` for ``[%rd8+4]``
    registers: tuple[str, ...]
    #: constant byte displacement of an ``address`` (or ``symbol+k``) operand
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Instruction:
    """One PTX instruction with its def/use sets."""

    line: int  #: 1-based line of the opcode in the submitted text
    column: int  #: 1-based column of the opcode
    text: str  #: instruction text (guard included) without comment or trailing ``;``
    opcode: str  #: base opcode, e.g. ``ld``
    modifiers: tuple[str, ...]  #: e.g. ``("global", "nc", "f32")``
    full_opcode: str  #: e.g. ``ld.global.nc.f32``
    operands: tuple[Operand, ...]
    guard: str | None  #: predicate register of ``@%p``/``@!%p``
    guard_negated: bool
    defs: tuple[str, ...]  #: registers written
    uses: tuple[str, ...]  #: registers read (sources, address registers, guard)
    labels: tuple[str, ...]  #: labels written immediately before this instruction

    @property
    def state_space(self) -> str | None:
        """State space of a memory instruction (``generic`` when none is named), else None.

        Copies naming two spaces (``cp.async.ca.shared.global``) report the source, the last one.
        Instructions of memory opcodes that take no address (``cp.async.wait_group``) give None.
        """
        if self.opcode not in _MEMORY_OPCODES:
            return None
        if not any(o.kind == "address" for o in self.operands):
            return None  # cp.async.commit_group, cp.async.wait_group: no memory access
        if self.opcode == "wmma" and not ({"load", "store"} & set(self.modifiers)):
            return None
        if self.opcode == "mbarrier":
            return "shared"
        found: str | None = None
        for m in self.modifiers:
            base = m.split("::", 1)[0]
            if base in _STATE_SPACES:
                found = base
        if found is None and self.opcode in _TEXTURE_OPCODES:
            return "tex"
        if found is None and self.opcode in ("ldmatrix", "stmatrix"):
            return "shared"
        return found or "generic"

    @property
    def is_branch(self) -> bool:
        """True for ``bra`` and ``brx`` (calls return, so they do not end a basic block)."""
        return self.opcode in ("bra", "brx")

    @property
    def branch_target(self) -> str | None:
        """Label a ``bra`` jumps to; None for other instructions and for ``brx.idx``."""
        if self.opcode == "bra" and self.operands and self.operands[0].kind == "label":
            return self.operands[0].text
        return None


@dataclass(frozen=True, slots=True)
class Function:
    """A ``.entry`` (kernel) or ``.func`` with a body."""

    name: str
    is_entry: bool
    params: tuple[str, ...]
    instructions: tuple[Instruction, ...]
    label_index: Mapping[str, int]  #: label -> index of the first instruction after it
    shared_bytes: int  #: static ``.shared`` bytes: function scope plus module-scope ones used
    local_bytes: int  #: ``.local`` bytes declared in the function
    register_declarations: Mapping[str, int]  #: e.g. ``{"%r": 30, "%f": 8}``
    #: performance-tuning directives of the header, e.g. ``{"maxntid": (256, 1, 1)}``
    tuning: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: ``.branchtargets`` tables: table label -> target labels (for ``brx.idx``)
    branch_tables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    line: int = 0  #: 1-based line of the ``.entry``/``.func`` directive


@dataclass(frozen=True, slots=True)
class Module:
    """A parsed PTX module."""

    version: str  #: ``.version``, e.g. ``"8.5"``
    target: str  #: architecture of ``.target``, e.g. ``"sm_80"``
    address_size: int  #: ``.address_size`` in bits (32 when absent, as the ISA specifies)
    functions: tuple[Function, ...]
    module_shared_bytes: int  #: module-scope static ``.shared`` bytes

    @property
    def entries(self) -> tuple[str, ...]:
        """Names of the ``.entry`` functions, in module order."""
        return tuple(f.name for f in self.functions if f.is_entry)

    def entry(self, name: str | None) -> Function:
        """The ``.entry`` called ``name``; with None, the only one (else AmbiguousKernel)."""
        entries = [f for f in self.functions if f.is_entry]
        names = tuple(f.name for f in entries)
        if name is None:
            if len(entries) == 1:
                return entries[0]
            if not entries:
                raise UnknownKernel(None, names)
            raise AmbiguousKernel(names)
        for f in entries:
            if f.name == name:
                return f
        raise UnknownKernel(name, names)


# --------------------------------------------------------------------------------------------
# lexical helpers

# strings first so that "//" inside a .file path is not a comment; an unterminated block comment
# or string is matched by the last two alternatives and reported.
_COMMENT_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|/\*|"', re.DOTALL)
_WS_RE = re.compile(r"\s*")
_LABEL_RE = re.compile(r"([A-Za-z_$][\w$]*)[ \t]*:(?!:)")
_INSTR_RE = re.compile(
    r"(?:@(?P<neg>!?)[ \t]*(?P<guard>%?[A-Za-z_$][\w$]*)\s+)?"
    r"(?P<op>[a-z][a-z0-9_]*)(?P<mods>(?:\.[\w:]+)*)(?:\s+(?P<args>.*))?\Z",
    re.DOTALL,
)
_REG_TOKEN_RE = re.compile(r"(?:[!-]\s*)?(%?[A-Za-z_$][\w$]*(?:\.[xyzw])?)\Z")
_PAIR_RE = re.compile(r"(%?[A-Za-z_$][\w$]*)\s*\|\s*(%?[A-Za-z_$][\w$]*)\Z")
_IMM_RE = re.compile(
    r"[-+]?(?:0[fF][0-9a-fA-F]{8}|0[dD][0-9a-fA-F]{16}|0[xX][0-9a-fA-F]+U?|0[bB][01]+U?"
    r"|\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+U?)\Z"
)
_INT_RE = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)U?\Z")
_TERM_SPLIT_RE = re.compile(r"\s*([+-])\s*")
_TERM_RE = re.compile(r"\s*((?:[+-]\s*)*)([^+\-\s]+)\s*")
_DIM_RE = re.compile(r"\[\s*([^\]]*?)\s*\]")
_VAR_RE = re.compile(
    r"([A-Za-z_$%][\w$]*)\s*((?:\[[^\]]*\]\s*)*)(?:<\s*(\d+)\s*>)?\s*(=.*)?\Z", re.S
)
_SPACE_CHARS = re.compile(r"\s+")
#: performance-tuning directives between a function's parameters and its body
_TUNING_RE = re.compile(r"(?:\s*\.\w+(?:\s*,?\s*\d+)*)*\s*")
_NAME_RE = re.compile(r"[A-Za-z_$][\w$]*")
_BRACE_OR_STRING_RE = re.compile(r'[{}]|"[^"]*"?')
_DIRECTIVE_RE = re.compile(r"\.([A-Za-z_]\w*)")
_FUNC_HEAD_RE = re.compile(r"\.(entry|func)\b")


def _int_literal(text: str) -> int | None:
    """Value of a PTX integer literal (decimal, hex, binary, optional sign and ``U``)."""
    if not _INT_RE.match(text):
        return None
    t = text.rstrip("U")
    sign = -1 if t.startswith("-") else 1
    t = t.lstrip("+-")
    if t[:2] in ("0x", "0X"):
        return sign * int(t[2:], 16)
    if t[:2] in ("0b", "0B"):
        return sign * int(t[2:], 2)
    if len(t) > 1 and t.startswith("0"):
        # PTX follows C: a leading 0 means octal
        return sign * int(t, 8) if t.isdigit() and "8" not in t and "9" not in t else None
    return sign * int(t)


def _is_special(name: str) -> bool:
    base = name.split(".", 1)[0]
    return base in _SPECIAL_REGISTERS or bool(_SPECIAL_NUMBERED.match(base))


def _split_operands(src: _Source, at: int, text: str, what: str) -> list[str]:
    """:func:`_split_top`, an unbalanced ``text`` reported at ``at`` as ``what: reason``."""
    try:
        return _split_top(text)
    except ValueError as exc:
        raise src.error(at, f"{what}: {exc}") from None


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets, braces and parentheses."""
    if "{" not in text and "(" not in text:
        lb = text.find("[")
        if lb < 0:
            return text.split(",")
        rb = text.find("]", lb)
        # one address without commas inside (the common case): a plain split is exact
        if rb > lb and text.count("[") == 1 and text.count("]") == 1 and "," not in text[lb:rb]:
            return text.split(",")
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {ch!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError("unbalanced brackets")
    parts.append(text[start:])
    return parts


class _Source:
    """Comment-free text with offset -> (line, column) mapping."""

    def __init__(self, text: str) -> None:
        self.line_starts = [0]
        find = text.find
        i = find("\n")
        while i >= 0:
            self.line_starts.append(i + 1)
            i = find("\n", i + 1)
        self.text = self._strip_comments(text) if "/" in text or '"' in text else text

    def pos(self, offset: int) -> tuple[int, int]:
        line = bisect_right(self.line_starts, offset)
        return line, offset - self.line_starts[line - 1] + 1

    def error(self, offset: int, message: str) -> PTXSyntaxError:
        line, col = self.pos(offset)
        return PTXSyntaxError(line, col, message)

    def _strip_comments(self, text: str) -> str:
        def repl(m: re.Match[str]) -> str:
            s = m.group(0)
            if s.startswith('"'):
                if len(s) == 1 or not s.endswith('"'):
                    raise self.error(m.start(), "unterminated string literal; close it with '\"'")
                return s
            if s == "/*":
                raise self.error(m.start(), "unterminated block comment; close it with '*/'")
            # keep newlines so that line numbers stay those of the submitted text
            return "".join(c if c == "\n" else " " for c in s)

        return _COMMENT_RE.sub(repl, text)


# --------------------------------------------------------------------------------------------
# declarations


def _decl_bytes(body: str, src: _Source, offset: int) -> list[tuple[str, int, int]]:
    """``(name, bytes, align)`` of each variable in a ``.shared``/``.local``/... declaration.

    ``body`` is the statement without the leading state-space directive, e.g.
    ``.align 4 .b8 tile[1024]``. ``[]`` (extern, dynamically sized) counts 0 bytes.
    """
    rest = body.strip()
    align = 0
    elem = 0
    vec = 1
    while rest.startswith("."):
        m = _DIRECTIVE_RE.match(rest)
        if m is None:
            raise src.error(offset, f"malformed declaration {body.strip()!r}")
        word = m.group(1)
        rest = rest[m.end() :].lstrip()
        if word == "align":
            n = re.match(r"(\d+)", rest)
            if n is None:
                raise src.error(offset, ".align needs a byte count, e.g. '.align 4'")
            align = int(n.group(1))
            rest = rest[n.end() :].lstrip()
        elif word in ("v2", "v4", "v8"):
            vec = int(word[1:])
        elif word in _TYPE_BYTES:
            elem = _TYPE_BYTES[word]
        # other qualifiers (.ptr, .attribute(...), .managed, .unified) do not change the size
        if word == "attribute" and rest.startswith("("):
            close = rest.find(")")
            rest = rest[close + 1 :].lstrip() if close >= 0 else ""
    if not rest:
        raise src.error(offset, f"declaration {body.strip()!r} names no variable")
    if elem == 0:
        raise src.error(offset, f"declaration {body.strip()!r} lacks a type such as .b8 or .f32")
    # an initializer may contain commas; only split the part before '='
    eq = rest.find("=")
    names_part = rest if eq < 0 else rest[:eq]
    out: list[tuple[str, int, int]] = []
    for piece in names_part.split(","):
        m = _VAR_RE.match(piece.strip())
        if m is None:
            raise src.error(offset, f"cannot read variable {piece.strip()!r} in declaration")
        count = 1
        for d in _DIM_RE.findall(m.group(2) or ""):
            if d == "":
                count = 0
                continue
            v = _int_literal(d)
            if v is None or v < 0:
                raise src.error(offset, f"array size {d!r} must be a non-negative integer")
            count *= v
        if m.group(3) is not None:  # parameterized names %r<30>
            count *= int(m.group(3))
        out.append((m.group(1), count * elem * vec, max(align, elem * vec)))
    return out


def _layout(vars_: list[tuple[str, int, int]]) -> int:
    """Bytes taken by variables laid out in order, each at its alignment."""
    total = 0
    for _, size, align in vars_:
        if align > 1:
            total = (total + align - 1) // align * align
        total += size
    return total


def _reg_decl(body: str, src: _Source, offset: int) -> list[tuple[str, int, bool]]:
    """``(name, count, parameterized)`` for each name of a ``.reg`` declaration
    (``%r<30>`` -> ("%r", 30, True), ``P1`` -> ("P1", 1, False))."""
    rest = body.strip()
    while rest.startswith("."):
        m = _DIRECTIVE_RE.match(rest)
        if m is None:
            raise src.error(offset, f"malformed .reg declaration {body.strip()!r}")
        rest = rest[m.end() :].lstrip()
        if m.group(1) == "align":
            rest = re.sub(r"^\d+\s*", "", rest)
    if not rest:
        raise src.error(offset, ".reg declaration names no register, e.g. '.reg .b32 %r<8>;'")
    out: list[tuple[str, int, bool]] = []
    for piece in rest.split(","):
        m = re.match(r"(%?[A-Za-z_$][\w$]*)\s*(?:<\s*(\d+)\s*>)?\s*\Z", piece.strip())
        if m is None:
            raise src.error(offset, f"cannot read register name {piece.strip()!r}")
        ranged = m.group(2) is not None
        out.append((m.group(1), int(m.group(2)) if ranged else 1, ranged))
    return out


# --------------------------------------------------------------------------------------------
# statements


@dataclass(slots=True)
class _RawInstr:
    start: int  # offset of the statement (guard) in the text
    text: str
    labels: tuple[str, ...]  # unique names (perfmodel/ptx/scopes.py)
    scope: int  # index of the innermost { } block holding it (0: the function body)


class _FunctionBuilder:
    def __init__(self, name: str, is_entry: bool, params: tuple[str, ...], line: int) -> None:
        self.name = name
        self.is_entry = is_entry
        self.params = params
        self.line = line
        self.raw: list[_RawInstr] = []
        self.labels: dict[str, int] = {}
        self.shared: list[tuple[str, int, int]] = []
        self.local: list[tuple[str, int, int]] = []
        self.regs: dict[str, int] = {}
        self.tuning: dict[str, tuple[int, ...]] = {}
        self.branch_tables: dict[str, tuple[str, ...]] = {}
        self.table_scopes: dict[str, int] = {}  # .branchtargets label -> its scope
        self.scopes = ScopeTree()


class _Parser:
    def __init__(self, text: str) -> None:
        self.src = _Source(text)
        self.text = self.src.text
        self.n = len(self.text)
        self.version: str | None = None
        self.target: str | None = None
        self.address_size = 32
        self.module_shared: list[tuple[str, int, int]] = []
        self.functions: list[Function] = []

    # ---- scanning primitives
    def skip_ws(self, pos: int) -> int:
        m = _WS_RE.match(self.text, pos)
        return m.end() if m else pos

    def line_end(self, pos: int) -> int:
        e = self.text.find("\n", pos)
        return self.n if e < 0 else e

    def statement_end(self, pos: int) -> int:
        """Offset of the ``;`` ending the statement starting at ``pos``."""
        semi = self.text.find(";", pos)
        if semi < 0:
            raise self.src.error(pos, "statement is not terminated by ';'")
        return semi

    def skip_braced(self, pos: int) -> int:
        """Given ``pos`` at ``{``, the offset just after the matching ``}`` (strings skipped)."""
        depth = 0
        for m in _BRACE_OR_STRING_RE.finditer(self.text, pos):
            ch = m.group(0)
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return m.end()
        raise self.src.error(pos, "'{' is never closed by '}'")

    # ---- module level
    def parse(self) -> Module:
        text = self.text
        pos = self.skip_ws(0)
        if pos >= self.n:
            raise PTXSyntaxError(1, 1, "empty text: a PTX module starts with '.version'")
        while pos < self.n:
            ch = text[pos]
            if text.startswith("@@DWARF", pos):  # old nvcc -G debug lines
                pos = self.skip_ws(self.line_end(pos))
                continue
            if ch != ".":
                raise self.src.error(
                    pos, "expected a directive such as '.version', '.target', '.entry' or '.func'"
                )
            m = _DIRECTIVE_RE.match(text, pos)
            if m is None:
                raise self.src.error(pos, "expected a directive name after '.'")
            word = m.group(1)
            if self.version is None and word != "version":
                raise self.src.error(pos, "a PTX module must start with '.version'")
            if word in ("version", "target", "address_size", "file", "loc"):
                end = self.line_end(pos)
                self.line_directive(word, text[m.end() : end].strip().rstrip(";").strip(), pos)
                pos = self.skip_ws(end)
                continue
            if word == "section":
                brace = text.find("{", pos)
                if brace < 0:
                    raise self.src.error(pos, ".section needs a '{ ... }' body")
                pos = self.skip_ws(self.skip_braced(brace))
                continue
            pos = self.skip_ws(self.module_statement(pos))
        if self.target is None:
            raise PTXSyntaxError(1, 1, "the module has no '.target' directive (e.g. .target sm_80)")
        assert self.version is not None  # the loop refuses any statement before .version
        return Module(
            version=self.version,
            target=self.target,
            address_size=self.address_size,
            functions=tuple(self.functions),
            module_shared_bytes=_layout(self.module_shared),
        )

    def line_directive(self, word: str, arg: str, pos: int) -> None:
        if word == "version":
            if self.version is not None:
                raise self.src.error(pos, "duplicate '.version' directive")
            if not re.fullmatch(r"\d+\.\d+", arg):
                raise self.src.error(pos, f"'.version' needs major.minor, e.g. 8.0, not {arg!r}")
            self.version = arg
        elif word == "target":
            first = arg.split(",", 1)[0].strip()
            if not re.fullmatch(r"\w+", first):
                raise self.src.error(pos, f"'.target' needs an architecture such as sm_80: {arg!r}")
            self.target = first
        elif word == "address_size":
            if arg not in ("32", "64"):
                raise self.src.error(pos, f"'.address_size' must be 32 or 64, not {arg!r}")
            self.address_size = int(arg)
        # .file / .loc: debug information, ignored

    def module_statement(self, pos: int) -> int:
        """Parse one module-level statement at ``pos``; return the offset after it."""
        text = self.text
        # find the end: ';' or a function body '{' at parenthesis depth 0 (an initializer
        # '= { ... }' is skipped)
        i = pos
        depth = 0
        seen_eq = False
        while i < self.n:
            ch = text[i]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch == "=" and depth == 0:
                seen_eq = True
            elif ch == "{" and depth == 0:
                if seen_eq:
                    i = self.skip_braced(i)
                    continue
                head = text[pos:i]
                if not _FUNC_HEAD_RE.search(head):
                    raise self.src.error(pos, "'{' at module level must open an .entry/.func body")
                body_end = self.skip_braced(i)
                self.function(pos, head, i, body_end)
                return body_end
            elif ch == ";" and depth == 0:
                self.module_decl(pos, text[pos:i])
                return i + 1
            elif ch == "}":
                raise self.src.error(i, "unmatched '}' at module level")
            i += 1
        raise self.src.error(pos, "statement is not terminated by ';'")

    def module_decl(self, pos: int, stmt: str) -> None:
        words = stmt.split()
        linkage = {".extern", ".visible", ".weak", ".common"}
        k = 0
        while k < len(words) and words[k] in linkage:
            k += 1
        if k >= len(words):
            raise self.src.error(pos, "declaration has no state space or function")
        kind = words[k]
        if _FUNC_HEAD_RE.match(kind):
            self.function(pos, stmt, None, None)  # prototype only: its header is checked
            return
        if kind == ".shared":
            body = stmt[stmt.index(".shared") + len(".shared") :]
            self.module_shared.extend(_decl_bytes(body, self.src, pos))
            return
        if kind in (".global", ".const", ".local", ".tex", ".surfref", ".texref", ".samplerref"):
            body = stmt[stmt.index(kind) + len(kind) :]
            if kind in (".global", ".const", ".local"):
                _decl_bytes(body, self.src, pos)  # validates the declaration
            return
        if kind in (".alias", ".pragma", ".maxnreg", ".minnctapersm", ".reqntid", ".maxntid"):
            return
        raise self.src.error(pos, f"unknown module-level directive {kind!r}")

    # ---- functions
    def function(self, pos: int, head: str, open_brace: int | None, end: int | None) -> None:
        m = _FUNC_HEAD_RE.search(head)
        assert m is not None
        is_entry = m.group(1) == "entry"
        rest = head[m.end() :]
        hpos = pos + m.end()
        rest_l = rest.lstrip()
        hpos += len(rest) - len(rest_l)
        rest = rest_l
        if rest.startswith("("):  # return parameters of a .func
            close = rest.find(")")
            if close < 0:
                raise self.src.error(hpos, "return parameter list is not closed by ')'")
            rest = rest[close + 1 :].lstrip()
        nm = re.match(r"([A-Za-z_$][\w$]*)", rest)
        if nm is None:
            raise self.src.error(hpos, "expected the function name after .entry/.func")
        name = nm.group(1)
        rest = rest[nm.end() :].lstrip()
        params: list[str] = []
        if rest.startswith("("):
            depth = 0
            close = -1
            for j, ch in enumerate(rest):
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    depth -= 1
                    if depth == 0:
                        close = j
                        break
            if close < 0:
                raise self.src.error(hpos, f"parameter list of {name} is not closed by ')'")
            inner = rest[1:close].strip()
            if inner:
                for p in inner.split(","):
                    # the name is the last word once directives (.param, .align 8, .ptr ...)
                    # and array sizes are removed: ".param .align 8 .b8 p[16]" -> "p"
                    toks = re.sub(r"\.\w+(?:\s+\d+)?|\[[^\]]*\]", " ", p).split()
                    if not toks or not re.fullmatch(r"%?[A-Za-z_$][\w$]*", toks[-1]):
                        raise self.src.error(hpos, f"cannot read parameter {p.strip()!r}")
                    params.append(toks[-1])
            rest = rest[close + 1 :]
        if not _TUNING_RE.fullmatch(rest):
            raise self.src.error(
                hpos, f"unexpected text in the header of {name}: {' '.join(rest.split())[:60]!r}"
            )
        tuning: dict[str, tuple[int, ...]] = {}
        for d in re.finditer(r"\.(\w+)((?:\s*,?\s*\d+)*)", rest):
            nums = tuple(int(x) for x in re.findall(r"\d+", d.group(2)))
            tuning[d.group(1)] = nums
        if open_brace is None or end is None:
            return  # a prototype: nothing to record
        if any(f.name == name for f in self.functions):
            raise self.src.error(hpos, f"function {name} is defined twice")
        fb = _FunctionBuilder(name, is_entry, tuple(params), self.src.pos(pos)[0])
        fb.tuning = tuning
        self.body(fb, open_brace + 1, end - 1)
        self.functions.append(self.finish(fb))

    def body(self, fb: _FunctionBuilder, pos: int, end: int) -> None:
        """Scan the statements of a function body between ``pos`` and the closing brace.

        ``{ }`` blocks (call sequences, inline assembly) open scopes for labels and registers
        (perfmodel/ptx/scopes.py); ``stack`` holds the open ones, innermost last.
        """
        text = self.text
        pending: list[str] = []
        stack = [0]
        scopes = fb.scopes
        pos = self.skip_ws(pos)
        while pos < end:
            ch = text[pos]
            if ch == "{":
                stack.append(scopes.open(stack[-1]))
                pos = self.skip_ws(pos + 1)
                continue
            if ch == "}":
                if len(stack) == 1:
                    raise self.src.error(pos, "'}' closes no '{' block of this function")
                stack.pop()
                pos = self.skip_ws(pos + 1)
                continue
            if ch == ".":
                m = _DIRECTIVE_RE.match(text, pos)
                if m is None:
                    raise self.src.error(pos, "expected a directive name after '.'")
                word = m.group(1)
                if word in ("loc", "file"):
                    pos = self.skip_ws(self.line_end(pos))
                    continue
                semi = self.statement_end(pos)
                if semi > end:
                    raise self.src.error(pos, "statement is not terminated by ';'")
                self.body_directive(fb, word, text[m.end() : semi], pos, pending, stack[-1])
                pos = self.skip_ws(semi + 1)
                continue
            lm = _LABEL_RE.match(text, pos)
            if lm is not None:
                label = lm.group(1)
                unique = label
                if len(stack) > 1:  # nested: named by its line (perfmodel/ptx/scopes.py)
                    unique = scopes.unique(stack[-1], label, *self.src.pos(pos))
                if not scopes.declare_label(stack[-1], label, unique):
                    raise self.src.error(pos, f"label {label!r} is defined twice in one block")
                pending.append(unique)
                pos = self.skip_ws(lm.end())
                continue
            semi = self.statement_end(pos)
            if semi > end:
                raise self.src.error(pos, "statement is not terminated by ';'")
            stmt = text[pos:semi]
            if "}" in stmt or "{" in stmt:
                if stmt.count("{") != stmt.count("}"):
                    raise self.src.error(pos, "statement is not terminated by ';' before a brace")
            for lab in pending:
                fb.labels[lab] = len(fb.raw)
            fb.raw.append(_RawInstr(pos, stmt, tuple(pending), stack[-1]))
            pending = []
            pos = self.skip_ws(semi + 1)
        if len(stack) > 1:
            raise self.src.error(end, "a '{' block of this function is never closed by '}'")
        for lab in pending:  # labels at the very end of the body
            fb.labels[lab] = len(fb.raw)

    def body_directive(
        self,
        fb: _FunctionBuilder,
        word: str,
        rest: str,
        pos: int,
        pending: list[str],
        scope: int,
    ) -> None:
        if word == "reg":
            line, col = self.src.pos(pos)
            for name, count, ranged in _reg_decl(rest, self.src, pos):
                fb.regs[name] = max(fb.regs.get(name, 0), count)
                if scope:
                    fb.scopes.declare_register(scope, name, count if ranged else None, line, col)
        elif word == "shared":
            fb.shared.extend(_decl_bytes(rest, self.src, pos))
        elif word == "local":
            fb.local.extend(_decl_bytes(rest, self.src, pos))
        elif word in ("param", "const", "global"):
            _decl_bytes(rest, self.src, pos)
        elif word == "branchtargets":
            targets = tuple(t.strip() for t in rest.split(","))
            if not pending or not all(re.fullmatch(r"[A-Za-z_$][\w$]*", t) for t in targets):
                raise self.src.error(pos, ".branchtargets needs a label and a list of labels")
            for lab in pending:
                fb.branch_tables[lab] = targets
                fb.table_scopes[lab] = scope
            pending.clear()
        elif word in ("callprototype", "calltargets"):
            pending.clear()  # the label names the prototype/table, not a code position
        elif word in ("pragma", "maxnreg", "maxntid", "reqntid", "minnctapersm", "extern"):
            pass
        else:
            raise self.src.error(pos, f"unknown directive '.{word}' inside a function body")

    # ---- instructions
    def finish(self, fb: _FunctionBuilder) -> Function:
        regnames = {n for n in fb.regs if not n.startswith("%")}
        labels = fb.labels
        scopes = fb.scopes
        label_names = {name for block in scopes.scopes for name in block.labels}
        cache: dict[str, Operand] = {}
        symbols: set[str] = set()
        instrs: list[Instruction] = []
        for raw in fb.raw:
            instrs.append(self.instruction(raw, regnames, label_names, scopes, cache, symbols))
        tables = {
            lab: tuple(scopes.label(fb.table_scopes[lab], t) or t for t in targets)
            for lab, targets in fb.branch_tables.items()
        }
        shared = list(fb.shared)
        # module-scope .shared variables the function refers to count for it too
        shared.extend(v for v in self.module_shared if v[0] in symbols)
        return Function(
            name=fb.name,
            is_entry=fb.is_entry,
            params=fb.params,
            instructions=tuple(instrs),
            label_index=dict(labels),
            shared_bytes=_layout(shared),
            local_bytes=_layout(fb.local),
            register_declarations=dict(fb.regs),
            tuning=fb.tuning,
            branch_tables=tables,
            line=fb.line,
        )

    def instruction(
        self,
        raw: _RawInstr,
        regnames: set[str],
        labels: set[str],
        scopes: ScopeTree,
        cache: dict[str, Operand],
        symbols: set[str],
    ) -> Instruction:
        m = _INSTR_RE.match(raw.text)
        if m is None:
            raise self.src.error(
                raw.start, f"not a PTX instruction: {_SPACE_CHARS.sub(' ', raw.text)[:60]!r}"
            )
        op_off = raw.start + m.start("op")
        opcode = m.group("op")
        mods_s = m.group("mods")
        modifiers = tuple(mods_s[1:].split(".")) if mods_s else ()
        args = m.group("args")
        if args is not None:
            args = args.rstrip()
        operands: list[Operand] = []
        if args:
            pieces = _split_operands(self.src, op_off, args, f"operands of {opcode}")
            for piece in pieces:
                p = piece.strip()
                o = cache.get(p)
                if o is None:
                    o = self._operand(p, regnames, labels, op_off, opcode)
                    cache[p] = o
                    if o.kind in ("symbol", "address"):
                        symbols.update(_NAME_RE.findall(p))
                operands.append(o)
        for k, o in enumerate(operands if raw.scope or opcode in ("bra", "brx") else ()):
            if o.kind == "label":
                unique = scopes.label(raw.scope, o.text)
                if unique is None and opcode in ("bra", "brx"):
                    # PTX ISA: a label is visible in its { } block and the blocks inside it
                    where = scopes.declared_elsewhere(o.text)
                    raise self.src.error(
                        op_off,
                        f"{opcode} target {o.text!r} is declared only inside another {{ }} "
                        f"block ({where}); a branch reaches the labels of its own block and of "
                        "the blocks around it",
                    )
                if unique is not None and unique != o.text:
                    operands[k] = Operand(unique, "label", ())
        if opcode == "bra" and (not operands or operands[0].kind != "label"):
            # an undeclared target would silently drop the edge from the CFG (ptxas refuses it)
            target = operands[0].text if operands else ""
            raise self.src.error(
                op_off, f"bra target {target!r} is not a label declared in this function"
            )
        guard = m.group("guard")
        if guard is not None and not (guard.startswith("%") or guard in regnames):
            raise self.src.error(raw.start, f"guard {guard!r} is not a predicate register")
        # defs: the first operand of an instruction that writes one
        defs: tuple[str, ...] = ()
        first_src = 0
        if operands and opcode not in _NO_DEST_OPCODES:
            o0 = operands[0]
            if opcode == "call":
                if o0.text.startswith("(") and len(operands) >= 2:
                    defs = o0.registers
                    first_src = 1
            elif o0.kind == "register":
                defs = o0.registers
                first_src = 1
            elif o0.kind == "vector" and not (opcode == "wmma" and "store" in modifiers):
                defs = tuple(r for r in o0.registers if not _is_special(r))
                first_src = 1
        uses: list[str] = []
        for o in operands[first_src:]:
            uses.extend(o.registers)
        if guard is not None:
            uses.append(guard)
        if scopes.renames(raw.scope):
            # registers declared in an enclosing { } block get their unique names
            def rename(r: str) -> str:
                return scopes.register(raw.scope, r)

            operands = [
                Operand(o.text, o.kind, tuple(map(rename, o.registers)), o.offset)
                if o.registers
                else o
                for o in operands
            ]
            defs = tuple(map(rename, defs))
            uses = [rename(r) for r in uses]
            guard = rename(guard) if guard is not None else None
        line, col = self.src.pos(op_off)
        return Instruction(
            line=line,
            column=col,
            text=" ".join(raw.text.split()),
            opcode=opcode,
            modifiers=modifiers,
            full_opcode=opcode + mods_s,
            operands=tuple(operands),
            guard=guard,
            guard_negated=m.group("neg") == "!",
            defs=defs,
            uses=tuple(dict.fromkeys(uses)),
            labels=raw.labels,
        )

    def _operand(
        self, p: str, regnames: set[str], labels: Collection[str], at: int, opcode: str
    ) -> Operand:
        if not p:
            raise self.src.error(at, f"empty operand in {opcode}; check the commas")
        c = p[0]
        if c == "[":
            if not p.endswith("]"):
                raise self.src.error(at, f"address operand {p!r} must end with ']'")
            regs, off = self._address_inner(p[1:-1], regnames, at)
            return Operand(p, "address", regs, off)
        if c == "{" or c == "(":
            close = "}" if c == "{" else ")"
            if not p.endswith(close):
                raise self.src.error(at, f"operand {p!r} must end with {close!r}")
            regs_l: list[str] = []
            inner = p[1:-1].strip()
            if inner:
                elements = _split_operands(self.src, at, inner, f"operand {p!r}")
                for e in elements:
                    e = e.strip()
                    if e == "_" or _IMM_RE.match(e):
                        continue
                    if e.startswith("["):
                        sub = self._operand(e, regnames, labels, at, opcode)
                        regs_l.extend(sub.registers)
                        continue
                    mm = _REG_TOKEN_RE.match(e)
                    if mm is None:
                        raise self.src.error(at, f"cannot read element {e!r} of {p!r}")
                    name = mm.group(1)
                    if name.startswith("%") or name in regnames:
                        regs_l.append(name)
            return Operand(p, "vector" if c == "{" else "symbol", tuple(regs_l))
        if _IMM_RE.match(p):
            return Operand(p, "immediate", ())
        pair = _PAIR_RE.match(p)
        if pair is not None:  # setp/shfl destination pair %p|%q
            return Operand(p, "register", (pair.group(1), pair.group(2)))
        mm = _REG_TOKEN_RE.match(p)
        if mm is not None:
            name = mm.group(1)
            if name.startswith("%"):
                if _is_special(name):
                    return Operand(p, "special", (name,))
                if "." in name and name.rsplit(".", 1)[1] not in ("x", "y", "z", "w"):
                    raise self.src.error(at, f"{name!r} is not a register or special register")
                # %v.x: a component of a vector register counts as the register itself
                return Operand(p, "register", (name.split(".", 1)[0],))
            if name in regnames:
                return Operand(p, "register", (name,))
            if name in labels:
                return Operand(p, "label", ())
            if "." in name:
                raise self.src.error(at, f"cannot read operand {p!r}")
            return Operand(p, "symbol", ())
        # symbol+offset outside brackets (e.g. mov.u64 %rd1, table+8)
        terms = _TERM_SPLIT_RE.split(p)
        if len(terms) >= 3 and re.fullmatch(r"[A-Za-z_$][\w$]*", terms[0]):
            regs, off = self._address_inner(p, regnames, at)
            if not regs:
                return Operand(p, "symbol", (), off)
        raise self.src.error(at, f"cannot read operand {p!r} of {opcode}")

    def _address_inner(
        self, inner: str, regnames: set[str], at: int
    ) -> tuple[tuple[str, ...], int]:
        inner = inner.strip()
        if not inner:
            raise self.src.error(at, "empty address '[]'")
        if "," in inner or "{" in inner:  # texture/surface: [tex, {coords}]
            regs: list[str] = []
            parts = _split_operands(self.src, at, inner, f"address [{inner}]")
            for part in parts:
                part = part.strip()
                if part.startswith("{"):
                    regs.extend(self._operand(part, regnames, {}, at, "tex").registers)
                else:
                    r, _ = self._address_inner(part, regnames, at)
                    regs.extend(r)
            return tuple(regs), 0
        regs_t: list[str] = []
        offset = 0
        pos = 0
        first = True
        for tm in _TERM_RE.finditer(inner):
            if tm.start() != pos or (not first and not tm.group(1)):
                raise self.src.error(at, f"cannot read address [{inner}]; expected name+offset")
            pos = tm.end()
            first = False
            sign = -1 if tm.group(1).count("-") % 2 else 1
            t = tm.group(2)
            v = _int_literal(t)
            if v is not None:
                offset += sign * v
                continue
            if re.fullmatch(r"%?[A-Za-z_$][\w$]*(?:\.[xyz])?", t) is None:
                raise self.src.error(at, f"cannot read address term {t!r} in [{inner}]")
            if sign < 0:
                raise self.src.error(at, f"address [{inner}] subtracts a name; only +/- constants")
            if t.startswith("%") or t in regnames:
                regs_t.append(t)
        if pos != len(inner):
            raise self.src.error(at, f"cannot read address [{inner}]; expected name+offset")
        return tuple(regs_t), offset


def parse_module(text: str) -> Module:
    """Parse PTX module text; raises PTXSyntaxError(line, column, message) if it is not PTX."""
    if not isinstance(text, str):
        raise TypeError("parse_module expects the PTX text as str")
    # The parse allocates one object per instruction and operand and creates no reference
    # cycles; pausing the cyclic collector saves its repeated scans (about 20% on 20k lines).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _Parser(text).parse()
    finally:
        if was_enabled:
            gc.enable()
