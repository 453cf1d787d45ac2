from types import MappingProxyType

import libcst as cst

from accrewrite.facts import SCALER_NAMES
from accrewrite.nodes import call_arg, dotted
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.toolbox import with_commas

_SYNCFREE = MappingProxyType({
    "torch.optim.Adam": "Adam",
    "torch.optim.adam.Adam": "Adam",
    "torch.optim.AdamW": "AdamW",
    "torch.optim.adamw.AdamW": "AdamW",
    "torch.optim.SGD": "SGD",
    "torch.optim.sgd.SGD": "SGD",
})
# torch.optim implementation switches that the syncfree optimizers do not take.
_IMPLEMENTATION_KEYWORDS = ("foreach", "fused", "capturable", "differentiable")
# What every target's syncfree optimizers take (the rest of torch.optim's arguments: reported).
_ACCEPTED = MappingProxyType({
    "Adam": ("params", "lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "AdamW": ("params", "lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "SGD": ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
})


class SyncfreeOptimizer(Rule):
    """With a GradScaler, or on a lazy device, use the target's syncfree Adam/AdamW/SGD.

    From TorchAcc's migration guide, "Replace the optimizer": with AMP, `scaler.step(optimizer)`
    must learn whether the gradients overflowed; a torch.optim optimizer makes it read that flag
    on the host (a device sync every step), while `syncfree.Adam/AdamW/SGD` take it as a
    tensor and skip the update on the device. On a lazy device (XLA) there is a second reason,
    with a scaler or without: torch.optim's Adam reads its step count on the host for the bias
    correction, a new constant in the graph each step, so the step's graph is compiled anew
    every step; syncfree's keeps the count on the device. So, in a file that creates a
    GradScaler (on an XLA target without a fused Adam of its own, in every file that trains),
    `torch.optim.Adam`, `AdamW` and
    `SGD` (however imported: `optim.AdamW`, `from torch.optim import AdamW as W`) become
    `syncfree.Adam`, `syncfree.AdamW`, `syncfree.SGD` with the same arguments; torch.optim's
    implementation switches (`foreach`, `fused`, `capturable`, `differentiable`) are
    dropped. Other optimizers stay (the guide: "for all other types, continue to use the native
    PyTorch optimizers").

    Left as it is and reported (ACC008): an optimizer built from `*args`/`**kwargs` (which may
    hold a switch syncfree does not take), `amsgrad=True`, and an optimizer passed to
    `scaler.step` that this file does not build from torch.optim (a factory such as nanoGPT's
    `model.configure_optimizers`): change it by hand where it is built.
    """

    code = "ACC008"
    name = "syncfree-optimizer"
    summary = "with a GradScaler or on XLA: torch.optim.Adam/AdamW/SGD -> the target's syncfree.Adam/AdamW/SGD"
    concepts = ("syncfree_optimizer",)
    triggers = frozenset({"Adam", "AdamW", "SGD", "step"})
    examples = (
        Example(
            before="""
            import torch
            import torch.optim as optim

            scaler = torch.cuda.amp.GradScaler()
            optimizer = optim.AdamW(model.parameters(), lr=3e-4, fused=True)
            """,
            after="""
            import torch
            import torch.optim as optim
            from accrewrite.runtime.amp import syncfree

            scaler = torch.cuda.amp.GradScaler()
            optimizer = syncfree.AdamW(model.parameters(), lr=3e-4)
            """,
        ),
        Example(
            target="torchacc",
            before="""
            from torch.cuda.amp import GradScaler
            from torch.optim import SGD as Sgd

            optimizer = Sgd(model.parameters(), lr=0.1, momentum=0.9)
            """,
            after="""
            from torch.cuda.amp import GradScaler
            from torch.optim import SGD as Sgd
            from torchacc.torch_xla.amp import syncfree

            optimizer = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            scaler = torch.amp.GradScaler("cuda")
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            """,
            after="""
            import torch
            from torch_xla.amp import syncfree

            scaler = torch.amp.GradScaler("cuda")
            optimizer = syncfree.Adam(model.parameters(), lr=1e-3)
            """,
        ),
        Example(  # left as it is, and reported
            target="torch_xla",
            before="""
            import torch

            optimizer = torch.optim.AdamW(*params)
            scaler = torch.cuda.amp.GradScaler()
            scaler.step(optimizer)
            """,
            diagnostics=("ACC008:3",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported: set[str] = set()

    def applies(self) -> bool:
        facts = self.ctx.facts
        target = self.ctx.target
        if target.has("lazy_execution") and not target.has("fused_adam") and (facts.loops or facts.step_functions):
            return True  # (a target's fused Adam, TorchAcc's, keeps its step count on the device too)
        return facts.uses_grad_scaler or any(
            name in SCALER_NAMES or name.endswith(".amp.GradScaler") for name in facts.file.imports.values()
        )

    def leave_Call(self, original_node, updated_node):
        func = original_node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "step":
            self._check_scaler_step(original_node)
            return updated_node
        kind = _SYNCFREE.get(self.ctx.facts.file.qualname(func) or "")
        if kind is None:
            return updated_node
        code = self.ctx.code(func)
        if any(arg.star for arg in original_node.args):
            self.ctx.diagnose(
                original_node,
                f"{excerpt(code)}(...) is built from *args/**kwargs; left as it is",
                f"Whether syncfree.{kind} takes them cannot be checked (it has no foreach/fused/capturable); "
                f"with a GradScaler use syncfree.{kind} here by hand to avoid a host sync per step.",
            )
            return updated_node
        unknown = [
            arg.keyword.value for arg in original_node.args
            if arg.keyword is not None
            and arg.keyword.value not in _ACCEPTED[kind]
            and arg.keyword.value not in _IMPLEMENTATION_KEYWORDS
        ]
        if unknown:
            self.ctx.diagnose(
                original_node,
                f"{excerpt(code + '(' + ', '.join(unknown) + '=...)', 50)} left as it is: syncfree.{kind} "
                "does not take it",
                f"syncfree.{kind} does not take {', '.join(unknown)}; without it, use syncfree.{kind} here by "
                "hand to avoid a host sync per step.",
            )
            return updated_node
        amsgrad = call_arg(original_node, 5, "amsgrad") if kind != "SGD" else None
        if amsgrad is not None and self.ctx.code(amsgrad.value) != "False":
            self.ctx.diagnose(
                original_node,
                f"{excerpt(code)}(amsgrad=...) left as it is",
                f"syncfree.{kind} does not support amsgrad on every target; drop amsgrad to use it.",
            )
            return updated_node
        args = [
            arg for arg in updated_node.args
            if arg.keyword is None or arg.keyword.value not in _IMPLEMENTATION_KEYWORDS
        ]
        dropped = len(updated_node.args) - len(args)
        message = f"{code} -> syncfree.{kind}: the scaler's overflow check stays on the device"
        if dropped:
            message += "; dropped torch.optim's implementation switches"
        self.ctx.fix(original_node, message)
        return updated_node.with_changes(
            func=self.ctx.expr("syncfree_optimizer", name=kind),
            args=with_commas(args) if dropped else updated_node.args,
        )

    def _check_scaler_step(self, call: cst.Call) -> None:
        """Report ``scaler.step(opt)`` where ``opt`` is not built from torch.optim here."""
        owner = dotted(call.func.value) or ""
        scalers = {name.split(".")[-1] for name in self.ctx.facts.scalers}
        if owner.split(".")[-1] not in scalers and "scaler" not in owner.lower():
            return
        first = call_arg(call, 0, "optimizer")
        name = dotted(first.value) if first is not None else None
        if name is None or name in self._reported:
            return
        built = {key.split(".")[-1] for key in self.ctx.facts.optimizers}
        if name.split(".")[-1] in built:
            return
        self._reported.add(name)
        self.ctx.diagnose(
            call,
            f"{excerpt(name)} is not built from torch.optim in this file",
            "It comes from a factory or another module: if it is torch.optim Adam/AdamW/SGD, build "
            "syncfree.Adam/AdamW/SGD there instead, so that the scaler's overflow check does not sync "
            "the host every step.",
        )
