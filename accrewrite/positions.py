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

A changed file is printed twice, as parsed (the findings' lines, the round-trip check) and as
rewritten; ``code_reusing`` prints again only the statements that the rewrite made, at any depth:
a statement it kept takes its tokens from the first print.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState

from accrewrite.nodes import STATEMENT_TYPES, node_types, rebuilt


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
    if node is not None:
        node._codegen(state)
        return "".join(state.tokens)
    _print_module(module, state)
    return _module_text(module, state.tokens)


def code_bytes(module: cst.Module) -> bytes:
    """``module.bytes``, printed faster."""
    return code(module).encode(module.encoding)


def _print_module(module: cst.Module, state: CodegenState) -> list[int]:
    """``Module._codegen_impl`` but for its last line (``_module_text``): the token where each
    statement of the body starts, and then where the footer does."""
    bounds = []
    for line in module.header:
        line._codegen(state)
    for statement in module.body:
        bounds.append(len(state.tokens))
        statement._codegen(state)
    bounds.append(len(state.tokens))
    for line in module.footer:
        line._codegen(state)
    return bounds


def _module_text(module: cst.Module, tokens: list[str]) -> str:
    """The text of a module printed as ``tokens``: every printed line ends in a newline, the
    file's last maybe not."""
    if module.has_trailing_newline:
        return "".join(tokens) if tokens else module.default_newline
    return "".join(tokens[:-1])


@dataclass
class Printed:
    """A module's whole print, kept so that a rewrite of it need not print again the statements
    it kept."""

    module: cst.Module
    tokens: list[str]
    bounds: list[int]  # see ``_print_module``
    text: str
    # Each statement's print, by the statement's id: its first and past-last token, and the
    # indentation it was printed at.
    spans: dict[int, tuple[int, int, tuple[str, ...]]]


def code_reusing(module: cst.Module, printed: Printed) -> bytes:
    """``code_bytes(module)`` for a rewrite of ``printed.module``: a statement that the rewrite
    kept (the same node) prints as it did there, where its indentation is the same."""
    original = printed.module
    if (len(module.header) != len(original.header) or len(module.footer) != len(original.footer)
            or any(a is not b for a, b in zip((*module.header, *module.footer), (*original.header, *original.footer)))
            or (module.has_trailing_newline, module.default_indent, module.default_newline, module.encoding)
            != (original.has_trailing_newline, original.default_indent, original.default_newline, original.encoding)):
        return code_bytes(module)
    bounds, old = printed.bounds, printed.tokens
    state = _Printer(default_indent=module.default_indent, default_newline=module.default_newline)
    tokens = state.tokens
    tokens += old[:bounds[0]]
    for statement in module.body:
        _reprinted(statement, printed)._codegen(state)
    tokens += old[bounds[-1]:]
    return _module_text(module, tokens).encode(module.encoding)


# The nodes that hold blocks of statements, or are such a block.
_HOLDERS = node_types(cst.BaseCompoundStatement, cst.IndentedBlock, cst.Else, cst.Finally, cst.ExceptHandler,
                      cst.ExceptStarHandler, cst.MatchCase)


def _reprinted(statement: cst.CSTNode, printed: Printed) -> cst.CSTNode:
    """``statement`` to print: the whole print's tokens where it was kept, else the statement
    with the statements kept inside it so (the nodes around them rebuilt)."""
    spans = printed.spans

    def enter(node):
        return type(node) in _HOLDERS and id(node) not in spans

    def leave(original_node, updated_node):
        span = spans.get(id(original_node))
        return updated_node if span is None else _Kept(original_node, printed.tokens, *span)

    return rebuilt(statement, leave, enter)


@dataclass(frozen=True)
class _Kept(cst.CSTNode):
    """A statement that a rewrite kept, standing in for it in the print of the rewrite."""

    node: cst.CSTNode
    tokens: list[str]  # the whole print's
    start: int
    end: int
    indent: tuple[str, ...]

    def _visit_and_replace_children(self, visitor) -> "_Kept":
        return self

    def _codegen_impl(self, state: CodegenState) -> None:
        if tuple(state.indent_tokens) == self.indent:
            state.tokens += self.tokens[self.start:self.end]
        else:  # moved into another block
            self.node._codegen(state)


class _AllFound(Exception):
    pass


@dataclass
class _StartFinder(_Printer):
    # The ids of the wanted nodes (a node hashes by a Python method of libcst's).
    wanted: set = field(default_factory=set)
    # Each wanted node found so far, by id: the number of tokens printed before it.
    found: dict = field(default_factory=dict)
    # Whether to print the whole module (its text is wanted too) rather than stop at the last node.
    whole: bool = False

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        key = id(node)
        if key in self.wanted and key not in self.found:
            self.found[key] = len(self.tokens)
            if len(self.found) == len(self.wanted) and not self.whole:
                raise _AllFound
        return _NOTHING


@dataclass
class _WholePrinter(_StartFinder):
    """A whole print that notes each statement's print (``Printed.spans``)."""

    spans: dict = field(default_factory=dict)
    # The start and indentation of each statement being printed, innermost last.
    _open: list = field(default_factory=list)
    # The ids of the ``If`` statements printed as ``elif`` (their print stands only there).
    _elifs: set = field(default_factory=set)

    def before_codegen(self, node) -> None:
        kind = type(node)
        if kind in STATEMENT_TYPES:
            if kind is cst.If and type(node.orelse) is cst.If:
                self._elifs.add(id(node.orelse))
            self._open.append((len(self.tokens), tuple(self.indent_tokens)))

    def after_codegen(self, node) -> None:
        if type(node) in STATEMENT_TYPES:
            start, indent = self._open.pop()
            if id(node) not in self._elifs:
                self.spans[id(node)] = (start, len(self.tokens), indent)


def starts(module: cst.Module, nodes) -> dict[cst.CSTNode, tuple[int, int]]:
    """(line, column) where each of ``nodes`` starts: line 1-based, column 0-based."""
    return _starts(module, nodes, whole=False)[0]


def starts_and_code(module: cst.Module, nodes) -> tuple[dict[cst.CSTNode, tuple[int, int]], Printed]:
    """``starts(module, nodes)`` and the module's whole print (``Printed.text``: ``module.code``)."""
    return _starts(module, nodes, whole=True)


def _starts(module: cst.Module, nodes, whole: bool) -> tuple[dict[cst.CSTNode, tuple[int, int]], Printed | None]:
    state = (_WholePrinter if whole else _StartFinder)(default_indent=module.default_indent,
                                                       default_newline=module.default_newline)
    by_id = {id(node): node for node in nodes}
    state.wanted = set(by_id)
    state.whole = whole
    bounds = []
    if state.wanted or whole:
        try:
            bounds = _print_module(module, state)
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
    found = {by_id[key]: at[index] for key, index in state.found.items()}
    if not whole:
        return found, None
    return found, Printed(module, state.tokens, bounds, _module_text(module, state.tokens), state.spans)
