import libcst as cst

from accrewrite.analysis import dotted
from accrewrite.rule import Example, Rule

# Names that a training script gives its optimizer.
_OPTIMIZER_NAMES = ("optimizer", "optim", "opt")


class UnsafeFix(Rule):
    """Report a migration step that could not be applied safely, and why.

    Other rules report here (``ctx.diagnose(node, message, code="ACC105")``) when the code they
    would rewrite is out of their sight or ambiguous, and leave it unchanged rather than guess:
    what follows must then be done by hand, as the message says.

    This rule itself reports optimizers that the migration cannot see being built: one returned
    by a factory (``model.configure_optimizers(...)`` in nanoGPT, ``create_optimizer(...)``,
    ``build_optimizer(cfg)``), or a class chosen at run time (``getattr(torch.optim, name)``).
    Where the script uses a GradScaler, ACC008 would have built the target's syncfree
    Adam/AdamW/SGD (seed 001: no host sync to skip a step); without one, ACC021 the fused
    Adam/AdamW. What to do: make the same replacement where the optimizer is built (syncfree
    with a GradScaler, fused Adam otherwise), or build it in the script from ``torch.optim``.
    """

    code = "ACC105"
    name = "unsafe-fix"
    summary = "a fix that could not be applied safely (optimizer built by an unseen factory, ...)"
    triggers = frozenset(_OPTIMIZER_NAMES)
    examples = (
        Example(
            before="""
            import torch

            scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
            optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
            while True:
                scaler.scale(model(X, Y)[1]).backward()
                scaler.step(optimizer)
            """,
            after="""
            import torch

            scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
            optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
            while True:
                scaler.scale(model(X, Y)[1]).backward()
                scaler.step(optimizer)
            """,
            diagnostics=("ACC105:4",),
        ),
        Example(
            before="""
            import torch

            self.optimizer = getattr(torch.optim, cfg.optimizer)(model.parameters(), lr=cfg.lr)
            for x, y in loader:
                model(x, y).backward()
                self.optimizer.step()
            """,
            after="""
            import torch

            self.optimizer = getattr(torch.optim, cfg.optimizer)(model.parameters(), lr=cfg.lr)
            for x, y in loader:
                model(x, y).backward()
                self.optimizer.step()
            """,
            diagnostics=("ACC105:3",),
        ),
    )

    def applies(self) -> bool:
        return bool(self.ctx.facts.loops or self.ctx.facts.step_functions)

    def leave_Assign(self, original_node, updated_node):
        if len(original_node.targets) != 1 or not isinstance(original_node.value, cst.Call):
            return updated_node
        target = dotted(original_node.targets[0].target)
        if target is None or not target.split(".")[-1].lower().endswith(_OPTIMIZER_NAMES):
            return updated_node
        call = original_node.value
        callee = self.ctx.facts.qualname(call.func)
        if callee is not None and callee.startswith("torch.optim."):
            return updated_node  # built from torch.optim in plain sight: ACC008/ACC021 handle it
        how = self._how(call)
        if how is None:
            return updated_node
        if self.ctx.facts.scalers:
            instead = ("the script uses a GradScaler, so ACC008 would build the target's syncfree Adam/AdamW/SGD "
                       "(no host sync to skip a step)")
        else:
            instead = "ACC021 would build the fused Adam/AdamW"
        self.ctx.diagnose(
            original_node,
            f"`{target}` is {how}, which the migration cannot see: {instead}, but could not here. Make that "
            "replacement where the optimizer is built, or build it in this script from torch.optim",
        )
        return updated_node

    def _how(self, call: cst.Call) -> str | None:
        func = call.func
        if isinstance(func, cst.Call) and dotted(func.func) == "getattr":
            return f"built from a class chosen at run time (`{' '.join(self.ctx.code(func).split())}`)"
        name = dotted(func)
        if name is None:
            return None
        last = name.split(".")[-1]
        if "optim" in last.lower():
            return f"built by `{name}(...)`"
        return None
