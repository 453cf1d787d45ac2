from types import MappingProxyType

import libcst as cst

from accrewrite.analysis import managed_by
from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule

# What each framework that manages its own training is told, as (message, help); the engine
# leaves such a file to the diagnostics.
_LIGHTNING = (
    "PyTorch Lightning trains this script; left as it is",
    "Lightning's Trainer places the model and reduces gradients itself: choose the device in the "
    "Trainer (`accelerator=...`).",
)
_MANAGED = MappingProxyType({
    "accelerate": (
        "Hugging Face Accelerate trains this script; left as it is",
        "Accelerate places the model, wraps the loaders and reduces gradients itself: run it on the "
        "target through Accelerate (`accelerate launch`).",
    ),
    "lightning": _LIGHTNING,
    "pytorch_lightning": _LIGHTNING,
    "torch.distributed.rpc": (
        "torch.distributed.rpc trains this script; left as it is",
        "Training over RPC (parameter servers, distributed autograd) moves its gradients itself, and "
        "the XLA targets have no RPC.",
    ),
})
# CUDA-only training libraries: the rest of the file migrates, these need a human.
_CUDA_ONLY = MappingProxyType({
    "apex": (
        "NVIDIA apex runs on CUDA only",
        "apex (amp, DistributedDataParallel, fused optimizers) has no other device: replace it with "
        "torch.amp and torch's DistributedDataParallel, then migrate.",
    ),
})


class ManagedTraining(Rule):
    """Report training that a framework runs, or that a CUDA-only library does.

    A script that trains through Hugging Face Accelerate or PyTorch Lightning does not place
    its model or reduce its gradients itself: the framework does, and it has its own way onto
    an accelerator. One that trains over torch.distributed.rpc moves its gradients through
    distributed autograd. Rewriting such a loop would reduce the gradients twice (or on one
    rank only, which hangs) and fight over the device, so the file is left as it is, with this
    one note; the diagnostics (host syncs, dynamic shapes) still apply. A script that uses
    NVIDIA apex is migrated, and apex is reported: its amp, DistributedDataParallel and fused
    optimizers are CUDA kernels.
    """

    code = "ACC107"
    name = "managed-training"
    summary = "Accelerate, Lightning and RPC training are left as they are; apex is reported"
    triggers = frozenset({"accelerate", "lightning", "pytorch_lightning", "rpc", *_CUDA_ONLY})
    examples = (
        Example(
            before="""
            import torch
            from accelerate import Accelerator

            accelerator = Accelerator()
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            """,
            diagnostics=("ACC107:2",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported: set[str] = set()

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._report(node, dotted(alias.name) or "")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None and not node.relative and not isinstance(node.names, cst.ImportStar):
            module = dotted(node.module) or ""
            for alias in node.names:
                self._report(node, f"{module}.{dotted(alias.name)}")

    def _report(self, node: cst.CSTNode, module: str) -> None:
        framework = managed_by(module) or module.split(".")[0]
        if framework == "accelerate" and self.ctx.facts.framework == "transformers":
            return  # the Trainer's own Accelerate: ACC017 migrates its script
        said = _MANAGED.get(framework) or _CUDA_ONLY.get(framework)
        if said and framework not in self._reported:
            self._reported.add(framework)
            self.ctx.diagnose(node, *said)
