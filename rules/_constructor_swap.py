"""Shared by the fused-module rules: a constructor is replaced by the target's fused one.

A target spells the replacement one of two ways (its profile decides):
- an expression (``expr = "FusedLayerNorm"``): each call of the original constructor calls it
  instead, with the same arguments;
- statements (``stmts``, the guide's hooks: ``hooks.enable_fused_layer_norm()``): they run once,
  at the top of the file, before torch is imported, and patch the constructor for the process.
"""

from typing import ClassVar

import libcst as cst

from accrewrite.imports import first_import
from accrewrite.rule import Rule


class ConstructorSwap(Rule):
    # Qualified name of the original constructor -> the concept that replaces it.
    swaps: ClassVar[dict[str, str]]
    # Whether the replacement takes the original's arguments (QuickGelu() takes none).
    keeps_arguments: ClassVar[bool] = True

    def applies(self) -> bool:
        return bool(self.ctx.facts.file.called & set(self.swaps))

    def wanted(self, call: cst.Call) -> bool:
        """Whether this call may be replaced (a subclass narrows it)."""
        return True

    def visit_Module(self, node: cst.Module) -> None:
        """The hook form: statements once, before the file's imports."""
        done = set()
        for original, concept in self.swaps.items():
            if original not in self.ctx.facts.file.called or not self.ctx.target.has(concept) or concept in done:
                continue  # a target without the concept reports it at each call
            if self.ctx.concept(concept).expr is not None:
                continue
            done.add(concept)
            statements = self.ctx.statements(concept)
            if self.ctx.code(statements[-1]).strip() in self.ctx.source_text:
                continue  # hooked already
            body = node.body
            anchor = body[first_import(body)] if body else None
            if anchor is None:
                continue
            self.ctx.insert_before(anchor, statements)
            self.ctx.fix(anchor, f"{original.rsplit('.', 1)[-1]} is patched for the whole process by the target's hook")

    def leave_Call(self, original_node, updated_node):
        """The expression form: each call."""
        original = self.ctx.facts.file.qualname(original_node.func)
        concept = self.swaps.get(original)
        if concept is None or self.ctx.concept(concept).expr is None or not self.wanted(original_node):
            return updated_node
        replacement = self.ctx.expr(concept)
        self.ctx.fix(original_node, f"{original.rsplit('.', 1)[-1]} -> {self.ctx.code(replacement)}")
        args = updated_node.args if self.keeps_arguments else []
        return updated_node.with_changes(func=replacement, args=args)

