import libcst as cst

from accrewrite.nodes import call_arg, dotted
from accrewrite.rule import Example, Rule


class DeviceSave(Rule):
    """Report `torch.save` of device tensors on an XLA target: save with `xm.save`.

    On torch_xla and TorchAcc, a model's parameters and an optimizer's state live on the XLA
    device. `torch.save` of them (`model.state_dict()`, a checkpoint dict holding state
    dicts, a tensor) serialises XLA tensors, which load only where an XLA device exists, and
    every process writes the same file. The target's `xm.save(obj, path)` moves the tensors
    to the CPU first and writes from the master process only.

    Why not rewritten: `xm.save` ends with a rendezvous of all processes, so inside a
    rank-0-only branch (`if rank == 0:`, `if master_process:`) it would wait forever for
    the others. Call it from every process, outside such a branch (it picks the writer itself).
    The runtime target's tensors are ordinary torch tensors, so it reports nothing there.
    """

    code = "ACC106"
    name = "device-save"
    summary = "torch.save of device tensors (a state dict) on an XLA target -> xm.save"
    concepts = ("device_save",)
    triggers = frozenset({"save"})
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch

            def save_checkpoint(model, optimizer, step, path):
                checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save(checkpoint, path)
            """,
            diagnostics=("ACC106:5",),
        ),
        Example(
            target="torchacc",
            before="""
            import torch

            if rank == 0:
                torch.save(model.state_dict(), "model.pt")
            torch.save(losses, "losses.pt")
            """,
            diagnostics=("ACC106:4", "ACC106:5"),
        ),
    )

    def applies(self) -> bool:
        return self.ctx.target.has("device_save")

    def leave_Call(self, original_node, updated_node):
        if self.ctx.facts.file.qualname(original_node.func) != "torch.save":
            return updated_node
        obj = call_arg(original_node, 0, "obj")
        path = call_arg(original_node, 1, "f")
        if obj is None or path is None or not _may_hold_tensors(obj.value):
            return updated_node
        replacement = self.ctx.concept("device_save").render_expr(
            obj=self.ctx.code(obj.value), path=self.ctx.code(path.value)
        )
        self.ctx.diagnose(
            original_node,
            "`torch.save` of device tensors; every process writes",
            "On this target the tensors live on the XLA device and every process writes. Use "
            f"`{' '.join(replacement.split())}` (CPU copies, master process only), called by every "
            "process: it ends with a rendezvous, so not inside a rank-0-only branch.",
        )
        return updated_node


def _may_hold_tensors(node: cst.CSTNode) -> bool:
    """A state dict, a model, a checkpoint dict or any variable; not a literal of plain values."""
    if isinstance(node, (cst.SimpleString, cst.Integer, cst.Float, cst.ConcatenatedString, cst.FormattedString)):
        return False
    if isinstance(node, cst.Dict):
        return any(_may_hold_tensors(e.value) for e in node.elements if isinstance(e, cst.DictElement))
    if isinstance(node, (cst.List, cst.Tuple)):
        return any(_may_hold_tensors(e.value) for e in node.elements)
    return dotted(node) is not None or isinstance(node, (cst.Call, cst.Subscript))
