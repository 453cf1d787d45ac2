import libcst as cst

from accrewrite.nodes import call_arg, dotted
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.targets import import_bindings

_CLASS = frozenset({
    "torch.nn.SyncBatchNorm", "torch.nn.modules.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm",
})
_CLASS_NAME = "SyncBatchNorm"
_CONVERT = "convert_sync_batchnorm"
# Where the class is only named, not used.
_TYPE_TESTS = frozenset({"isinstance", "issubclass"})
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
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
      the class is replaced wherever the file uses it through its module: its conversion
      (`accrt.nn.SyncBatchNorm.convert_sync_batchnorm(model)`), its calls and the class
      passed as a value (`norm_layer=nn.SyncBatchNorm`). A type test (`isinstance(m,
      nn.SyncBatchNorm)`) keeps torch's class, of which the target's is a subclass. A class
      imported by name (`from torch.nn import SyncBatchNorm`) is imported from the target's
      module instead, so that every use of the name is the target's class.
    - Where it has none (torch_xla and TorchAcc: torch_xla's `SyncBatchNorm` is not a drop-in:
      its running variance is biased, it has no `affine`, `track_running_stats`,
      `momentum=None` nor `process_group`, its state_dict lacks `num_batches_tracked`, and its
      running statistics keep their autograd history from step to step), the conversion is
      removed and reported: each replica's BatchNorm normalizes its own batch, so with small
      per-device batches the statistics are noisier than over the global batch. A file that
      builds a SyncBatchNorm is left as it is and reported: it would fail there. The class
      passed as a value, or imported by name, is reported.
    """

    refusal_holds_neighbours = False  # a SyncBatchNorm fails where it is built, migrated neighbours or not
    code = "ACC016"
    name = "sync-batch-norm"
    summary = "nn.SyncBatchNorm -> the target's synchronized batch norm; where it has none, convert_sync_batchnorm removed"
    triggers = frozenset({_CLASS_NAME})
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
            from torch.nn import BatchNorm2d, SyncBatchNorm

            def backbone(sync_bn):
                norm_layer = SyncBatchNorm if sync_bn else BatchNorm2d
                return ResNet(norm_layer=norm_layer)

            def has_batchnorms(model):
                return any(isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm)) for m in model.modules())
            """,
            after="""
            from torch import nn
            from accrewrite.runtime.nn import SyncBatchNorm
            from torch.nn import BatchNorm2d

            def backbone(sync_bn):
                norm_layer = SyncBatchNorm if sync_bn else BatchNorm2d
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
        # Depth inside type tests, where the class is named, not used.
        self._naming = 0
        # The ids of the class's uses that are not a value: called, or its conversion called.
        self._called: set[int] = set()
        self._converted: set[int] = set()

    def applies(self) -> bool:
        # a training loop's statements concern every rule: a file that never names the class is
        # not walked at all (any use of it, through any import, spells the class's name somewhere)
        return _CLASS_NAME in self.ctx.source_text

    def _is_class(self, node: cst.CSTNode) -> bool:
        return self.ctx.facts.file.qualname(node) in _CLASS

    def visit_Call(self, node) -> None:
        self._naming += _tests_type(node)
        self._called.add(id(node.func))
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == _CONVERT and call_arg(node, 0, "module"):
            self._converted.add(id(node.func.value))

    def leave_Call(self, original_node, updated_node):
        self._naming -= _tests_type(original_node)
        if self.ctx.target.has("sync_batch_norm"):
            return updated_node  # the class's uses: leave_Attribute, and its import by name
        if self._converted_module(original_node) is not None:
            return self._remove_conversion(original_node, updated_node)
        if isinstance(original_node.func, cst.Name) and self._is_class(original_node.func):
            self._refuse(original_node.func)  # imported by name and built
        return updated_node

    def leave_Attribute(self, original_node, updated_node):
        """A use of the class through its module (``nn.SyncBatchNorm``): the target's class in
        its place, or a finding."""
        if self._naming or not self._is_class(original_node):
            return updated_node
        ctx = self.ctx
        if ctx.target.has("sync_batch_norm"):
            replacement = ctx.expr("sync_batch_norm")
            ctx.fix(original_node, f"{ctx.code(original_node)} -> {ctx.code(replacement)}: synchronized on the "
                                   "target's device")
            return replacement
        if id(original_node) in self._called:
            self._refuse(original_node)
        elif id(original_node) not in self._converted:  # a conversion goes (leave_Call)
            self._diagnose_value(original_node, f"`{ctx.code(original_node)}` is passed as a value")
        return updated_node

    def _refuse(self, node: cst.CSTNode) -> None:
        self.ctx.refuse(
            node,
            f"`{self.ctx.code(node)}(...)` builds a SyncBatchNorm, which fails on this target's device; file left "
            "as it is",
            "torch's SyncBatchNorm raises on an XLA device once a process group is initialized, and this "
            "target has no synchronized batch norm. Build the BatchNorm of the layer's input dimensions "
            "instead (BatchNorm2d for images: statistics per replica) or a GroupNorm, and migrate again; "
            "with `# noqa: ACC016` the file migrates as it is, for a script that never initializes a "
            "process group.",
        )

    def _diagnose_value(self, node: cst.CSTNode, what: str) -> None:
        self.ctx.diagnose(
            node,
            f"{what}: a layer built from it fails on this target's device",
            "torch's SyncBatchNorm raises on an XLA device once a process group is initialized, and this "
            "target has no synchronized batch norm; left as it is. Where layers are built from it "
            "(`norm_layer=nn.SyncBatchNorm`), pass the BatchNorm of their input dimensions or a GroupNorm "
            "(statistics per replica); a type test needs nothing.",
        )

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
        if len(original_node.body) != 1:
            return updated_node
        small = original_node.body[0]
        if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            return self._import_by_name(original_node, updated_node, small)
        if self.ctx.target.has("sync_batch_norm"):
            return updated_node
        return self._left_by_the_removal(original_node, updated_node, small)

    def _import_by_name(self, original_node, updated_node, node: cst.ImportFrom):
        """``from torch.nn import SyncBatchNorm``: every use of the name is the target's class,
        imported from where the target spells it; or, without one, a finding."""
        imports = self.ctx.facts.file.imports
        moved = [alias for alias in node.names if imports.get(_local_name(alias)) in _CLASS]
        if not moved:
            return updated_node
        spelled = self._spelled_name()
        if spelled is None:
            self._diagnose_value(original_node, f"`{_local_name(moved[0])}` is imported from torch by name")
            return updated_node
        self.ctx.fix(original_node, f"{', '.join(map(_local_name, moved))}: the target's synchronized batch norm")
        module, _, name = spelled.rpartition(".")
        names = [alias.with_changes(name=cst.Name(name), asname=alias.asname or _as(alias, name), comma=_COMMA)
                 for alias in moved]
        names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        ours = cst.ImportFrom(module=cst.parse_expression(module), names=names)
        # a comment on a moved name goes to the line that imports it now
        comment = next((c for c in map(_comment_of, moved) if c is not None), None)
        end = updated_node.trailing_whitespace
        ours_end = cst.TrailingWhitespace(cst.SimpleWhitespace("  "), comment) if comment else cst.TrailingWhitespace()
        kept = [alias for alias in node.names if alias not in moved]
        if not kept:
            return updated_node.with_changes(body=[ours], trailing_whitespace=ours_end if comment and not end.comment else end)
        # the last name kept ends the list as the original's last name did (its comment aside)
        closing = node.names[-1].comma
        kept[-1] = kept[-1].with_changes(comma=closing if node.names[-1] in kept else _without_comment(closing))
        return cst.FlattenSentinel([
            cst.SimpleStatementLine([ours], leading_lines=updated_node.leading_lines, trailing_whitespace=ours_end),
            updated_node.with_changes(body=[node.with_changes(names=kept)], leading_lines=()),
        ])

    def _spelled_name(self) -> str | None:
        """The qualified name of the target's class (its spelling, through its imports)."""
        if not self.ctx.target.has("sync_batch_norm"):
            return None
        spelled = self.ctx.concept("sync_batch_norm")
        lines = (self.ctx.target.import_line(key) for key in spelled.imports)
        bound = dict(binding for line in lines for binding in import_bindings(line))
        root, _, rest = spelled.expr.partition(".")
        if root not in bound:
            return None
        return f"{bound[root]}.{rest}" if rest else bound[root]

    def _left_by_the_removal(self, original_node, updated_node, small):
        """A statement that the removed conversion leaves doing nothing: ``model = model``, or
        ``model`` alone where the conversion's result was not kept."""
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


def _local_name(alias: cst.ImportAlias) -> str:
    return alias.asname.name.value if alias.asname is not None else dotted(alias.name)


def _as(alias: cst.ImportAlias, name: str) -> cst.AsName | None:
    """``as SyncBatchNorm`` where the target's class has another name."""
    local = dotted(alias.name)
    return None if local == name else cst.AsName(name=cst.Name(local))


def _comment_of(alias: cst.ImportAlias) -> cst.Comment | None:
    """The comment after a name of a parenthesized import (``SyncBatchNorm,  # ...``)."""
    after = getattr(alias.comma, "whitespace_after", None)
    return after.first_line.comment if isinstance(after, cst.ParenthesizedWhitespace) else None


def _without_comment(comma):
    after = getattr(comma, "whitespace_after", None)
    if not isinstance(after, cst.ParenthesizedWhitespace) or after.first_line.comment is None:
        return comma
    return comma.with_changes(whitespace_after=after.with_changes(first_line=cst.TrailingWhitespace()))


def _commented(statement: cst.SimpleStatementLine) -> bool:
    return statement.trailing_whitespace.comment is not None or any(line.comment for line in statement.leading_lines)
