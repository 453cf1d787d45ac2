"""Where nodes start, computed only for the nodes a report names.

libcst's PositionProvider records a range for every node of the file and was the costliest
step of a migration (several times a plain codegen). A report needs the start of a few nodes,
so this prints the module once with a codegen state that counts lines and columns and notes
the start of just those nodes, stopping as soon as all are found. It builds on libcst's
CodegenState, the same (internal) hook its own position providers use.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState


class _AllFound(Exception):
    pass


@dataclass
class _StartFinder(CodegenState):
    wanted: set = field(default_factory=set)
    found: dict = field(default_factory=dict)
    line: int = 1
    column: int = 0

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        newlines = value.count("\n") or value.count("\r")
        if newlines:
            self.line += newlines
            self.column = len(value) - max(value.rfind("\n"), value.rfind("\r")) - 1
        else:
            self.column += len(value)

    @contextmanager
    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        if node in self.wanted and node not in self.found:
            self.found[node] = (self.line, self.column)
            if len(self.found) == len(self.wanted):
                raise _AllFound
        yield


def starts(module: cst.Module, nodes) -> dict[cst.CSTNode, tuple[int, int]]:
    """(line, column) where each of ``nodes`` starts: line 1-based, column 0-based."""
    state = _StartFinder(default_indent=module.default_indent, default_newline=module.default_newline)
    state.wanted = set(nodes)
    if state.wanted:
        try:
            module._codegen(state)
        except _AllFound:
            pass
    return state.found
