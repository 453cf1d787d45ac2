"""Guarded (dual-path) output, the form of TorchAcc's migration guide: the original code runs unless an environment
variable is set, and the target's code runs when it is.

A migrated statement becomes ``if enabled(): <new> else: <original>``; an inserted statement
becomes ``if enabled(): <new>``; a removed one ``if not enabled(): <original>``; neighbours in
one block share one ``if``. The target's imports live in an ``if enabled():`` block at module
level, after ``def enabled(): return os.getenv(VAR) is not None``, so the script still runs
where the target is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accrewrite.facts import Facts
from accrewrite.imports import leading_imports_end, missing


@dataclass
class Guard:
    variable: str
    function: str
    # Markers the transformer puts in a block's body, merged into ifs when the block is left:
    # marker -> (new statements, original statements).
    _pairs: dict[cst.CSTNode, tuple[list, list]] = field(default_factory=dict)
    used: bool = False

    def call(self) -> cst.Call:
        return cst.Call(func=cst.Name(self.function))

    def branch(self, test: cst.BaseExpression) -> str | None:
        """"on" for ``if enabled():``, "off" for ``if not enabled():``, else None."""
        if isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and test.func.value == self.function:
            return "on"
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return "off" if self.branch(test.expression) == "on" else None
        return None

    def pair(self, new: list, old: list) -> cst.CSTNode:
        """A placeholder statement standing for "new if enabled, else old"."""
        marker = cst.SimpleStatementLine([cst.Pass()])
        self._pairs[marker] = (new, old)
        self.used = True
        return marker

    def merge(self, body: list) -> list:
        """``body`` with each run of adjacent placeholders turned into one if/else."""
        merged: list = []
        run_new: list = []
        run_old: list = []

        def flush():
            if run_new or run_old:
                merged.append(self._if(list(run_new), list(run_old)))
                run_new.clear()
                run_old.clear()

        for statement in body:
            if statement in self._pairs:
                new, old = self._pairs.pop(statement)
                run_new.extend(new)
                run_old.extend(old)
            else:
                flush()
                merged.append(statement)
        flush()
        return merged

    def _if(self, new: list, old: list) -> cst.If:
        # Comments and blank lines above the first statement stay above the if.
        first = (old or new)[0]
        leading = first.leading_lines
        new = _strip_leading(new)
        old = _strip_leading(old)
        if new:
            orelse = cst.Else(body=cst.IndentedBlock(old)) if old else None
            return cst.If(test=self.call(), body=cst.IndentedBlock(new), orelse=orelse, leading_lines=leading)
        negated = cst.UnaryOperation(operator=cst.Not(), expression=self.call())
        return cst.If(test=negated, body=cst.IndentedBlock(old), leading_lines=leading)

    def finish(self, module: cst.Module, facts: Facts, import_lines: list[str]) -> cst.Module:
        """Add the switch function (and ``import os``) and the target's imports in an
        ``if enabled():`` block, after the file's imports as in TorchAcc's migration guide; when guarded code
        runs before the file's imports (hooks that patch torch first), the switch goes at the
        very top instead, after the docstring and ``__future__`` imports."""
        if not self.used:
            return module
        config = module.config_for_parsing
        body = list(module.body)
        top = _header_end(body)
        early = top < len(body) and isinstance(body[top], cst.If) and self.branch(body[top].test) is not None
        position = self._imports_end(body, top)
        switch = []
        if early or facts.file.imports.get("os") != "os":
            switch.append(cst.parse_statement("import os\n", config=config))
        if not _defines(module, self.function):
            switch.append(
                cst.parse_statement(
                    f"def {self.function}():\n    return os.getenv({self.variable!r}) is not None\n", config=config
                ).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
            )
        guarded_imports = []
        imports = missing(module, facts, import_lines)
        if imports:
            guarded_imports.append(
                cst.If(test=self.call(), body=cst.IndentedBlock(imports), leading_lines=[cst.EmptyLine()])
            )
        if position < len(body):
            body[position] = body[position].with_changes(leading_lines=[cst.EmptyLine(), *body[position].leading_lines])
        if early:
            return module.with_changes(
                body=[*body[:top], *switch, *body[top:position], *guarded_imports, *body[position:]]
            )
        return module.with_changes(body=[*body[:position], *switch, *guarded_imports, *body[position:]])

    def _imports_end(self, body, top: int) -> int:
        """Index just past the file's leading imports, after any guarded code at the top."""
        position = top
        while position < len(body) and isinstance(body[position], cst.If) and self.branch(body[position].test):
            position += 1
        return position + leading_imports_end(body[position:])


def _header_end(body) -> int:
    """Index just past a module's docstring and ``from __future__`` imports."""
    position = 0
    for index, statement in enumerate(body):
        first = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        is_future = isinstance(first, cst.ImportFrom) and not first.relative and getattr(first.module, "value", None) == "__future__"
        is_docstring = index == 0 and isinstance(first, cst.Expr) and isinstance(first.value, (cst.SimpleString, cst.ConcatenatedString))
        if is_future or is_docstring:
            position = index + 1
        else:
            break
    return position


def _defines(module: cst.Module, name: str) -> bool:
    return any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in module.body)


def _strip_leading(statements: list) -> list:
    if not statements:
        return statements
    return [statements[0].with_changes(leading_lines=[]), *statements[1:]]


def flatten(result) -> list:
    """A leave_ result as a list of statements."""
    if isinstance(result, cst.RemovalSentinel):
        return []
    if isinstance(result, cst.FlattenSentinel):
        return list(result.nodes)
    return [result]
