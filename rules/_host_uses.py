"""Where a loop works on a batch on the host before it moves it (ACC003 then leaves its loader as
it is).

The device loader delivers every element of a batch on the device. A loop whose batch element is
first used on the host, and only then moved, worked on the host tensor in the original: one-hot
labels filled into a tensor made with ``torch.zeros`` (StarGAN's ``label2onehot``), ``.numpy()``,
a numpy or PIL call, or a function of the file that does one of these. Given the element on the
device, that code fails (torch_xla: "mutating a non-functional tensor with a functional tensor")
or mixes devices. Each element (the loop target's names, the values a ``next(it)`` gives, what
is read from them: ``batch["x"]``, ``labels[perm]``) is followed through the loop's statements
in order until it is moved; a use after its move is on the device either way. What counts as a
host-side use, and what carries an element, is the data-flow analysis's
(``ScopeValues.host_use``, ``ScopeValues.carries``).

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from accrewrite.facts import Facts
from accrewrite.nodes import children, dotted, node_types, walk
from accrewrite.values import HOST_USE_NODES, read_names, target_names

# How deep calls of the file's functions are followed (a helper that calls a helper).
_DEPTH = 3
_DEFINED = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})
_SMALL = node_types(cst.BaseSmallStatement)
_COMPREHENSIONS = frozenset({cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp})
# The parts of a compound statement that hold statements (the rest is its header).
_BLOCKS = node_types(cst.BaseSuite, cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler,
                     cst.MatchCase, cst.If)


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

    def __init__(self, facts: Facts):
        self.facts = facts
        # (function, parameter) -> the function's first host-side use of what it is given there.
        self._in_functions: dict[tuple, HostUse | None] = {}

    def in_loop(self, loop: cst.For, scope) -> HostUse | None:
        """In ``loop``'s body, of the names its target binds."""
        return _Follow(self, scope, None, 0).first(loop.body, target_names(loop.target))

    def after_next(self, scope, iterator: str) -> HostUse | None:
        """In ``scope`` (a function, None for module level), of the values ``next(iterator)`` gives."""
        body = scope.body if scope is not None else self.facts.file.module
        return _Follow(self, scope, iterator, 0).first(body, set())

    def in_function(self, function: cst.FunctionDef, param: str, depth: int) -> HostUse | None:
        """In ``function``, of what it is given as ``param``."""
        key = (function, param)
        if key not in self._in_functions:
            self._in_functions[key] = None  # while it is followed (a recursive function)
            self._in_functions[key] = _Follow(self, function, None, depth).first(function.body, {param})
        return self._in_functions[key]


class _Follow:
    """One walk of a body: its statements in order, with the names that hold batch values, until
    the first host-side use of one. After a branch, the names of either path (a value that may
    be the batch's is followed), but for those a path moves: the code after it expects them on
    the device (``if not prefetching: x = x.to(device)``, the loader moving them otherwise)."""

    def __init__(self, uses: HostUses, scope, drawn: str | None, depth: int):
        self.uses = uses
        self.scope = scope
        self.values = uses.facts.values(scope)
        self.drawn = drawn  # the iterator whose ``next()`` gives batches, if any
        self.depth = depth
        self.found: HostUse | None = None
        # The names whose latest binding, on some path, moves a batch value (or reads a number from it).
        self.moved: set[str] = set()

    def first(self, body: cst.CSTNode, batch: set[str]) -> HostUse | None:
        self.block(body, set(batch))
        return self.found

    def block(self, node: cst.CSTNode | None, batch: set[str]) -> set[str]:
        """The batch's names after a block (a suite, ``else``, a handler, an ``elif``, the module)."""
        if node is None:
            return batch
        if type(node) is cst.If:
            return self.statement(node, batch)
        body = node.body
        if type(body) not in (list, tuple):
            return self.block(body, batch)  # else, finally, a handler: their suite
        for statement in body:
            if self.found is not None:
                break
            batch = self.statement(statement, batch)
        return batch

    def statement(self, node: cst.CSTNode, batch: set[str]) -> set[str]:
        kind = type(node)
        if kind in _DEFINED:
            return batch
        if kind is cst.SimpleStatementLine or kind in _SMALL:
            for small in node.body if kind is cst.SimpleStatementLine else (node,):
                self.check(small, batch)
                if type(small) is cst.Assign:
                    for target in small.targets:
                        self.bind(batch, target.target, small.value)
                elif type(small) is cst.AnnAssign and small.value is not None:
                    self.bind(batch, small.target, small.value)
            return batch
        for header in children(node):
            if type(header) not in _BLOCKS:
                self.check(header, batch)
        if kind is cst.If:
            return self.merge(self.block(node.body, set(batch)), self.block(node.orelse, set(batch)))
        if kind is cst.For or kind is cst.While:
            inner = set(batch)
            if kind is cst.For and self.values.carries(node.iter, batch):
                inner |= target_names(node.target)  # for image in images: each of its tensors
            return self.merge(batch, self.block(node.body, inner), self.block(node.orelse, set(batch)))
        if kind is cst.Try or kind is cst.TryStar:
            body = self.block(node.body, set(batch))
            ends = [self.block(node.orelse, set(body))]
            ends += [self.block(handler, self.merge(batch, body)) for handler in node.handlers]
            return self.block(node.finalbody, self.merge(*ends))
        # with, match: each block from the same start
        return self.merge(batch, *(self.block(child, set(batch)) for child in children(node) if type(child) in _BLOCKS))

    def merge(self, *ends: set[str]) -> set[str]:
        """Where paths meet: the batch's names on either, but for those a path moved."""
        return set().union(*ends) - self.moved

    def bind(self, batch: set[str], target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        """Update the batch's names after ``target = value``: ``next(drawn)`` gives batch
        values, and so does an expression that carries one where it is (``label_trg =
        label_org[perm]``, ``x = x.float() / 255``); a move (``x = x.to(device)``), a size read
        from it or anything else does not."""
        if type(target) in (cst.Tuple, cst.List) and type(value) in (cst.Tuple, cst.List) and \
                len(target.elements) == len(value.elements):
            for part, part_value in zip(target.elements, value.elements):
                self.bind(batch, part.value, part_value.value)
            return
        names = target_names(target)
        draws = self.drawn is not None and type(value) is cst.Call and dotted(value.func) == "next" \
            and len(value.args) == 1 and dotted(value.args[0].value) == self.drawn
        if draws or batch and self.values.carries(value, batch):
            batch.update(names)
            self.moved.difference_update(names)
        else:
            if names & batch and read_names(value) & batch:
                self.moved.update(names)  # x = x.to(device), n = x.sum().item()
            batch.difference_update(names)

    def check(self, node: cst.CSTNode, batch: set[str]) -> None:
        """Note the first host-side use of the batch's names in ``node`` (a small statement or a
        compound statement's header)."""
        if not batch or self.found is not None:
            return
        # A comprehension's names that take the batch's tensors (``v`` of ``{k: v.numpy() for k,
        # v in batch.items()}``) -> the batch's name they come from.
        taken: dict[str, str] = {}
        found = self.innermost(node, set(batch), taken)
        if found is not None:
            self.found = replace(found, name=taken.get(found.name, found.name))

    def innermost(self, node: cst.CSTNode, names: set[str], taken: dict[str, str]) -> HostUse | None:
        """The first host-side use in ``node``, the innermost of those inside one another
        (``y.numpy()`` in ``counts += np.bincount(y.numpy())``): it says best what to change."""
        found, at = self.first_use(node, names, taken)
        while at is not None:
            inner, at = self.first_use(at, names, taken, below=True)
            if inner is not None:
                found = inner
        return found

    def first_use(self, node: cst.CSTNode, names: set[str], taken: dict[str, str],
                  below: bool = False) -> tuple[HostUse | None, cst.CSTNode | None]:
        """The first host-side use in ``node`` (``below``: under it) and the node it is at."""
        found = at = None

        def enter(child):
            nonlocal found, at
            kind = type(child)
            if found is not None or kind in _DEFINED:
                return False
            if below and child is node:
                return True
            if kind in _COMPREHENSIONS:
                self.take(child, names, taken)
            found = self.use_at(child, names)
            at = child if found is not None else None
            return found is None

        walk(node, enter)
        return found, at

    def use_at(self, node: cst.CSTNode, names: set[str]) -> HostUse | None:
        """``node``'s own host-side use of the names, or that of the file's function it calls."""
        kind = type(node)
        used = self.values.host_use(node, names) if kind in HOST_USE_NODES else None
        if used is not None:
            return HostUse(used[0], node, node, used[1])
        return self.through_call(node, names) if kind is cst.Call and self.depth < _DEPTH else None

    def take(self, comprehension, names: set[str], taken: dict[str, str]) -> None:
        """Add the names ``comprehension`` binds to the batch's tensors."""
        for_in = comprehension.for_in
        while for_in is not None:
            read = self.values.tensor_read(for_in.iter, names)
            if read is not None and self.values.carries(for_in.iter, names):
                bound = target_names(for_in.target)
                taken.update(dict.fromkeys(bound, taken.get(read, read)))
                names |= bound
            for_in = for_in.inner_for_in

    def through_call(self, call: cst.Call, batch: set[str]) -> HostUse | None:
        """A batch value passed to a function of the file that uses it on the host before it
        moves it (``self.label2onehot(label_org, self.c_dim)``)."""
        callee = self.values.file.callee(call, self.scope)
        if callee is None:
            return None
        function, arguments = callee
        for param, argument in arguments.items():
            name = self.values.tensor_read(argument, batch)
            inner = self.uses.in_function(function, param, self.depth + 1) if name is not None else None
            if inner is not None:
                return HostUse(name, call, inner.use, inner.how)
        return None
