"""A corpus moved to the device once and sliced every step (pytorch/examples' word_language_model:
``batchify`` returns ``data.to(device)``, ``get_batch`` returns ``source[i:i + seq_len]``), which
ACC029 keeps on the host, moving each slice instead, and ACC103 reports where ACC029 does not run.

The move can go only where the corpus is never needed on the device whole: every read of it, and
of each parameter of the file's functions that it is passed to, is a slice (moved where it is
made), its size (``.size()``, ``.shape``, ``len()``), or an argument of such a function that every
caller passes a corpus. Anything else (a model called on it, an in-place write, a function that
receives another tensor too) leaves the file as it is.

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accrewrite.nodes import descendants, dotted, walk
from accrewrite.rule import RuleContext
from accrewrite.values import TENSORS, Kind

# The rule that keeps such a corpus on the host; ACC103 leaves its slices to it when it runs.
HOST_CORPUS_RULE = "ACC029"
# What may be read of a corpus on the host with the same result as on the device.
_SIZE_METHODS = frozenset({"size", "dim", "numel"})
_SIZE_ATTRIBUTES = frozenset({"shape", "ndim"})
# What a corpus may be, as the value analysis knows it (a helper's result is often unknown).
_CORPUS_KINDS = frozenset({*TENSORS, Kind.UNKNOWN})
# What has names of its own, which a walk of one scope does not enter.
_SCOPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})
# Statements whose targets bind or write: a corpus named there is rebound or written in place.
_BINDING = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.Del, cst.WithItem, cst.CompFor, cst.NamedExpr)


@dataclass
class HostCorpus:
    """What keeping the file's corpora on the host changes: each move to the device that goes
    (``data.to(device)`` -> ``data``, ``data.cuda()`` -> ``data``), each slice that is moved
    instead, and the device name the corpora were moved with, which the slices are moved with
    (None where they were moved with ``.cuda()``: the slices go to the target's device)."""

    moves: dict[cst.Call, cst.BaseExpression] = field(default_factory=dict)
    slices: set[cst.Subscript] = field(default_factory=set)
    device: cst.Name | None = None


def host_corpus(ctx: RuleContext) -> HostCorpus:
    """The file's ``HostCorpus``, worked out once; empty where no corpus can be kept on the host,
    or where a ``# noqa`` for the rule covers one of its changes (the corpus on the host and a
    slice left unmoved would not run)."""
    if "host_corpus" not in ctx.shared:
        moves = ".to(" in ctx.source_text or ".cuda()" in ctx.source_text
        found = _Search(ctx).run() if moves else HostCorpus()
        if any(ctx.suppressed(HOST_CORPUS_RULE, node) for node in (*found.moves, *found.slices)):
            found = HostCorpus()
        ctx.shared["host_corpus"] = found
    return ctx.shared["host_corpus"]


class _Unsound(Exception):
    """A corpus is read where the host copy would not do."""


@dataclass(frozen=True)
class _Group:
    """Corpora that go to the host together: a name bound to ``value.to(device)`` (or
    ``value.cuda()``), or every name bound to a call of the file's function that returns such a
    move, and that move."""

    bindings: dict[str, cst.Assign]
    move: cst.Call


class _Search:
    def __init__(self, ctx: RuleContext) -> None:
        self.facts = ctx.facts
        self.module = ctx.module

    def run(self) -> HostCorpus:
        """The groups kept on the host, each taken where the file reads it and those taken
        before it soundly and it adds slices to move; all moved to the same device."""
        found, taken = HostCorpus(), []
        kinds = self.facts.values(None)
        for group in self._groups():
            if any(kinds.summary_kind(name) not in _CORPUS_KINDS for name in group.bindings):
                continue  # a model moved to the device, say
            device = group.move.args[0].value if group.move.args else None
            if taken and dotted(device) != dotted(found.device) \
                    or device is not None and not self._module_level_name(device.value):
                continue
            try:
                slices = _Reads(self, [*taken, group]).slices()
            except _Unsound:
                continue
            if len(slices) > len(found.slices):
                taken.append(group)
                found = HostCorpus({g.move: g.move.func.value for g in taken}, slices, device)
        return found

    def _groups(self) -> list[_Group]:
        """Module-level ``name = value.to(device)`` and ``name = f(...)`` where the file's
        function ``f`` returns ``value.to(device)`` and every call of ``f`` is such a binding;
        each name bound once in the file."""
        groups, makers = [], {}
        for name, assign in _module_assignments(self.module).items():
            if len(self.facts.file.assignments.get(name, ())) != 1:
                continue
            if _moves(assign.value):
                groups.append(_Group({name: assign}, assign.value))
            elif (maker := self._maker(assign.value)) is not None:
                makers.setdefault(maker, {})[name] = assign
        groups += [_Group(made, _returned(maker)) for maker, made in makers.items()
                   if len(self.facts.file_values.calls_of(maker)) == len(made)]
        return groups

    def _maker(self, value: cst.BaseExpression) -> cst.FunctionDef | None:
        if not isinstance(value, cst.Call):
            return None
        called = self.facts.file_values.callee(value, None)
        if called is None or self.facts.file.definitions.functions[called[0]].owner is not None:
            return None
        return called[0] if _moves(_returned(called[0])) else None

    def _module_level_name(self, name: str) -> bool:
        return name in self.facts.file.local_names.get(self.module, ()) and not any(
            name in self.locals(function) for function in self.facts.file.definitions.functions)

    def locals(self, function: cst.FunctionDef) -> frozenset[str]:
        """The names local to ``function``: its parameters and what its body binds."""
        return self.facts.file.local_names[function.body] | _names_in(function.params)


class _Reads:
    """Whether the host copies of some groups' corpora answer every read of them as the device
    copies do, and the slices to move."""

    def __init__(self, search: _Search, groups: list[_Group]) -> None:
        self.search = search
        self.facts = search.facts
        self.groups = groups
        self.own = {assign for group in groups for assign in group.bindings.values()}
        self.found: set[cst.Subscript] = set()
        # Scopes (a function, or None for module level) -> the names that hold a corpus there;
        # functions -> their parameters that receive one.
        self.holders: dict[cst.FunctionDef | None, set[str]] = {}
        self.received: dict[cst.FunctionDef, set[str]] = {}

    def slices(self) -> set[cst.Subscript]:
        """The corpora's slices; raises ``_Unsound`` where a read needs the device copy."""
        self._check_reads(self.search.module, None, {name for group in self.groups for name in group.bindings})
        self._check_callers()
        for scope in self.holders:
            self._check_batches(scope)
        return self.found

    def _check_reads(self, node: cst.CSTNode, scope: cst.FunctionDef | None, names: set[str]) -> None:
        """Every read of ``names`` (corpora) under ``node`` is one the host copy answers alike;
        raises ``_Unsound`` at the first that is not."""
        self.holders.setdefault(scope, set()).update(names)

        def enter(child):
            if isinstance(child, cst.FunctionDef):
                inner = names - self.search.locals(child)
                if inner:
                    self._check_reads(child.body, child, inner)
                return False
            if isinstance(child, (cst.Lambda, cst.ClassDef)) and _names_in(child) & names:
                raise _Unsound  # read where this walk does not follow
            if child in self.own:
                self._check_reads(child.value, scope, names)
                return False
            if isinstance(child, _BINDING) and _bound_names(child) & names:
                raise _Unsound  # rebound, or written in place
            return self._read(child, scope, names)

        walk(node, enter)

    def _read(self, node: cst.CSTNode, scope: cst.FunctionDef | None, names: set[str]) -> bool:
        """Note a read of a corpus that ``node`` makes; False where its children need no look."""
        if isinstance(node, cst.Name) and node.value in names:
            raise _Unsound  # a read that is none of those below
        if isinstance(node, cst.Subscript) and _is_name(node.value, names):
            self.found.add(node)
            return self._read_parts([e.slice for e in node.slice], scope, names)
        if isinstance(node, cst.Attribute) and _is_name(node.value, names) and node.attr.value in _SIZE_ATTRIBUTES:
            return False
        if not isinstance(node, cst.Call):
            return True
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda") \
                and isinstance(func.value, cst.Subscript) and _is_name(func.value.value, names):
            # a slice moved where it is made already
            return self._read_parts([*(e.slice for e in func.value.slice), *(a.value for a in node.args)], scope, names)
        if isinstance(func, cst.Attribute) and _is_name(func.value, names) and func.attr.value in _SIZE_METHODS \
                or isinstance(func, cst.Name) and func.value == "len" and len(node.args) == 1:
            return self._read_parts([a.value for a in node.args if not _is_name(a.value, names)], scope, names)
        if not any(_is_name(arg.value, names) for arg in node.args):
            return True
        self._pass(node, scope, names)
        return self._read_parts([func, *(a.value for a in node.args if not _is_name(a.value, names))], scope, names)

    def _read_parts(self, parts: list[cst.CSTNode], scope, names: set[str]) -> bool:
        for part in parts:
            walk(part, lambda n: self._read(n, scope, names))
        return False

    def _pass(self, call: cst.Call, scope: cst.FunctionDef | None, names: set[str]) -> None:
        """A corpus passed to a function of the file: its parameter is read as a corpus is."""
        called = self.facts.file_values.callee(call, scope)
        if called is None or any(a.star for a in call.args):
            raise _Unsound
        function, arguments = called
        params = {param for param, argument in arguments.items() if _is_name(argument, names)}
        if len(params) != sum(1 for a in call.args if _is_name(a.value, names)):
            raise _Unsound
        new = params - self.received.get(function, set())
        if new:
            self.received.setdefault(function, set()).update(new)
            self._check_reads(function.body, function, new)

    def _check_callers(self) -> None:
        """Every call of a function that receives a corpus passes one there: a slice of any
        other tensor would be moved too."""
        for function, params in self.received.items():
            for caller, _, arguments in self.facts.passed(function):
                held = self.holders.get(caller, set())
                if any(not _is_name(arguments.get(param), held) for param in params):
                    raise _Unsound

    def _check_batches(self, scope: cst.FunctionDef | None) -> None:
        """No batch sliced out of a corpus in ``scope`` is written in place (``data += 1``,
        ``data[mask] = 0``, ``data.clamp_(...)``): on the device that wrote the corpus too, while
        a moved slice is a copy. A batch is a name bound to a slice, or to what a function that
        receives a corpus returns."""
        body = scope.body if scope is not None else self.search.module
        batches = set()
        for node in descendants(body, prune=_SCOPES):
            if isinstance(node, cst.Assign) and (node.value in self.found or self._returns_a_slice(node.value, scope)):
                batches |= {name for target in node.targets for name in _names_in(target.target)}
        if not batches:
            return
        for node in descendants(body, prune=_SCOPES):
            if isinstance(node, (cst.Assign, cst.AugAssign)):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                if any(isinstance(t, cst.Subscript) and _names_in(t.value) & batches for t in targets) \
                        or isinstance(node, cst.AugAssign) and _is_name(node.target, batches):
                    raise _Unsound
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and _is_name(node.func.value, batches) and _in_place(node.func.attr.value):
                raise _Unsound

    def _returns_a_slice(self, value: cst.BaseExpression, scope: cst.FunctionDef | None) -> bool:
        called = self.facts.file_values.callee(value, scope) if isinstance(value, cst.Call) else None
        return called is not None and called[0] in self.received


def _module_assignments(module: cst.Module) -> dict[str, cst.Assign]:
    """The module body's own ``name = value`` statements (not those in a block)."""
    found = {}
    for statement in module.body:
        for small in getattr(statement, "body", ()) if isinstance(statement, cst.SimpleStatementLine) else ():
            target = small.targets[0].target if isinstance(small, cst.Assign) and len(small.targets) == 1 else None
            if isinstance(target, cst.Name):
                found[target.value] = small
    return found


def _moves(value: cst.BaseExpression | None) -> bool:
    """``x.to(device)`` (one argument, a name) or ``x.cuda()``."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
        return False
    if value.func.attr.value == "cuda":
        return not value.args
    return value.func.attr.value == "to" and len(value.args) == 1 and value.args[0].keyword is None \
        and not value.args[0].star and isinstance(value.args[0].value, cst.Name)


def _returned(function: cst.FunctionDef) -> cst.BaseExpression | None:
    """The value of ``function``'s one ``return``, the last statement of its body; else None."""
    returns = [node for node in descendants(function.body, prune=_SCOPES) if isinstance(node, cst.Return)]
    last = function.body.body[-1] if function.body.body else None
    if len(returns) != 1 or not isinstance(last, cst.SimpleStatementLine) or last.body[-1] is not returns[0]:
        return None
    return returns[0].value


def _in_place(method: str) -> bool:
    """``add_``, ``clamp_``: a tensor method that writes the tensor."""
    return method.endswith("_") and not method.startswith("_")


def _is_name(node: cst.CSTNode | None, names: set[str]) -> bool:
    return isinstance(node, cst.Name) and node.value in names


def _names_in(node: cst.CSTNode) -> set[str]:
    found = set()
    walk(node, lambda n: found.add(n.value) if isinstance(n, cst.Name) else None)
    return found


def _bound_names(node: cst.CSTNode) -> set[str]:
    """The names ``node``'s targets bind or write (``x`` of ``x = v``, ``x[i] = v``, ``for x in``)."""
    if isinstance(node, cst.Assign):
        return {name for target in node.targets for name in _names_in(target.target)}
    if isinstance(node, cst.WithItem):
        return _names_in(node.asname.name) if node.asname else set()
    return _names_in(node.target)
