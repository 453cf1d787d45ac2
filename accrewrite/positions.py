"""Where nodes start, computed only for the nodes a report names.

libcst's PositionProvider records a range for every node of the file and was the costliest
step of a migration (several times a plain codegen). A report needs the start of a few nodes,
so this prints the module once, noting how many tokens had been printed when each of those
nodes started and stopping as soon as all are found; lines and columns are then counted over
the printed text in one go. It builds on libcst's CodegenState, the same (internal) hook its
own position providers use.
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
    # Each wanted node found so far: the number of tokens printed before it.
    found: dict = field(default_factory=dict)

    @contextmanager
    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        if node in self.wanted and node not in self.found:
            self.found[node] = len(self.tokens)
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
    line, column, printed = 1, 0, 0
    at: dict[int, tuple[int, int]] = {}
    for index in sorted(set(state.found.values())):
        text = "".join(state.tokens[printed:index])
        printed = index
        # A line ends at "\n", "\r\n" or a lone "\r" (old Mac files).
        newlines = text.count("\n") + text.count("\r") - text.count("\r\n")
        if newlines:
            line += newlines
            column = len(text) - max(text.rfind("\n"), text.rfind("\r")) - 1
        else:
            column += len(text)
        at[index] = (line, column)
    return {node: at[index] for node, index in state.found.items()}
