"""What several rules share: argument lists rebuilt after a rewrite, and the recognition of a
model wrapped in DistributedDataParallel/DataParallel.

Rules import from here and from the engine's public names, never from one another, so that a
rule's module holds that rule alone and a rule added through the entry point finds the same
tools.
"""

import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES, Facts, small_statements
from accrewrite.nodes import call_arg, dotted


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
