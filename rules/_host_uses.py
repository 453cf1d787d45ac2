"""Where a loop works on a batch on the host before it moves it (ACC003 then leaves its loader as
it is).

The device loader delivers every element of a batch on the device. A loop whose batch element is
first used on the host, and only then moved, worked on the host tensor in the original: one-hot
labels filled into a tensor made with ``torch.zeros`` (StarGAN's ``label2onehot``), ``.numpy()``,
a numpy or PIL call, or a function of the file that does one of these. Given the element on the
device, that code fails (torch_xla: "mutating a non-functional tensor with a functional tensor")
or mixes devices. Each element is followed through the loop in source order (the loop target's
names, the values a ``next(it)`` gives, what is read from them: ``batch["x"]``,
``labels[perm]``) until it is moved; a use after its move is on the device either way. What
counts as a host-side use is the data-flow analysis's (``ScopeValues.host_use``).

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accrewrite.nodes import children, dotted, node_types, walk
from accrewrite.values import HOST, target_names

# How deep calls of the file's functions are followed (a helper that calls a helper).
_DEPTH = 3
_SMALL_STATEMENTS = node_types(cst.BaseSmallStatement)
_DEFINITIONS = frozenset({cst.FunctionDef, cst.ClassDef})
# What holds statements: a compound statement's header expressions are read where it starts.
_BLOCKS = node_types(cst.BaseCompoundStatement, cst.BaseSuite, cst.SimpleStatementLine, cst.Else,
                     cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase)


@dataclass(frozen=True, eq=False)
class HostUse:
    """A batch element ``name`` used on the host: ``at``, an expression of the fed code, uses it
    there or calls the file's function that does; ``use`` is the host-side use itself, and
    ``how`` says what it does."""

    name: str
    at: cst.CSTNode
    use: cst.CSTNode
    how: str


class HostUses:
    """The first host-side use of a batch element before its move, in a loop over a loader or
    after the ``next()`` calls of an iterator, from the file's analysis (``Facts``)."""

    def __init__(self, facts):
        self.facts = facts
        # (function, parameter) -> the function's first host-side use of what it is given there.
        self._in_functions: dict[tuple, HostUse | None] = {}

    def in_loop(self, loop: cst.For, scope) -> HostUse | None:
        """In ``loop``'s body, of the names its target binds."""
        return self._first(loop.body, scope, target_names(loop.target), None, 0)

    def after_next(self, scope, iterator: str) -> HostUse | None:
        """In ``scope`` (a function, None for module level), of the values ``next(iterator)`` gives."""
        body = scope.body if scope is not None else self.facts.module
        return self._first(body, scope, set(), iterator, 0)

    def _first(self, body: cst.CSTNode, scope, batch: set[str], drawn: str | None, depth: int) -> HostUse | None:
        """The first host-side use in ``body`` of ``batch``'s names and of the names assigned
        ``next(drawn)``, followed through assignments in source order until they are moved."""
        values = self.facts.values(scope)
        batch = set(batch)
        found = None

        def enter(node):
            nonlocal found
            kind = type(node)
            if found is not None or kind in _DEFINITIONS:
                return False
            if kind in _SMALL_STATEMENTS:
                if batch:
                    found = self._in_code(node, values, scope, batch, depth)
                if kind is cst.Assign:
                    for target in node.targets:
                        self._bind(batch, target.target, node.value, values, drawn)
                return False
            if kind in _BLOCKS:
                if kind is not cst.SimpleStatementLine and batch:
                    headers = [child for child in children(node) if type(child) not in _BLOCKS]
                    found = next(filter(None, (self._in_code(h, values, scope, batch, depth) for h in headers)), None)
                    if kind is cst.For and found is None and values.tensor_read(node.iter, batch):
                        batch.update(target_names(node.target))  # for x in batch: each of its tensors
                return True
            return False

        walk(body, enter)
        return found

    def _bind(self, batch: set[str], target: cst.BaseExpression, value: cst.BaseExpression, values, drawn) -> None:
        """Update the batch's names after ``target = value``: ``next(drawn)`` gives batch
        values, and so does an expression that reads one (``label_trg = label_org[perm]``),
        but for a Python value read from it (``n = x.size(0)``); a move (``x = x.to(device)``)
        or anything else does not."""
        if type(target) in (cst.Tuple, cst.List) and type(value) in (cst.Tuple, cst.List) and \
                len(target.elements) == len(value.elements):
            for part, part_value in zip(target.elements, value.elements):
                self._bind(batch, part.value, part_value.value, values, drawn)
            return
        names = target_names(target)
        draws = type(value) is cst.Call and dotted(value.func) == "next" and len(value.args) == 1 \
            and drawn is not None and dotted(value.args[0].value) == drawn
        if draws or batch and values.tensor_read(value, batch) and values.kind(value) not in HOST:
            batch.update(names)
        else:
            batch.difference_update(names)

    def _in_code(self, node: cst.CSTNode, values, scope, batch: set[str], depth: int) -> HostUse | None:
        """The first host-side use of the batch's names in ``node`` (a statement or an expression)."""
        found = None

        def enter(child):
            nonlocal found
            if found is not None or type(child) in _DEFINITIONS or type(child) is cst.Lambda:
                return False
            used = values.host_use(child, batch)
            if used is not None:
                found = HostUse(used[0], child, child, used[1])
            elif type(child) is cst.Call and depth < _DEPTH:
                found = self._through_call(child, values, scope, batch, depth)
            return found is None

        walk(node, enter)
        return found

    def _through_call(self, call: cst.Call, values, scope, batch: set[str], depth: int) -> HostUse | None:
        """A batch value passed to a function of the file that uses it on the host before it
        moves it (``self.label2onehot(label_org, self.c_dim)``)."""
        callee = values.file.callee(call, scope)
        if callee is None:
            return None
        function, arguments = callee
        for param, argument in arguments.items():
            name = values.tensor_read(argument, batch)
            if name is None:
                continue
            key = (function, param)
            if key not in self._in_functions:
                self._in_functions[key] = None  # while it is followed (a recursive function)
                self._in_functions[key] = self._first(function.body, function, {param}, None, depth + 1)
            inner = self._in_functions[key]
            if inner is not None:
                return HostUse(name, call, inner.use, inner.how)
        return None
