import libcst as cst

from accrewrite.concepts import EXPRESSION, Definition
from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule

_DROPOUT = "torch.nn.Dropout"


class FusedDropoutAdd(Rule):
    """`residual + self.dropout(x)` becomes TorchAcc's migration guide's fused bias-dropout-add.

    In a module's forward, a residual added to the output of an `nn.Dropout` submodule is
    computed by one kernel: `dropout_add_fused_train(x, residual, p)` while training and
    `dropout_add_fused(x, residual, p)` in evaluation, chosen by `self.training` as in the
    guide. `p` is read from the dropout module, so a configured rate is kept.

    Unsafe: on CUDA the fused kernel draws its mask from its own random stream, so the dropped
    elements differ from `nn.Dropout`'s for the same seed (same distribution, different
    numbers). Applied only with --unsafe-fixes or when selected by its code or name.
    """

    code = "ACC023"
    name = "fused-dropout-add"
    summary = "residual + dropout(x) -> dropout_add_fused_train (unsafe: another RNG stream)"
    safe = False
    concepts = ("dropout_add",)
    defines = (
        Definition("dropout_add", EXPRESSION, "residual + dropout(x), fused", ("x", "residual", "p", "training")),
    )
    # The names dropout submodules usually have (nanoGPT, Hugging Face, timm, Megatron): a
    # dropout attribute with another name is not looked for, so its addition stays unfused.
    triggers = frozenset(
        {
            "drop", "dropout", "drop1", "drop2", "dropout1", "dropout2", "dropout3", "attn_drop",
            "attn_dropout", "proj_drop", "resid_drop", "resid_dropout", "hidden_dropout",
            "attention_dropout", "output_dropout", "drop_path", "ffn_dropout", "mlp_drop",
        }
    )
    examples = (
        Example(
            before="""
            import torch.nn as nn

            class Block(nn.Module):
                def __init__(self, dim, p):
                    super().__init__()
                    self.mlp = nn.Linear(dim, dim)
                    self.drop = nn.Dropout(p)

                def forward(self, x):
                    return x + self.drop(self.mlp(x))
            """,
            after="""
            import torch.nn as nn
            from accrewrite.runtime.nn import dropout_add_fused_train
            from accrewrite.runtime.nn import dropout_add_fused

            class Block(nn.Module):
                def __init__(self, dim, p):
                    super().__init__()
                    self.mlp = nn.Linear(dim, dim)
                    self.drop = nn.Dropout(p)

                def forward(self, x):
                    return (dropout_add_fused_train(self.mlp(x), x, self.drop.p) if self.training else dropout_add_fused(self.mlp(x), x, self.drop.p))
            """,
        ),
    )

    def applies(self) -> bool:
        return _DROPOUT in self.ctx.facts.file.assigned_calls.values()

    def leave_BinaryOperation(self, original_node, updated_node):
        if not isinstance(original_node.operator, cst.Add) or self.ctx.scope not in self.ctx.facts.file.method_class:
            return updated_node
        for dropped, residual in ((updated_node.right, updated_node.left), (updated_node.left, updated_node.right)):
            dropout = self._dropout_module(dropped)
            if dropout is not None:
                code = self.ctx.code
                fused = self.ctx.expr(
                    "dropout_add", x=code(dropped.args[0].value), residual=code(residual), p=f"{dropout}.p",
                    training="self.training",
                )
                self.ctx.fix(original_node, f"residual + {dropout}(x) -> the fused dropout-add kernel")
                return fused.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated_node

    def _dropout_module(self, node) -> str | None:
        """``self.<name>`` when ``node`` is ``self.<name>(x)`` of an nn.Dropout attribute."""
        if not isinstance(node, cst.Call) or len(node.args) != 1 or node.args[0].keyword or node.args[0].star:
            return None
        name = dotted(node.func)
        if name and name.startswith("self.") and self.ctx.facts.file.assigned_calls.get(name) == _DROPOUT:
            return name
        return None
