import libcst as cst

from accrewrite.analysis import MANAGED_FRAMEWORKS
from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule

# What each framework that manages its own training is told (the engine leaves such a file to
# the diagnostics).
_MANAGED = {
    "accelerate": "Hugging Face Accelerate places the model, wraps the loaders and reduces gradients itself: "
                  "left as it is; run it on the target through Accelerate (`accelerate launch`)",
    "lightning": "PyTorch Lightning's Trainer places the model and reduces gradients itself: left as it is; "
                 "choose the device in the Trainer (`accelerator=...`)",
    "pytorch_lightning": "PyTorch Lightning's Trainer places the model and reduces gradients itself: left as it "
                         "is; choose the device in the Trainer (`accelerator=...`)",
}
# CUDA-only training libraries: the rest of the file migrates, these need a human.
_CUDA_ONLY = {
    "apex": "NVIDIA apex (amp, DistributedDataParallel, fused optimizers) runs on CUDA only: replace it with "
            "torch.amp and torch's DistributedDataParallel, then migrate",
}


class ManagedTraining(Rule):
    """Report training that a framework runs, or that a CUDA-only library does.

    A script that trains through Hugging Face Accelerate or PyTorch Lightning does not place
    its model or reduce its gradients itself: the framework does, and it has its own way onto
    an accelerator. Rewriting its loop would reduce the gradients twice and fight over the
    device, so the file is left as it is, with this one note; the diagnostics (host syncs,
    dynamic shapes) still apply. A script that uses NVIDIA apex is migrated, and apex is
    reported: its amp, DistributedDataParallel and fused optimizers are CUDA kernels.
    """

    code = "ACC107"
    name = "managed-training"
    summary = "Accelerate / Lightning scripts are left as they are; apex is reported"
    triggers = frozenset({*MANAGED_FRAMEWORKS, *_CUDA_ONLY})
    examples = (
        Example(
            before="""
            import torch
            from accelerate import Accelerator

            accelerator = Accelerator()
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            """,
            after="""
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
        if node.module is not None and not node.relative:
            self._report(node, dotted(node.module) or "")

    def _report(self, node: cst.CSTNode, module: str) -> None:
        root = module.split(".")[0]
        message = _MANAGED.get(root) or _CUDA_ONLY.get(root)
        if message and root not in self._reported:
            self._reported.add(root)
            self.ctx.diagnose(node, message)
