import libcst as cst

from accrewrite.rule import Example, Rule, excerpt
from accrewrite.values import Kind


class SliceBounds(Rule):
    """Clamp slice bounds counted from the end to the tensor's length, where the target rejects
    bounds past it.

    `idx[:, -block_size:]` keeps the last `block_size` tokens; while the sequence is still shorter
    (every generation loop that starts from a short prompt), CPU and CUDA PyTorch clamp the start
    to the first element, and torch_xla raises `Value out of range (expected to be in range of
    [-5, 4], but got -32)`. On such a target (lazy execution: torchacc, torch_xla), a bound that
    negates a name or attribute, on a value the analysis knows is a tensor, is clamped to the
    length of its dimension: `idx[:, -min(block_size, idx.size(1)):]`, which selects the same
    elements on every device (and the same for the stop, `x[:-n]`).

    Reported instead where the length cannot be read without changing the program: the sliced
    value is computed (`model(x)[:, -n:]` would run twice), or an index before the slice
    (`None`, a mask, two `...`) leaves its dimension unknown.
    """

    code = "ACC014"
    name = "slice-bounds"
    summary = "x[:, -n:] -> x[:, -min(n, x.size(1)):] where the target rejects slice bounds past the tensor"
    concepts = ("lazy_execution",)
    triggers = frozenset()
    trigger_nodes = (cst.Slice,)  # the bound is a name of the script's own
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch

            def generate(model, idx, steps, block_size):
                for _ in range(steps):
                    logits = model(idx[:, -block_size:])[:, -1, :]
                    idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
                return idx[0, -model.config.n_keep:]
            """,
            after="""
            import torch

            def generate(model, idx, steps, block_size):
                for _ in range(steps):
                    logits = model(idx[:, -min(block_size, idx.size(1)):])[:, -1, :]
                    idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
                return idx[0, -min(model.config.n_keep, idx.size(1)):]
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch

            embed = torch.nn.Embedding(100, 16)
            tokens = torch.zeros(1, 4, dtype=torch.long)
            recent = embed(tokens)[:, -window:]
            """,
            diagnostics=("ACC014:5",),
        ),
    )

    def leave_Subscript(self, original_node, updated_node):
        values = self.ctx.facts.values(self.ctx.scope)
        if values.kind(original_node.value) not in (Kind.TENSOR, Kind.MASK):
            return updated_node
        elements = list(updated_node.slice)
        changed = []
        for position, element in enumerate(original_node.slice):
            piece = element.slice
            if not isinstance(piece, cst.Slice):
                continue
            bounds = {name: getattr(piece, name) for name in ("lower", "upper") if _from_the_end(getattr(piece, name))}
            if not bounds:
                continue
            dim = _dimension(original_node.slice, position, values)
            sliced = self.ctx.code(original_node.value)
            if dim is None or not _plain(original_node.value):
                shown = excerpt(self.ctx.code(original_node))
                self.ctx.diagnose(
                    original_node, f"`{shown}` may slice past the start of the tensor, which this target rejects",
                    "CPU PyTorch clamps a slice bound past the tensor's length; the XLA device raises \"Value out "
                    f"of range\". Clamp it to the length: `-min(n, {excerpt(sliced, 20)}.size(dim))`, with the "
                    "sliced value in a variable.",
                )
                continue
            clamped = {
                name: cst.UnaryOperation(cst.Minus(), _clamp(bound.expression, updated_node.value, dim))
                for name, bound in bounds.items()
            }
            elements[position] = elements[position].with_changes(slice=elements[position].slice.with_changes(**clamped))
            changed += [self.ctx.code(bound) for bound in bounds.values()]
        if not changed:
            return updated_node
        self.ctx.fix(original_node, f"slice bound {', '.join(changed)} clamped to the tensor's length")
        return updated_node.with_changes(slice=elements)


def _from_the_end(bound) -> bool:
    """``-block_size``, ``-self.block_size``: a length counted from the end."""
    return (isinstance(bound, cst.UnaryOperation) and isinstance(bound.operator, cst.Minus)
            and isinstance(bound.expression, (cst.Name, cst.Attribute)) and not bound.lpar)


def _plain(node: cst.BaseExpression) -> bool:
    """A name, attribute or subscript of those: reading it twice reads the same tensor."""
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Subscript) and not all(
            isinstance(e.slice, cst.Index) and isinstance(e.slice.value, (cst.Name, cst.Integer)) for e in node.slice
        ):
            return False
        node = node.value
    return isinstance(node, cst.Name)


def _dimension(elements, position: int, values) -> int | None:
    """The dimension that the slice at ``position`` selects from: counted from the front, or
    from the back after an ``...``; None where an earlier index adds or takes an unknown
    number of dimensions (``None``, a mask, a second ``...``)."""

    def width(element) -> int | None:
        piece = element.slice
        if isinstance(piece, cst.Slice):
            return 1
        value = piece.value
        if isinstance(value, cst.Name) and value.value == "None" or values.kind(value) is Kind.MASK:
            return None
        return 0 if isinstance(value, cst.Ellipsis) else 1

    def is_ellipsis(element) -> bool:
        return isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Ellipsis)

    before, after = elements[:position], elements[position + 1:]
    if any(is_ellipsis(e) for e in before):
        if any(is_ellipsis(e) for e in after) or any(width(e) is None for e in after):
            return None
        return -(1 + sum(width(e) for e in after))
    widths = [width(e) for e in before]
    return None if None in widths else sum(widths)


def _clamp(length: cst.BaseExpression, sliced: cst.BaseExpression, dim: int) -> cst.Call:
    """``min(length, sliced.size(dim))``."""
    size = cst.Call(cst.Attribute(sliced, cst.Name("size")), [cst.Arg(cst.Integer(str(dim)) if dim >= 0 else
                                                                        cst.UnaryOperation(cst.Minus(), cst.Integer(str(-dim))))])
    return cst.Call(cst.Name("min"), [cst.Arg(length, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                                      cst.Arg(size)])
