"""Adding the import lines that fixes need.

libcst's AddImportsVisitor does this for codemods in general, at the cost of two more walks of
the whole tree (a gathering visitor and a transformer); it was two thirds of a file's migration
time. The analysis pass already knows every name the file imports, and new imports only ever go
at module level, so this edits the module's top-level body directly.
"""

from __future__ import annotations

import libcst as cst

from accrewrite import snippets
from accrewrite.facts import Facts
from accrewrite.nodes import dotted
from accrewrite.targets import import_bindings


def _is_import(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def missing(module: cst.Module, facts: Facts, lines: list[str]) -> list[cst.SimpleStatementLine]:
    """The import lines (one name each) whose name the file does not already bind to that
    module, parsed."""
    config = module.config_for_parsing
    statements = [(line, snippets.statement(line, config)) for line in lines]
    return [statement for line, statement in statements if not _present(facts, line, statement)]


def _present(facts: Facts, line: str, statement: cst.SimpleStatementLine) -> bool:
    node = statement.body[0]
    if isinstance(node, cst.Import) and node.names[0].asname is None:
        # ``import a.b.c`` loads a.b.c (its side effects matter: a backend registers itself),
        # which ``import a`` does not.
        return dotted(node.names[0].name) in facts.file.imported_modules
    ((local, qualified),) = import_bindings(line)
    return facts.file.imports.get(local) == qualified


def leading_imports_end(body) -> int:
    """Index just past a module body's docstring and leading block of imports."""
    position = 0
    for index, statement in enumerate(body):
        if _is_import(statement) or (index == 0 and _is_docstring(statement)):
            position = index + 1
        else:
            break
    return position


def first_import(body) -> int:
    """Index of the first import of a module body's leading imports, past its docstring and
    ``__future__`` imports: what runs before everything the file imports goes there."""
    end = leading_imports_end(body)
    for index in range(end):
        statement = body[index]
        if isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], (cst.Import, cst.ImportFrom)):
            if not (isinstance(statement.body[0], cst.ImportFrom) and getattr(statement.body[0].module, "value", "") == "__future__"):
                return index
    return min(end, len(body) - 1)


def add_imports(module: cst.Module, facts: Facts, lines: list[str]) -> cst.Module:
    """``module`` with each import line (one name per line) added unless the file already binds
    that name to that module. New lines go after the file's leading block of imports (after its
    docstring when it has none)."""
    new = missing(module, facts, lines)
    if not new:
        return module
    body = list(module.body)
    position = leading_imports_end(body)
    if position == 0 and body:
        # No leading imports: keep the file's header comments above the new lines.
        new[0] = new[0].with_changes(leading_lines=body[0].leading_lines)
        body[0] = body[0].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:position], *new, *body[position:]])
