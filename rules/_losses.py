"""Calls of torch's losses that reduce to one value, read by ACC033 (a running sum of a loss) and
ACC035 (a loss computed from a pipeline's output): a call of a loss function
(``F.cross_entropy(...)``) or of a name bound only to torch's loss modules
(``criterion = nn.CrossEntropyLoss()``), neither given a ``reduction``.
"""

from __future__ import annotations

import libcst as cst

from accrewrite.facts import Facts

# torch.nn.functional's losses, by name.
_LOSS_FUNCTIONS = frozenset({
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_embedding_loss", "margin_ranking_loss",
})


def is_loss_call(facts: Facts, call: cst.Call) -> bool:
    """A call of torch's loss functions, or of a loss module, without ``reduction``: the mean
    the loss has by default."""
    if _given_reduction(call):
        return False
    callee = facts.file.qualname(call.func) or ""
    if callee.startswith("torch.nn.functional."):
        return callee.rpartition(".")[2] in _LOSS_FUNCTIONS
    return type(call.func) is cst.Name and _loss_module(facts, call.func.value, set())


def _given_reduction(call: cst.Call) -> bool:
    return any(arg.keyword is not None and arg.keyword.value == "reduction" for arg in call.args)


def _loss_module(facts: Facts, name: str, seen: set[str]) -> bool:
    """Whether ``name`` is bound only to torch's loss modules, where it is assigned, and where
    it is a parameter, by every caller."""
    if name in seen:
        return False
    seen.add(name)
    made = facts.file.assignments.get(name, ())
    params = [(function, call_arguments) for function in _functions_taking(facts, name)
              for _, _, call_arguments in facts.passed(function)]
    if not made and not params:
        return False
    for value in made:
        while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in ("to", "cuda"):
            value = value.func.value
        callee = facts.file.qualname(value.func) if type(value) is cst.Call else None
        if not callee or not callee.startswith("torch.nn.") or not callee.endswith("Loss") or _given_reduction(value):
            return False
    for _, arguments in params:
        argument = arguments.get(name)
        if type(argument) is not cst.Name:
            return False
        # A caller's name of the same spelling is the one whose assignments were just read.
        if argument.value == name and not made or argument.value != name and not _loss_module(facts, argument.value, seen):
            return False
    return True


def _functions_taking(facts: Facts, name: str) -> list[cst.FunctionDef]:
    return [function for function in facts.file.definitions.functions
            if any(param.name.value == name for param in function.params.params)]
