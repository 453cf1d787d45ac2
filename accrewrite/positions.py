"""Printing a module, and where nodes start, computed only for the nodes a report names.

libcst's PositionProvider records a range for every node of the file and was the costliest
step of a migration (several times a plain codegen). A report needs the start of a few nodes,
so this prints the module once, noting how many tokens had been printed when each of those
nodes started and stopping as soon as all are found; lines and columns are then counted over
the printed text in one go. It builds on libcst's CodegenState, the same (internal) hook its
own position providers use.

Printing itself goes through that hook too: libcst's plain state enters a generator-based context
manager around every node (``record_syntactic_position``, which records nothing), a good part of
a print's time; ``_Printer`` enters one reusable object that does nothing, and prints the same text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_NOTHING = _Nothing()


class _Printer(CodegenState):
    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        return _NOTHING


def code(module: cst.Module, node: cst.CSTNode | None = None) -> str:
    """``module.code_for_node(node)`` (``module.code`` without ``node``), printed faster."""
    state = _Printer(default_indent=module.default_indent, default_newline=module.default_newline)
    (module if node is None else node)._codegen(state)
    return "".join(state.tokens)


def code_bytes(module: cst.Module) -> bytes:
    """``module.bytes``, printed faster."""
    return code(module).encode(module.encoding)


class _AllFound(Exception):
    pass


@dataclass
class _StartFinder(_Printer):
    wanted: set = field(default_factory=set)
    # Each wanted node found so far: the number of tokens printed before it.
    found: dict = field(default_factory=dict)
    # Whether to print the whole module (its text is wanted too) rather than stop at the last node.
    whole: bool = False

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        if node in self.wanted and node not in self.found:
            self.found[node] = len(self.tokens)
            if len(self.found) == len(self.wanted) and not self.whole:
                raise _AllFound
        return _NOTHING


def starts(module: cst.Module, nodes) -> dict[cst.CSTNode, tuple[int, int]]:
    """(line, column) where each of ``nodes`` starts: line 1-based, column 0-based."""
    return _starts(module, nodes, whole=False)[0]


def starts_and_code(module: cst.Module, nodes) -> tuple[dict[cst.CSTNode, tuple[int, int]], str]:
    """``starts(module, nodes)`` and ``module.code``, from one print of the module."""
    return _starts(module, nodes, whole=True)


def _starts(module: cst.Module, nodes, whole: bool) -> tuple[dict[cst.CSTNode, tuple[int, int]], str]:
    state = _StartFinder(default_indent=module.default_indent, default_newline=module.default_newline)
    state.wanted = set(nodes)
    state.whole = whole
    if state.wanted or whole:
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
    return {node: at[index] for node, index in state.found.items()}, "".join(state.tokens) if whole else ""
