import libcst as cst

from accrewrite.nodes import call_arg
from accrewrite.rule import Example, Rule, excerpt

_CLASS = frozenset({
    "torch.nn.SyncBatchNorm", "torch.nn.modules.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm",
})
_CONVERT = "convert_sync_batchnorm"
# Where the class is only named: a type test, an import.
_TYPE_TESTS = frozenset({"isinstance", "issubclass"})
# Expressions that stay one operand where a removed call leaves them (``convert(m).cuda()``).
_PRIMARY = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)


class SyncBatchNorm(Rule):
    """`nn.SyncBatchNorm` -> the target's synchronized batch norm; where it has none, per-replica batch norm.

    Research trainers (detection and segmentation references, DINO, MoCo v3, SimSiam, VICReg)
    normalize over the global batch: `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`,
    or `nn.SyncBatchNorm(C)` built directly. torch's SyncBatchNorm runs on CUDA (and XPU, HPU)
    only: once a process group is initialized, its first training forward on any other
    device raises (`SyncBatchNorm expected input tensor to be on GPU ...`), the CPU with gloo
    and an XLA device among them.

    - Where the target has a synchronized batch norm (`runtime`: `accrt.nn.SyncBatchNorm`,
      torch's own kernels on CUDA and an all-gather of each process's statistics elsewhere),
      the class is replaced wherever the file uses it: its conversion
      (`accrt.nn.SyncBatchNorm.convert_sync_batchnorm(model)`), its calls and the class
      passed as a value (`norm_layer=nn.SyncBatchNorm`). A type test (`isinstance(m,
      nn.SyncBatchNorm)`) keeps torch's class, of which the target's is a subclass.
    - Where it has none (torch_xla and TorchAcc: torch_xla's `SyncBatchNorm` is not a drop-in:
      its running variance is biased, it has no `affine`, `track_running_stats`,
      `momentum=None` nor `process_group`, its state_dict lacks `num_batches_tracked`, and its
      running statistics keep their autograd history from step to step), the conversion is
      removed and reported: each replica's BatchNorm normalizes its own batch, so with small
      per-device batches the statistics are noisier than over the global batch. A file that
      builds a SyncBatchNorm directly is left as it is and reported: it would fail there. The
      class passed as a value is reported.
    """

    code = "ACC016"
    name = "sync-batch-norm"
    summary = "nn.SyncBatchNorm -> the target's synchronized batch norm; where it has none, convert_sync_batchnorm removed"
    triggers = frozenset({"SyncBatchNorm"})
    examples = (
        Example(
            before="""
            import torch.nn as nn

            if args.sync_bn:
                model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            head = nn.Sequential(nn.Linear(256, 256), nn.SyncBatchNorm(256))
            """,
            after="""
            import torch.nn as nn
            import accrewrite.runtime as accrt

            if args.sync_bn:
                model = accrt.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            head = nn.Sequential(nn.Linear(256, 256), accrt.nn.SyncBatchNorm(256))
            """,
        ),
        Example(
            before="""
            from torch import nn

            def backbone(sync_bn):
                norm_layer = nn.SyncBatchNorm if sync_bn else nn.BatchNorm2d
                return ResNet(norm_layer=norm_layer)

            def has_batchnorms(model):
                return any(isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm)) for m in model.modules())
            """,
            after="""
            from torch import nn
            import accrewrite.runtime as accrt

            def backbone(sync_bn):
                norm_layer = accrt.nn.SyncBatchNorm if sync_bn else nn.BatchNorm2d
                return ResNet(norm_layer=norm_layer)

            def has_batchnorms(model):
                return any(isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm)) for m in model.modules())
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            if args.sync_bn:
                student = torch.nn.SyncBatchNorm.convert_sync_batchnorm(student)
            teacher = torch.nn.SyncBatchNorm.convert_sync_batchnorm(teacher).to(device)
            """,
            after="""
            import torch

            if args.sync_bn:
                pass
            teacher = teacher.to(device)
            """,
            diagnostics=("ACC016:4", "ACC016:5"),
        ),
        Example(
            target="torchacc",
            before="""
            import torch.nn as nn

            class Head(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.norm = nn.SyncBatchNorm(dim)
                    self.proj = nn.Linear(dim, dim).cuda()
            """,
            diagnostics=("ACC016:6",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Depth inside type tests and imports, where the class is named, not used.
        self._naming = 0
        # The ids of nodes that are not a use of the class as a value: names after a dot, the
        # class whose conversion is called, the class called.
        self._after_dot: set[int] = set()
        self._converted: set[int] = set()
        self._called: set[int] = set()

    def _is_class(self, node: cst.CSTNode) -> bool:
        return self.ctx.facts.qualname(node) in _CLASS

    def visit_Import(self, node) -> None:
        self._naming += 1

    def leave_Import(self, original_node, updated_node):
        self._naming -= 1
        return updated_node

    def visit_ImportFrom(self, node) -> None:
        self._naming += 1

    def leave_ImportFrom(self, original_node, updated_node):
        self._naming -= 1
        return updated_node

    def visit_Attribute(self, node) -> None:
        self._after_dot.add(id(node.attr))
        if node.attr.value == _CONVERT:
            self._converted.add(id(node.value))

    def visit_Call(self, node) -> None:
        self._naming += _tests_type(node)
        self._called.add(id(node.func))

    def leave_Call(self, original_node, updated_node):
        self._naming -= _tests_type(original_node)
        if self.ctx.target.has("sync_batch_norm") or self._converted_module(original_node) is None:
            return updated_node
        return self._remove_conversion(original_node, updated_node)

    def leave_Attribute(self, original_node, updated_node):
        return self._use(original_node, updated_node)

    def leave_Name(self, original_node, updated_node):
        if id(original_node) in self._after_dot:
            return updated_node
        return self._use(original_node, updated_node)

    def _use(self, original_node, updated_node):
        """A use of the class: the target's class in its place, or a finding."""
        if self._naming or not self._is_class(original_node):
            return updated_node
        ctx = self.ctx
        name = ctx.code(original_node)
        if ctx.target.has("sync_batch_norm"):
            replacement = ctx.expr("sync_batch_norm")
            ctx.fix(original_node, f"{name} -> {ctx.code(replacement)}: synchronized on every device the target runs on")
            return replacement
        if id(original_node) in self._converted:
            return updated_node  # the conversion goes (leave_Call)
        if id(original_node) in self._called:
            ctx.refuse(
                original_node,
                f"`{name}(...)` builds a SyncBatchNorm, which fails on this target's device; file left as it is",
                "torch's SyncBatchNorm raises on an XLA device once a process group is initialized, and this "
                "target has no synchronized batch norm. Build the BatchNorm of the layer's input dimensions "
                "instead (BatchNorm2d for images: statistics per replica) or a GroupNorm, and migrate again; "
                "with `# noqa: ACC016` the file migrates as it is, for a script that never initializes a "
                "process group.",
            )
        else:
            ctx.diagnose(
                original_node,
                f"`{name}` is passed as a value: a layer built from it fails on this target's device",
                "torch's SyncBatchNorm raises on an XLA device once a process group is initialized, and this "
                "target has no synchronized batch norm; left as it is. Where layers are built from it "
                "(`norm_layer=nn.SyncBatchNorm`), pass the BatchNorm of their input dimensions or a GroupNorm "
                "(statistics per replica); a type test needs nothing.",
            )
        return updated_node

    def _remove_conversion(self, call: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        """The converted module in place of the conversion."""
        ctx = self.ctx
        ctx.fix(call, f"removed {excerpt(ctx.code(call.func))}(): the target has no synchronized batch norm")
        ctx.diagnose(
            call,
            "batch norm statistics are per replica on this target, not over the global batch",
            "This target has no synchronized batch norm (torch's raises on an XLA device in a process group), "
            "so the conversion is removed and each replica's BatchNorm normalizes its own batch: with small "
            "per-device batches its statistics are noisier than over the global batch. Keep per-device "
            "batches large, or use GroupNorm, which needs no batch statistics.",
        )
        value = updated_node.args[call.args.index(call_arg(call, 0, "module"))].value
        if isinstance(value, _PRIMARY) or value.lpar:
            return value
        return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def leave_SimpleStatementLine(self, original_node, updated_node):
        """A statement that the removed conversion leaves doing nothing: ``model = model``, or
        ``model`` alone where the conversion's result was not kept."""
        if self.ctx.target.has("sync_batch_norm") or len(original_node.body) != 1:
            return updated_node
        small = original_node.body[0]
        module = self._converted_module(small.value) if isinstance(small, (cst.Expr, cst.Assign)) else None
        if module is None:
            return updated_node
        if isinstance(small, cst.Expr) or (
            len(small.targets) == 1 and self.ctx.code(small.targets[0].target) == self.ctx.code(module)
        ):
            self.ctx.fix(original_node, "removed the statement that only converted to SyncBatchNorm")
            if _commented(original_node):  # the comments stay, on a statement that does nothing
                return updated_node.with_changes(body=[cst.Pass()])
            return cst.RemoveFromParent()
        return updated_node

    def _converted_module(self, node: cst.CSTNode) -> cst.BaseExpression | None:
        """The module that ``node`` converts, where it is a conversion."""
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == _CONVERT
                and self._is_class(node.func.value)):
            return None
        module = call_arg(node, 0, "module")
        return None if module is None else module.value


def _tests_type(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value in _TYPE_TESTS


def _commented(statement: cst.SimpleStatementLine) -> bool:
    return statement.trailing_whitespace.comment is not None or any(line.comment for line in statement.leading_lines)
