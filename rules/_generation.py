"""Token-by-token generation, which ACC003 and ACC103 both look for: a loop that calls a model
and grows a tensor by concatenating onto it every iteration (``idx = torch.cat((idx, idx_next),
dim=1)``, a GPT's ``generate``). On a lazy target the graph of such a loop grows with every token
unless each iteration ends the step (ACC003), and every new length compiles a new graph (ACC103).

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

import libcst as cst

from accrewrite.nodes import dotted, walk
from accrewrite.facts import Facts
from accrewrite.values import Kind, ScopeValues

_CONCATENATE = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})


def grown_sequence(facts: Facts, loop: cst.For | cst.While, values: ScopeValues) -> str | None:
    """The name that ``loop`` (in the scope whose ``values`` are given) grows by concatenating
    onto it every iteration, when the loop also calls a model; None for any other loop."""
    grown = None

    def enter(child):
        nonlocal grown
        if isinstance(child, (cst.FunctionDef, cst.ClassDef)):
            return False
        if grown is None and isinstance(child, cst.Assign) and len(child.targets) == 1 \
                and isinstance(child.value, cst.Call) and concatenates_itself(facts, child.targets[0].target, child.value):
            grown = dotted(child.targets[0].target)
        return True

    walk(loop.body, enter)
    return grown if grown is not None and calls_a_model(loop.body, values) else None


def concatenates_itself(facts: Facts, target: cst.BaseExpression, call: cst.Call) -> bool:
    """``idx = torch.cat((idx, idx_next), dim=1)``."""
    if facts.file.qualname(call.func) not in _CONCATENATE or not call.args:
        return False
    parts = call.args[0].value
    name = dotted(target)
    return isinstance(parts, (cst.Tuple, cst.List)) and any(dotted(e.value) == name for e in parts.elements)


def calls_a_model(body: cst.CSTNode, values) -> bool:
    """Whether ``body`` calls a model (an evaluation or a generation loop)."""
    found = False

    def enter(child):
        nonlocal found
        found = found or isinstance(child, cst.Call) and values.kind(child.func) is Kind.MODEL
        return not found

    walk(body, enter)
    return found
