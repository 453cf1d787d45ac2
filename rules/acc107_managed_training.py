from types import MappingProxyType

import libcst as cst

from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule

# What each library is told, as (message, help), by the module its import names.
_SAID = MappingProxyType({
    # The file is left to the diagnostics (the engine runs no fix on it).
    "torch.distributed.rpc": (
        "torch.distributed.rpc trains this script; left as it is",
        "Training over RPC (parameter servers, distributed autograd) moves its gradients itself, and "
        "the XLA targets have no RPC.",
    ),
    # CUDA-only: the rest of the file migrates, this needs a human.
    "apex": (
        "NVIDIA apex runs on CUDA only",
        "apex (amp, DistributedDataParallel, fused optimizers) has no other device: replace it with "
        "torch.amp and torch's DistributedDataParallel, then migrate.",
    ),
})


class ManagedTraining(Rule):
    """Report training over RPC, or through a CUDA-only library.

    A script that trains over torch.distributed.rpc moves its gradients through distributed
    autograd: rewriting its loop would reduce the gradients twice (or on one rank only, which
    hangs), and the XLA targets have no RPC, so the file is left as it is, with this one note;
    the diagnostics (host syncs, dynamic shapes) still apply. A script that uses NVIDIA apex is
    migrated, and apex is reported: its amp, DistributedDataParallel and fused optimizers are
    CUDA kernels. Lightning and Accelerate scripts are migrated by their configuration (ACC018,
    ACC019).
    """

    code = "ACC107"
    name = "managed-training"
    summary = "RPC training is left as it is; apex is reported"
    triggers = frozenset({"rpc", "apex"})
    examples = (
        Example(
            before="""
            import torch
            import torch.distributed.rpc as rpc

            rpc.init_rpc("worker", rank=rank, world_size=world_size)
            """,
            diagnostics=("ACC107:2",),
        ),
        Example(
            before="""
            import torch
            from apex import amp

            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
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
        library = next((name for name in _SAID if module == name or module.startswith(name + ".")), None)
        if library is not None and library not in self._reported:
            self._reported.add(library)
            self.ctx.diagnose(node, *_SAID[library])
