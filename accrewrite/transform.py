"""One libcst walk that runs every selected rule of a file.

Walking the tree once per rule would cost a traversal each; instead the rules' ``visit_<Node>``
and ``leave_<Node>`` methods are gathered into tables by node type and called from a single
transformer. Each ``leave_`` call is a small transaction: the fixes and imports a rule records
while returning a changed node are kept only when the change is kept (not withheld as an unsafe
fix, not suppressed by ``# noqa``), and a target that lacks a concept turns the rule's change
into a "not available on this target" diagnostic.
"""

from __future__ import annotations

from collections import defaultdict

import libcst as cst

from accrewrite.rule import Rule, RuleContext
from accrewrite.targets import ConceptMissing


class BatchedTransformer(cst.CSTTransformer):
    def __init__(self, ctx: RuleContext, rules: list[Rule], withheld: frozenset[type[Rule]]) -> None:
        super().__init__()
        self.ctx = ctx
        self.withheld_rules = withheld
        self._visitors: dict[str, list] = defaultdict(list)
        self._leavers: dict[str, list] = defaultdict(list)
        for rule in rules:
            for attribute in dir(type(rule)):
                if attribute.startswith("visit_"):
                    self._visitors[attribute[6:]].append((rule, getattr(rule, attribute)))
                elif attribute.startswith("leave_"):
                    self._leavers[attribute[6:]].append((rule, getattr(rule, attribute)))

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.FunctionDef):
            self.ctx.scopes.append(node)
        for rule, method in self._visitors.get(type(node).__name__, ()):
            self.ctx.begin(rule)
            method(node)
        hot = self.ctx.facts.hot
        # A statement that mentions no rule's trigger word cannot change: skip its subtree.
        return hot is None or node in hot or not isinstance(
            node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)
        )

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        result = updated_node
        for rule, method in self._leavers.get(type(original_node).__name__, ()):
            result = self._run(rule, method, original_node, result)
            if type(result) is not type(original_node):
                # Removed, flattened or replaced by another kind of node: later rules' leave_
                # methods for this node type no longer apply.
                break
        if isinstance(original_node, cst.FunctionDef):
            self.ctx.scopes.pop()
        if isinstance(result, cst.IndentedBlock) and not result.body:
            result = result.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return result

    def _run(self, rule: Rule, method, original_node, current):
        ctx = self.ctx
        ctx.begin(rule)
        try:
            changed = method(original_node, current)
        except ConceptMissing as missing:
            ctx.diagnose(
                original_node,
                f"{rule.name} is not available on target {missing.target!r} "
                f"(it has no {missing.concept!r}); left unchanged",
            )
            return current
        if changed is current:
            return current
        if type(rule) in self.withheld_rules:
            ctx.withhold()
            return current
        if ctx.suppressed(rule.code, original_node):
            return current
        ctx.commit()
        return changed
