"""Block scopes of a PTX function body: which label and register a name means where.

PTX ISA ("Statements", "Identifiers": a ``{ }`` statement block opens a scope): labels and
``.reg`` variables declared inside a block are visible in that block and the blocks nested in
it, and may reuse names of enclosing or sibling blocks. CUTLASS's inline-assembly barrier waits
rely on it: every ``mbarrier.try_wait`` block declares its own predicate ``P1`` and labels
``LAB_WAIT``/``DONE``.

The parser gives every name declared in a nested block a function-wide unique name,
``name@line`` (``name@line:column`` when two such declarations share a line), and keeps
function-scope names as written, so that the IR, the CFG and the analyses key labels and
registers by one string each, and a loop header in ``loop_trip_counts`` is named the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Scope", "ScopeTree"]

_INDEXED = re.compile(r"(.*?)(\d+)\Z")


@dataclass(slots=True)
class Scope:
    """One ``{ }`` block (index 0 is the function body itself)."""

    parent: int  #: index of the enclosing scope; -1 for the function body
    labels: dict[str, str] = field(default_factory=dict)  #: name as written -> unique name
    registers: dict[str, str] = field(default_factory=dict)  #: ``P1`` -> ``P1@712``
    #: parameterized declarations ``.reg .b32 %t<4>``: prefix -> (count, unique suffix)
    register_ranges: dict[str, tuple[int, str]] = field(default_factory=dict)


class ScopeTree:
    """The scopes of one function body, built while scanning it, queried when resolving."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = [Scope(parent=-1)]
        self._taken: set[str] = set()  # unique names handed out for nested declarations
        self._renames: list[bool] = [False]  # scope i declares registers

    def open(self, parent: int) -> int:
        """A new block inside ``parent``; returns its index."""
        self.scopes.append(Scope(parent=parent))
        self._renames.append(False)
        return len(self.scopes) - 1

    def unique(self, scope: int, name: str, line: int, column: int) -> str:
        """The function-wide name of ``name`` declared in ``scope`` at ``line``/``column``."""
        if scope == 0:
            return name
        candidate = f"{name}@{line}"
        if candidate in self._taken:
            candidate = f"{name}@{line}:{column}"
        self._taken.add(candidate)
        return candidate

    def declare_label(self, scope: int, name: str, unique: str) -> bool:
        """Record a label; False when the block already declares one of that name."""
        labels = self.scopes[scope].labels
        if name in labels:
            return False
        labels[name] = unique
        return True

    def declare_register(
        self, scope: int, name: str, count: int | None, line: int, column: int
    ) -> None:
        """Record a ``.reg`` name declared in ``scope`` at ``line``/``column``; ``count`` for a
        parameterized ``%t<4>`` (names ``%t0``..``%t3``), None for a plain name."""
        if scope == 0:
            return  # function-scope registers keep their names
        tag = self.unique(scope, name, line, column)[len(name) + 1 :]
        s = self.scopes[scope]
        if count is None:
            s.registers[name] = f"{name}@{tag}"
        else:
            s.register_ranges[name] = (count, tag)
        self._renames[scope] = True

    def renames(self, scope: int) -> bool:
        """True when a register name used in ``scope`` may refer to a nested declaration."""
        s = scope
        while s > 0:
            if self._renames[s]:
                return True
            s = self.scopes[s].parent
        return False

    def register(self, scope: int, name: str) -> str:
        """The unique name of register ``name`` as seen from ``scope``."""
        s = scope
        while s > 0:
            block = self.scopes[s]
            found = block.registers.get(name)
            if found is not None:
                return found
            if block.register_ranges:
                m = _INDEXED.match(name)
                if m is not None and m.group(1) in block.register_ranges:
                    count, suffix = block.register_ranges[m.group(1)]
                    if int(m.group(2)) < count:
                        return f"{name}@{suffix}"
            s = block.parent
        return name

    def label(self, scope: int, name: str) -> str | None:
        """The unique name of label ``name`` as seen from ``scope``; None if not visible."""
        s = scope
        while s >= 0:
            block = self.scopes[s]
            found = block.labels.get(name)
            if found is not None:
                return found
            s = block.parent
        return None

    def declared_elsewhere(self, name: str) -> str | None:
        """The unique name of some declaration of label ``name`` (for error messages)."""
        for block in self.scopes:
            if name in block.labels:
                return block.labels[name]
        return None
