import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES
from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule

# Calls that move or wrap a model rather than build it.
_NOT_CONSTRUCTORS = ("to", "cuda", "compile")


class AutoCheckpoint(Rule):
    """Checkpoint the model's repeated blocks: `model = auto_checkpoint(model)` (TorchAcc's migration guide,
    "Gradient checkpointing").

    Activation checkpointing recomputes the blocks' activations in the backward pass instead of
    keeping them, trading compute for memory so that a larger batch fits. The call goes right
    after the statement that builds the model, before it is placed or wrapped. Opt-in: it
    changes the step time and memory, not the results; select ACC025 to use it.
    """

    code = "ACC025"
    name = "auto-checkpoint"
    summary = "model = auto_checkpoint(model) after the model is built (opt-in)"
    opt_in = True
    concepts = ("auto_checkpoint",)
    triggers = None  # the model's constructor can have any name
    examples = (
        Example(
            before="""
            import torch

            model = GPT(config)
            model.to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
            """,
            after="""
            import torch
            from accrewrite.runtime import auto_checkpoint

            model = GPT(config)
            model = auto_checkpoint(model)
            model.to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch

            model = GPT(config)
            model.train()
            """,
            after="""
            import torch
            import torchacc

            model = GPT(config)
            model = torchacc.auto_checkpoint(model)
            model.train()
            """,
        ),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        self._done: set[str] = set()

    def applies(self) -> bool:
        return bool(self.ctx.facts.file.models) and not any(name.endswith("auto_checkpoint") for name in self.ctx.facts.file.called)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign) or len(node.body[0].targets) != 1:
            return
        assign = node.body[0]
        model = dotted(assign.targets[0].target)
        call = assign.value
        if model not in self.ctx.facts.file.models or model in self._done or not isinstance(call, cst.Call):
            return
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _NOT_CONSTRUCTORS:
            return
        if self.ctx.facts.file.qualname(call.func) in WRAPPER_NAMES:
            return
        self._done.add(model)
        self.ctx.insert_after(node, self.ctx.statements("auto_checkpoint", model=model))
        self.ctx.fix(node, f"{model}'s repeated blocks are checkpointed")
