import libcst as cst

from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule, excerpt

# Names that a training script gives its optimizer.
_OPTIMIZER_NAMES = ("optimizer", "optim", "opt")


class UnsafeFix(Rule):
    """Report an optimizer the migration cannot see being built, where a fused Adam was due.

    Its one finding: in a script without a GradScaler, where ACC021 would have given the
    target's fused Adam/AdamW, an optimizer returned by a factory (minGPT's
    `model.configure_optimizers(...)`, `create_optimizer(...)`, `build_optimizer(cfg)`), or a
    class chosen at run time (`getattr(torch.optim, name)`). What to do: build
    `FusedAdam`/`FusedAdamW` where the optimizer is built (or call `hooks.enable_fused_adam()`
    first), or build it in the script from `torch.optim`. With a GradScaler, ACC008 reports the
    same optimizer at `scaler.step(optimizer)` (the syncfree replacement), so it is not
    reported twice.

    Every other rule reports the fixes it could not apply safely under its own code (ACC007's
    `autocast(*args)` left as it is is an ACC007 finding), so --select and --ignore act on them
    with the rest of that rule.
    """

    code = "ACC105"
    name = "unsafe-fix"
    summary = "an optimizer built out of sight (an unseen factory, a class chosen at run time): no fused Adam"
    triggers = frozenset(_OPTIMIZER_NAMES)
    examples = (
        Example(
            before="""
            import torch

            optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))
            while True:
                logits, loss = model(X, Y)
                loss.backward()
                optimizer.step()
            """,
            diagnostics=("ACC105:3",),
        ),
        Example(
            before="""
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
        facts = self.ctx.facts
        return (
            bool(facts.loops or facts.step_functions) and not facts.uses_grad_scaler and self.ctx.target.has("fused_adam")
        )

    def leave_Assign(self, original_node, updated_node):
        if len(original_node.targets) != 1 or not isinstance(original_node.value, cst.Call):
            return updated_node
        target = dotted(original_node.targets[0].target)
        if target is None or not target.split(".")[-1].lower().endswith(_OPTIMIZER_NAMES):
            return updated_node
        call = original_node.value
        callee = self.ctx.facts.file.qualname(call.func)
        if callee is not None and callee.startswith("torch.optim."):
            return updated_node  # built from torch.optim in plain sight: ACC021 handles it
        how = self._how(call)
        if how is None:
            return updated_node
        self.ctx.diagnose(
            original_node,
            f"`{excerpt(target, 30)}` is {how}, out of sight",
            "ACC021 would have made an Adam/AdamW the target's FusedAdam/FusedAdamW. Make that replacement "
            "where the optimizer is built (or call hooks.enable_fused_adam() before it), or build it in "
            "this script from torch.optim.",
        )
        return updated_node

    def _how(self, call: cst.Call) -> str | None:
        func = call.func
        if isinstance(func, cst.Call) and dotted(func.func) == "getattr":
            return f"built from a class chosen at run time (`{excerpt(self.ctx.code(func), 30)}`)"
        name = dotted(func)
        if name is None:
            return None
        last = name.split(".")[-1]
        if "optim" in last.lower():
            return f"built by `{name}(...)`"
        return None
