"""One libcst walk that runs every selected rule of a file.

Walking the tree once per rule would cost a traversal each; instead the rules' ``visit_<Node>``
and ``leave_<Node>`` methods are gathered into tables by node type and called from a single
transformer. Each ``leave_`` call is a small transaction: the fixes, imports and insertions a
rule records while returning a changed node are kept only when the change is kept (not withheld
as an unsafe fix, not suppressed by ``# noqa``), and a target that lacks a concept turns the
rule's change into a "not available on this target" diagnostic (an optional concept that a rule
asks for mid-way; a rule whose required concepts the target lacks is not run at all).

The walk is libcst's visit, but for one thing: a node is rebuilt only where something under it
changed (libcst rebuilds every node it enters), so a file the rules leave alone is not printed
again. The walk also keeps the context rules read (enclosing function, statement and training loop),
applies insertions when their statement is left, and in guarded mode turns every changed
statement into TorchAcc's migration guide's ``if enabled(): new else: original`` form.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import libcst as cst

from accrewrite.nodes import STATEMENT_TYPES, Replacing, children, node_types
from accrewrite.guard import Guard, flatten
from accrewrite.rule import Rule, RuleContext
from accrewrite.targets import ConceptMissing

# Whitespace, comments and punctuation: the walk does not enter them (entering one would rebuild
# it and its whitespace), except those that a rule (of a third-party pack) visits or leaves.
_TOKEN_TYPES = node_types(
    cst.BaseParenthesizableWhitespace, cst.TrailingWhitespace, cst.EmptyLine, cst.Newline, cst.Comment,
    cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp, cst.BaseAugOp,
    cst.Comma, cst.Dot, cst.Colon, cst.Semicolon, cst.AssignEqual, cst.ImportStar,
    cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
)


_TOKEN_NAMES = frozenset(kind.__name__ for kind in _TOKEN_TYPES)


@functools.lru_cache(maxsize=64)
def walked_types(rules: tuple[type[Rule], ...]) -> frozenset[str] | None:
    """Names of the node types the walk acts on for ``rules``: statements (whose context,
    insertions and guards it keeps) and every type a rule visits or leaves. A subtree without
    any of them (``Facts.inert``) is not entered: nothing there can change or be reported, and
    not entering it saves libcst rebuilding it. None (every subtree is entered) when a rule
    visits whitespace or punctuation, which the analysis does not look at. Cached: every file of
    a run has the same rules."""
    names = {kind.__name__ for kind in STATEMENT_TYPES}
    for rule in rules:
        names.update(attribute.split("_", 1)[1] for attribute in dir(rule) if attribute.startswith(("visit_", "leave_")))
    if names & _TOKEN_NAMES:
        return None
    return frozenset(names)


@functools.lru_cache(maxsize=64)
def _methods(rules: tuple[type[Rule], ...]) -> tuple[dict, dict]:
    """By node type name, the (index in ``rules``, method name) of the rules' ``visit_`` and
    ``leave_`` methods, in the rules' order. Cached: every file of a run has the same rules."""
    visitors: dict[str, list] = defaultdict(list)
    leavers: dict[str, list] = defaultdict(list)
    for index, rule in enumerate(rules):
        for attribute in dir(rule):
            if attribute.startswith("visit_"):
                visitors[attribute[6:]].append((index, attribute))
            elif attribute.startswith("leave_"):
                leavers[attribute[6:]].append((index, attribute))
    return dict(visitors), dict(leavers)


@functools.lru_cache(maxsize=64)
def _unvisited_tokens(visited: frozenset[str]) -> frozenset[type]:
    """The token types that no rule visits or leaves, of those the walk may pass over."""
    return frozenset(kind for kind in _TOKEN_TYPES if kind.__name__ not in visited)


class RuleBug(RuntimeError):
    """A rule changed code without recording a fix: it could not be reported or guarded."""


# A libcst transformer: its visit is the rewrite where a rule visits what ``children`` leaves out.
class BatchedTransformer(cst.CSTTransformer):
    def __init__(
        self, ctx: RuleContext, rules: list[Rule], withheld: frozenset[type[Rule]], guard: Guard | None = None
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.withheld_rules = withheld
        self.guard = guard
        # (This and ``_skipped`` by the nodes' ids: a node hashes by a Python method of libcst's.)
        self._loops = {id(loop.node): loop for loop in ctx.facts.loops}
        # Fixes made on each open statement itself (not on statements nested in it).
        self._own_fixes: list[int] = []
        # Nodes whose subtree is not walked (on_leave still comes for them).
        self._skipped: set[int] = set()
        self._original_elses: set[cst.CSTNode] = set()
        visitors, leavers = _methods(tuple(type(rule) for rule in rules))
        triggers = ctx.facts.triggers
        bits = [triggers.bits[type(rule)] if triggers is not None else -1 for rule in rules]
        # A visit method takes the node alone and returns nothing: wrapped once, here, to be run
        # as a leave method is.
        self._visitors = {name: [(rules[i], _as_leave(getattr(rules[i], method)), bits[i]) for i, method in found]
                          for name, found in visitors.items()}
        self._leavers = {name: [(rules[i], getattr(rules[i], method), bits[i]) for i, method in found]
                         for name, found in leavers.items()}
        # The rules each open statement concerns (``Facts.concerned``), innermost last: a rule
        # is called only inside statements that mention its trigger words.
        self._concerned: list[int] = []
        self._tokens = _unvisited_tokens(frozenset(visitors) | frozenset(leavers))
        # By node type: whether it is a statement, and the rules' visit and leave methods for it.
        self._steps: dict[type, tuple[bool, list, list]] = {}

    # Walking ---------------------------------------------------------------------------------

    def rewrite(self, module: cst.Module) -> cst.Module:
        """``module`` with the rules' changes. It is libcst's visit, except that a node none of
        whose children changed is kept rather than rebuilt: most of a file is left as it is,
        and a file the rules leave alone comes back as the very same object."""
        if self._tokens != _TOKEN_TYPES:
            return module.visit(self)  # a rule visits whitespace or punctuation, which ``children`` skips
        return self._rewrite(module)

    def _rewrite(self, node: cst.CSTNode):
        """``node`` rewritten: a node that is neither a token nor inert (its parent's loop, or
        ``rewrite``, has checked)."""
        updated = node
        if self._enter(node):
            changed = None
            tokens, inert = self._tokens, self.ctx.facts.inert
            for child in children(node):
                if type(child) in tokens or id(child) in inert:
                    continue  # on_visit and on_leave would leave it as it is
                result = self._rewrite(child)
                if result is not child:
                    changed = changed or {}
                    changed[child] = result
            if changed:
                updated = node._visit_and_replace_children(Replacing(changed))
        return self._leave(node, updated)

    def _steps_at(self, kind: type) -> tuple[bool, list, list]:
        name = kind.__name__
        found = self._steps[kind] = (kind in STATEMENT_TYPES, self._visitors.get(name, ()), self._leavers.get(name, ()))
        return found

    def on_visit(self, node: cst.CSTNode) -> bool:
        if type(node) in self._tokens or id(node) in self.ctx.facts.inert:
            return False
        return self._enter(node)

    def _enter(self, node: cst.CSTNode) -> bool:
        ctx = self.ctx
        if self.guard is not None and self._original_branch(node):
            self._skipped.add(id(node))  # an earlier guarded migration's original path stays as it is
            return False
        kind = type(node)
        statement, visitors, _ = self._steps.get(kind) or self._steps_at(kind)
        if statement:
            concerned = ctx.facts.concerned(node)
            if not concerned:
                self._skipped.add(id(node))  # mentions no rule's trigger word: nothing can change
                return False
            ctx.open_statements.append(node)
            self._own_fixes.append(0)
            self._concerned.append(concerned)
            if kind is cst.FunctionDef:
                ctx.scopes.append(node)
            loop = self._loops.get(id(node))
            if loop is not None:
                ctx.loops.append(loop)
        if visitors:
            concerned = self._concerned[-1] if self._concerned else -1
            for rule, method, bit in visitors:
                if bit & concerned:
                    self._run(rule, method, node, node)
        return True

    # libcst calls these for every field of every node walked, to look up ``visit_<Node>_<field>``
    # methods by name; rules have none (their methods are dispatched from the tables above).
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def _original_branch(self, node: cst.CSTNode) -> bool:
        """``if not enabled(): ...`` and the ``else`` of ``if enabled(): ...``."""
        if isinstance(node, cst.If):
            branch = self.guard.branch(node.test)
            if branch == "on" and node.orelse is not None:
                self._original_elses.add(node.orelse)
            return branch == "off"
        return node in self._original_elses

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        if type(original_node) in self._tokens or id(original_node) in self.ctx.facts.inert:
            return updated_node
        return self._leave(original_node, updated_node)

    def _leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        ctx = self.ctx
        if id(original_node) in self._skipped:
            self._skipped.discard(id(original_node))
            return self._with_insertions(original_node, updated_node, own_fixes=0)
        if ctx.open_statements and ctx.open_statements[-1] is original_node:
            return self._leave_statement(original_node, updated_node)
        result = self._run_all(original_node, updated_node)
        if type(original_node) is cst.FunctionDef:
            ctx.scopes.pop()
        if self.guard is not None and type(result) in (cst.IndentedBlock, cst.Module):
            result = result.with_changes(body=self.guard.merge(list(result.body)))
        if type(result) is cst.IndentedBlock and not result.body:
            result = result.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return result

    def _leave_statement(self, original_node, updated_node):
        ctx = self.ctx
        result = self._run_all(original_node, updated_node)
        if type(original_node) is cst.FunctionDef:
            ctx.scopes.pop()
        if id(original_node) in self._loops:
            ctx.loops.pop()
        ctx.open_statements.pop()
        self._concerned.pop()
        return self._with_insertions(original_node, result, self._own_fixes.pop())

    def _with_insertions(self, original_node, result, own_fixes: int):
        """The statement's result with the statements rules inserted around it, and in guarded
        mode its changed parts as placeholders for ``if enabled(): ... else: ...``."""
        before, after = self.ctx.insertions.pop(original_node, ([], []))
        if self.guard is None:
            if not before and not after:
                return result
            statements = flatten(result)
            if before and statements:
                before[0], statements[0] = _blank_lines_moved(statements[0], before[0])
            return cst.FlattenSentinel([*before, *statements, *after])
        pieces = []
        if before:
            pieces.append(self.guard.pair(before, []))
        if own_fixes:
            pieces.append(self.guard.pair(flatten(result), [original_node]))
        else:
            pieces += flatten(result)
        if after:
            pieces.append(self.guard.pair(after, []))
        if len(pieces) == 1 and pieces[0] is result:
            return result
        return cst.FlattenSentinel(pieces)

    # Rules -----------------------------------------------------------------------------------

    def _run_all(self, original_node, updated_node):
        result = updated_node
        kind = type(original_node)
        leavers = (self._steps.get(kind) or self._steps_at(kind))[2]
        if not leavers:
            return result
        concerned = self._concerned[-1] if self._concerned else -1
        for rule, method, bit in leavers:
            if not bit & concerned:
                continue
            result = self._run(rule, method, original_node, result)
            if type(result) is not type(original_node):
                # Removed, flattened or replaced by another kind of node: later rules' leave_
                # methods for this node type no longer apply.
                break
        return result

    def _run(self, rule: Rule, method, original_node, current):
        ctx = self.ctx
        ctx.begin(rule)
        try:
            changed = method(original_node, current)
        except ConceptMissing as missing:
            ctx.diagnose(
                original_node,
                f"{rule.name} is not available on target {missing.target!r}; left unchanged",
                f"The target has no {missing.concept!r}: see `accrewrite rules` for the rules each target supports.",
            )
            return current
        if changed is current and not ctx.pending_insertions:
            return current  # nothing changed, nothing inserted
        if not ctx.pending:
            raise RuleBug(f"{rule.code} changed code without calling ctx.fix()")
        if type(rule) in self.withheld_rules:
            ctx.withhold()
            return current
        if ctx.suppressed(rule.code, original_node):
            return current
        fixes = ctx.commit()
        if self._own_fixes and changed is not current:
            self._own_fixes[-1] += fixes
        return changed


def _as_leave(visit):
    return lambda original, current: visit(original) or current


def _blank_lines_moved(statement, inserted):
    """A statement's leading blank lines go to what is inserted before it, so that the insertion
    joins the statement's paragraph instead of the one above."""
    lines = list(statement.leading_lines)
    blank = 0
    while blank < len(lines) and lines[blank].comment is None:
        blank += 1
    if not blank or inserted.leading_lines:
        return inserted, statement
    return inserted.with_changes(leading_lines=lines[:blank]), statement.with_changes(leading_lines=lines[blank:])

