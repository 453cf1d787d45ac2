from types import MappingProxyType

import libcst as cst

from accrewrite.concepts import EXPRESSION, Definition
from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule
from accrewrite.toolbox import with_commas

# dcn_v2's names -> the concept that stands for each in a target profile.
_CONCEPT_OF = MappingProxyType({"DCN": "dcn", "DCNv2": "dcnv2", "dcn_v2_conv": "dcn_v2_conv"})
# mmcv's deformable convolutions, and those of mmdetection 1.x (mmdet.ops): compiled ops with
# constructors and state_dict keys of their own.
_MMCV = frozenset({
    "DeformConv2d", "DeformConv2dPack", "ModulatedDeformConv2d", "ModulatedDeformConv2dPack",
    "deform_conv2d", "modulated_deform_conv2d", "DeformConv", "DeformConvPack",
    "ModulatedDeformConv", "ModulatedDeformConvPack", "deform_conv", "modulated_deform_conv",
})
_MMCV_PACKAGES = ("mmcv.ops", "mmdet.ops")


class DeformableConv(Rule):
    """dcn_v2's compiled `DCN`/`DCNv2` -> the target's (TorchAcc's migration guide, "DCN/DCNv2").

    Detection code (CenterNet, FairMOT and their descendants) imports deformable convolution
    from the `dcn_v2` package, a CUDA extension built with the project:
    `from dcn_v2 import DCN`, or from a copy of it, `from .DCNv2.dcn_v2 import DCN` (any
    package path whose last two parts are `DCNv2*.dcn_v2`; a `dcn_v2` module of another
    folder, such as recommender code's Deep & Cross Network, is left alone). The import of
    `DCN`, `DCNv2` and (runtime target) `dcn_v2_conv` is re-pointed at the target's, which
    have the same constructors
    (`DCN(chi, cho, kernel_size, stride, padding, dilation, deformable_groups)`), forward
    signatures and state_dict keys, so call sites and checkpoints stay as they are; the copied
    `DCNv2` folder is no longer needed. `accrewrite.runtime.nn.DCN` runs
    torchvision's compiled `deform_conv2d` where it loads and plain PyTorch elsewhere.

    Reported, not rewritten:
    - dcn_v2's other names (`DCNv2Pooling`, `DCNPooling`, `dcn_v2_pooling`, variants of a
      copied package such as `DCN_sep`): no target has them, so the file still needs the
      compiled package;
    - `import dcn_v2` (the module as a whole): import the classes by name;
    - mmcv's `DeformConv2dPack`, `ModulatedDeformConv2dPack`, ... (`mmcv.ops`, `mmdet.ops`):
      other constructors (`groups`, `deform_groups`) and other state_dict keys
      (`conv_offset`), so they are swapped by hand: `ModulatedDeformConv2dPack` computes what
      `DCN` does;
    - on a target without deformable convolution (torch_xla), each of these imports: the
      compiled kernels take CUDA tensors only. `accrewrite.runtime.nn.DCN` is plain PyTorch
      there (bilinear reads of gathered pixels, which XLA compiles).
    """

    code = "ACC026"
    name = "deformable-conv"
    summary = "from dcn_v2 import DCN, DCNv2 (a compiled CUDA extension) -> the target's DCN/DCNv2"
    triggers = frozenset({"dcn_v2", "DCNv2", "mmcv", "mmdet"})
    defines = (
        Definition("dcn", EXPRESSION, "dcn_v2's DCN: a modulated deformable convolution with its own offsets"),
        Definition("dcnv2", EXPRESSION, "dcn_v2's DCNv2: a deformable convolution given offsets and a mask"),
        Definition("dcn_v2_conv", EXPRESSION, "dcn_v2's functional modulated deformable convolution"),
    )
    examples = (
        Example(
            before="""
            import torch.nn as nn
            from .DCNv2.dcn_v2 import DCN

            class DeformConv(nn.Module):
                def __init__(self, chi, cho):
                    super().__init__()
                    self.conv = DCN(chi, cho, kernel_size=(3, 3), stride=1, padding=1, dilation=1, deformable_groups=1)
            """,
            after="""
            import torch.nn as nn
            from accrewrite.runtime.nn import DCN

            class DeformConv(nn.Module):
                def __init__(self, chi, cho):
                    super().__init__()
                    self.conv = DCN(chi, cho, kernel_size=(3, 3), stride=1, padding=1, dilation=1, deformable_groups=1)
            """,
        ),
        Example(
            target="torchacc",
            before="""
            from dcn_v2 import DCN, DCNv2 as ModulatedConv, DCNPooling
            from mmcv.ops import ModulatedDeformConv2dPack, nms

            head = DCN(64, 64, 3, 1, 1, 1, 2)
            """,
            after="""
            from torchacc.runtime.nn.dcn_v2 import DCN, DCNv2 as ModulatedConv
            from dcn_v2 import DCNPooling
            from mmcv.ops import ModulatedDeformConv2dPack, nms

            head = DCN(64, 64, 3, 1, 1, 1, 2)
            """,
            diagnostics=("ACC026:1", "ACC026:2"),
        ),
        Example(
            target="torch_xla",
            before="""
            from dcn_v2 import DCN

            head = DCN(64, 64, 3, 1, 1)
            """,
            diagnostics=("ACC026:1",),
        ),
    )

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if len(original_node.body) != 1:
            return updated_node
        node = original_node.body[0]
        if isinstance(node, cst.Import):
            self._whole_modules(original_node, node)
            return updated_node
        if not isinstance(node, cst.ImportFrom) or node.module is None or isinstance(node.names, cst.ImportStar):
            return updated_node
        module = dotted(node.module) or ""
        if not node.relative and any(module == p or module.startswith(p + ".") for p in _MMCV_PACKAGES):
            self._mmcv(original_node, node, module)
            return updated_node
        if not _is_dcn_v2(module, bool(node.relative)):
            return updated_node
        kept, moved = [], {}
        for alias in node.names:
            target_module = self._target_module(alias)
            if target_module is None:
                kept.append(alias)
            else:
                moved.setdefault(target_module, []).append(alias)
        self._report_kept(original_node, kept)
        if not moved:
            return updated_node
        statements = [
            updated_node.with_changes(body=[_import_of(node, aliases).with_changes(
                module=cst.parse_expression(target_module), relative=())])
            for target_module, aliases in moved.items()
        ]
        if kept:
            statements.append(updated_node.with_changes(body=[_import_of(node, kept)]))
        names = ", ".join(alias.name.value for aliases in moved.values() for alias in aliases)
        self.ctx.fix(original_node, f"{names}: the target's deformable convolution, not dcn_v2's CUDA extension")
        for position in range(1, len(statements)):  # the comments above and after the line, once
            statements[position] = statements[position].with_changes(
                leading_lines=(), trailing_whitespace=cst.TrailingWhitespace())
        return cst.FlattenSentinel(statements) if len(statements) > 1 else statements[0]

    def _target_module(self, alias: cst.ImportAlias) -> str | None:
        """The module the target imports this dcn_v2 name from, where it spells the name's
        concept as that very name (``from M import DCN``); else None."""
        name = alias.name.value if isinstance(alias.name, cst.Name) else None
        concept = _CONCEPT_OF.get(name)
        if concept is None or not self.ctx.target.has(concept):
            return None
        spelled = self.ctx.concept(concept)
        line = self.ctx.target.import_line(spelled.imports[0]) if len(spelled.imports) == 1 else ""
        if spelled.expr != name or not (line.startswith("from ") and line.endswith(f" import {name}")):
            return None
        return line[len("from "):line.index(" import ")]

    def _report_kept(self, statement, kept) -> None:
        names = [alias.name.value for alias in kept if isinstance(alias.name, cst.Name)]
        missing = [name for name in names if name in _CONCEPT_OF]
        other = [name for name in names if name not in _CONCEPT_OF]
        if missing:
            self.ctx.diagnose(
                statement,
                f"{', '.join(missing)} from dcn_v2 kept: target {self.ctx.target.name!r} has no counterpart",
                _without_dcn() if not self.ctx.target.has("dcn") else
                "The file still needs dcn_v2's compiled CUDA extension for them. Build a DCNv2 module "
                "and call it with your offsets and mask instead of the function.",
            )
        if other:
            self.ctx.diagnose(
                statement,
                f"{', '.join(other)} from dcn_v2 kept: no target has it",
                "The file still needs dcn_v2's compiled CUDA extension (CUDA tensors only). "
                "Deformable RoI pooling has no counterpart; DCN and DCNv2 do.",
            )

    def _whole_modules(self, statement, node: cst.Import) -> None:
        for alias in node.names:
            module = dotted(alias.name) or ""
            if _is_dcn_v2(module, False):
                self.ctx.diagnose(
                    statement,
                    f"`import {module}` uses dcn_v2's compiled CUDA extension",
                    "Import its classes by name (`from dcn_v2 import DCN, DCNv2`) and migrate again: the "
                    "codemod then points them at the target's deformable convolution."
                    if self.ctx.target.has("dcn") else _without_dcn(),
                )

    def _mmcv(self, statement, node: cst.ImportFrom, module: str) -> None:
        names = [alias.name.value for alias in node.names
                 if isinstance(alias.name, cst.Name) and alias.name.value in _MMCV]
        if not names:
            return
        self.ctx.diagnose(
            statement,
            f"{', '.join(names)} from {module}: a compiled op, left as it is",
            "mmcv's kernels take CUDA tensors, and its constructors (groups, deform_groups) and "
            "state_dict keys (conv_offset) differ from dcn_v2's, so the swap is by hand: "
            "ModulatedDeformConv2dPack computes what DCN(chi, cho, kernel_size, stride, padding, "
            "dilation, deformable_groups) does (rename conv_offset.* to conv_offset_mask.* in "
            "checkpoints); DeformConv2d(Pack), without a mask, is accrewrite.runtime.nn.deform_conv2d("
            "input, offset, weight, bias, stride, padding, dilation). "
            + (f"The target's: `{self.ctx.target.import_line(self.ctx.concept('dcn').imports[0])}`."
               if self.ctx.target.has("dcn") else _PLAIN_PYTORCH),
        )


_PLAIN_PYTORCH = (
    "accrewrite.runtime.nn's DCN, DCNv2 and deform_conv2d (pip install 'accrewrite[runtime]') are "
    "plain PyTorch on this target (bilinear reads of gathered pixels, which XLA compiles)."
)


def _without_dcn() -> str:
    return ("This target has no deformable convolution, and dcn_v2's kernels take CUDA tensors only. "
            + _PLAIN_PYTORCH + " They have dcn_v2's constructors and state_dict keys: import them in its place.")


def _is_dcn_v2(module: str, relative: bool) -> bool:
    """The dcn_v2 package: ``dcn_v2`` itself, or a copy of its folder (``.DCNv2.dcn_v2``,
    ``lib.DCNv2.dcn_v2``). A module of another folder called ``dcn_v2`` is not it (recommender
    code has a Deep & Cross Network v2 of that name)."""
    parts = module.split(".")
    if parts[-1] != "dcn_v2":
        return False
    if len(parts) == 1:
        return not relative
    return parts[-2].lower().startswith("dcnv2")


def _import_of(node: cst.ImportFrom, aliases) -> cst.ImportFrom:
    """``node`` importing some of its names. Within parentheses each name keeps its comma and the
    comments after it, and the comments before ``)`` stay with the last name; without them,
    commas go between names only."""
    if node.lpar is None:
        return node.with_changes(names=with_commas(aliases))
    listed, last = [], len(aliases) - 1
    for position, alias in enumerate(aliases):
        comma = alias.comma
        if position < last and comma is cst.MaybeSentinel.DEFAULT:
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        elif (position == last and comma is not cst.MaybeSentinel.DEFAULT
              and isinstance(comma.whitespace_after, cst.SimpleWhitespace)):
            comma = cst.MaybeSentinel.DEFAULT  # a trailing comma on the line of the name
        listed.append(alias.with_changes(comma=comma))
    rpar = node.rpar
    if node.names[-1] not in aliases:
        rpar = rpar.with_changes(whitespace_before=cst.SimpleWhitespace(""))
    return node.with_changes(names=listed, rpar=rpar)
