import libcst as cst

from accrewrite.analysis import LOADER_NAMES
from accrewrite.nodes import call_arg
from accrewrite.rule import Example, Rule

# The worker count TorchAcc's migration guide uses.
_GUIDE_WORKERS = 8


class LoaderPinMemory(Rule):
    """DataLoaders that feed a CUDA device pin their batches (TorchAcc's migration guide, "Pin memory").

    A pinned (page-locked) batch copies to the GPU asynchronously, so the device loader's
    non-blocking copies overlap the step. `pin_memory=torch.cuda.is_available()` is added
    where a DataLoader sets no `pin_memory` (the condition keeps CPU runs free of pinning
    warnings). A loader that loads in the training process (no `num_workers`, or 0) gets a
    diagnostic: worker processes prepare the next batches while the device computes; the guide
    suggests raising `num_workers` (it uses 8) as far as the dataset's memory allows.

    Only on targets whose device loader copies from host memory to a CUDA device (runtime); the
    XLA targets transfer through their own runtime.
    """

    code = "ACC012"
    name = "loader-pin-memory"
    summary = "DataLoader feeding a CUDA device: pin_memory added; in-process loading diagnosed"
    concepts = ("pin_memory",)
    triggers = frozenset({"DataLoader"})
    examples = (
        Example(
            before="""
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4)
            """,
            after="""
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4, pin_memory=torch.cuda.is_available())
            """,
        ),
    )

    def applies(self) -> bool:
        return self.ctx.target.has("pin_memory") and bool(self.ctx.facts.file.called & LOADER_NAMES)

    def leave_Call(self, original_node, updated_node):
        if self.ctx.facts.file.qualname(original_node.func) not in LOADER_NAMES:
            return updated_node
        # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, ...)
        workers = call_arg(original_node, 5, "num_workers")
        if workers is None or self.ctx.code(workers.value) == "0":
            self.ctx.diagnose(
                original_node,
                "DataLoader loads batches in the training process (num_workers=0)",
                f"Set num_workers (TorchAcc's migration guide uses {_GUIDE_WORKERS}) so that worker "
                "processes prepare the next batches while the device computes.",
            )
        if call_arg(original_node, 7, "pin_memory") is not None or any(arg.star for arg in original_node.args):
            return updated_node
        pinned = cst.Arg(keyword=cst.Name("pin_memory"), value=self.ctx.expr("pin_memory"),
                         equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
        args = list(updated_node.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        self.ctx.fix(original_node, "pin_memory added: pinned batches copy to the GPU asynchronously")
        return updated_node.with_changes(args=[*args, pinned])
