"""What several rules share: argument lists rebuilt after a rewrite, string literals in the file's
quotes, ``with`` statements rid of a context manager, the arguments that say where tensors go,
and the recognition of a model wrapped in DistributedDataParallel/DataParallel.

Rules import from here and from the engine's public names, never from one another, so that a
rule's module holds that rule alone and a rule added through the entry point finds the same
tools.
"""

import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES, Facts, small_statements
from accrewrite.nodes import call_arg, dotted

# Keywords that name where tensors go.
PLACEMENT_KEYWORDS = ("device", "map_location")


def with_commas(args: list[cst.Arg | cst.Element]) -> list[cst.Arg | cst.Element]:
    """Arguments (or a tuple's elements) with a comma after each but the last (the last keeps none)."""
    fixed = []
    for position, arg in enumerate(args):
        last = position == len(args) - 1
        if last:
            fixed.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        elif arg.comma is cst.MaybeSentinel.DEFAULT:
            fixed.append(arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            fixed.append(arg)
    return fixed


def quoted_like(original: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """``new`` in the quotes of the string literal it replaces (the file's quoting is kept)."""
    if isinstance(original, cst.SimpleString) and isinstance(new, cst.SimpleString):
        quote, value = original.quote, new.evaluated_value
        if quote in ('"', "'") and quote not in value and "\\" not in value:
            return new.with_changes(value=f"{quote}{value}{quote}")
    return new


def without_items(with_node: cst.With, dropped: list[bool]) -> cst.With | cst.FlattenSentinel:
    """``with_node`` (a rule's updated node) without the context managers that ``dropped`` marks,
    in the order of its items; where none is left, the statements of its block in its place. They
    keep the ``with``'s leading lines and the comment on its line; the comments that close the
    block go before its last statement, the last place a statement can hold them."""
    kept = [item for item, drop in zip(with_node.items, dropped) if not drop]
    if kept:
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return with_node.with_changes(items=kept)
    block = with_node.body
    if not isinstance(block, cst.IndentedBlock):
        line = cst.SimpleStatementLine(list(block.body), leading_lines=with_node.leading_lines)
        return cst.FlattenSentinel([line])
    body = list(block.body)
    leading = list(with_node.leading_lines)
    if block.header.comment is not None:
        leading.append(cst.EmptyLine(comment=block.header.comment))
    closing = [line for line in block.footer if line.comment is not None]
    body[-1] = body[-1].with_changes(leading_lines=[*body[-1].leading_lines, *closing])
    body[0] = body[0].with_changes(leading_lines=[*leading, *body[0].leading_lines])
    return cst.FlattenSentinel(body)


def placement_arguments(facts: Facts, call: cst.Call) -> list[cst.BaseExpression]:
    """The arguments of ``call`` that say where tensors go, which ACC002 makes the target's device
    where they name CUDA: every one of ``x.cuda(...)``, the first of ``x.to(...)`` and
    ``torch.device(...)``, and ``device=`` and ``map_location=`` where ``places_by_keyword``."""
    func = call.func
    callee = facts.qualname(func)
    method = func.attr.value if isinstance(func, cst.Attribute) and callee is None else None
    if method == "cuda":
        return [arg.value for arg in call.args]
    first = call_arg(call, 0, "device") if method == "to" else call_arg(call, 0, "type") if callee == "torch.device" \
        else None
    found = [first.value] if first is not None else []
    if places_by_keyword(facts, call):
        found += [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value in PLACEMENT_KEYWORDS]
    return found


def places_by_keyword(facts: Facts, call: cst.Call) -> bool:
    """Whether an index ``call`` takes as ``device=`` is a device to place on: not where a
    function of this file takes it (it may read it as a rank), nor one of torch.cuda's, which
    asks about a CUDA device (ACC010 migrates it with its arguments)."""
    return not facts.defines(call.func) and not (facts.qualname(call.func) or "").startswith("torch.cuda.")


def wraps_model(facts: Facts, node: cst.CSTNode) -> bool:
    """Whether ``node`` is a DistributedDataParallel/DataParallel call, however imported."""
    return isinstance(node, cst.Call) and facts.qualname(node.func) in WRAPPER_NAMES


def wrapped_module(ctx, original: cst.Call, updated: cst.Call, by_hand: str) -> cst.Arg | None:
    """The argument holding the module a DDP/DataParallel call wraps, or None, after a finding
    that says what to do ``by_hand``, where star arguments or its absence hide it."""
    module = call_arg(updated, 0, "module")
    if module is None or any(arg.star for arg in original.args):
        ctx.diagnose(original, "the module this wrapper wraps cannot be told; left as it is", by_hand)
        return None
    return module


def wrapped_models_of(ctx) -> set[str] | None:
    """``wrapped_models`` of the rule context's file, or None where the file never names
    DataParallel (a cheap gate before any name is resolved)."""
    if "DataParallel" not in ctx.source_text:
        return None
    return wrapped_models(ctx.facts, ctx.module)


def wrapped_models(facts: Facts, module: cst.Module) -> set[str]:
    """Names assigned a DDP/DataParallel wrapper anywhere in the file (`model = DDP(model)`,
    `self.model = DDP(...)`, `model = DDP(model) if ddp else model`)."""
    names = set()
    for node in small_statements(module):
        if type(node) is not cst.Assign or len(node.targets) != 1:
            continue
        target = dotted(node.targets[0].target)
        values = [node.value.body, node.value.orelse] if isinstance(node.value, cst.IfExp) else [node.value]
        if target and any(wraps_model(facts, value) for value in values):
            names.add(target)
    return names
