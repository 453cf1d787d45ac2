"""Which loops over a loader the device loader must feed, and where it goes (ACC003's plan).

A loop over a loader *feeds the device* when its batches reach it: it moves a batch value
(``x = x.to(device)``, ``.cuda()``), or it runs a model (trains, calls one, hands one to a
helper) that is placed on a device: in a file that places something on a device (DataParallel
moved its inputs itself), but for models the file builds and never moves (``kept_on_host`` of
the data flow), or given by a caller that may have placed it. A loop that only looks
at a batch (its shape, a plot) keeps the loader: its batches stay on the host, as the original's
did; so does one that works on a batch element on the host before it moves it
(``rules/_host_uses.py``): ``left``. A file that trains models of its own and places nothing
trains on the host: ``on_host``.

Each loader assignment is either *rebound* to the target's device loader (``loader =
pl.MpDeviceLoader(loader, device)``, where that stands in for the loader) at one point, or left
as it is, and then each loop that must be fed is wrapped where it iterates the loader (``for x in
pl.MpDeviceLoader(loader, device)``). A rebind point comes after the loader and the device exist,
before every use it must feed and after every use that keeps the loader, or there is none. A loop
over a function's parameter is fed by its callers' rebound loaders when every call in the file
passes one; otherwise it is wrapped itself, and the loaders passed to it are not rebound (they
would be wrapped twice). The device a wrap names is a device variable bound at that point, else
the target's device call.

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

import libcst as cst

from accrewrite.facts import Facts
from accrewrite.nodes import dotted, walk
from accrewrite.rules._generation import calls_a_model
from accrewrite.rules._host_uses import HostUse, HostUses
from accrewrite.targets import spelled_callees
from accrewrite.values import ITERATE_THROUGH, Kind, target_names

_DEVICE_LOADERS = spelled_callees("device_loader")
# What a parameter may be given besides a loader assignment of this file: anything (another
# file's call, an expression) or a device loader already.
_UNKNOWN, _DEVICE_LOADER = "unknown", "device loader"
# Calls whose iteration is their first argument's: the loader behind ``enumerate(loader)``.
_PASSING = frozenset({"enumerate", "iter", "tqdm", "trange", "islice", "zip", "log_every"})
_COMPREHENSIONS = frozenset({cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp})


def iterated(node: cst.BaseExpression) -> cst.BaseExpression:
    """What a for loop's iterable iterates: itself, or the loader that ``enumerate(...)``,
    ``tqdm(...)`` or ``metric_logger.log_every(...)`` pass through."""
    while isinstance(node, cst.Call):
        name = (dotted(node.func) or "").split(".")[-1]
        positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
        if name.lower() not in _PASSING or not positional:
            return node
        node = positional[0]
    return node


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call in ``node``'s subtree, in source order."""
    found = []
    walk(node, lambda child: found.append(child) if isinstance(child, cst.Call) else None)
    return found


def root(node: cst.CSTNode) -> str | None:
    """``x`` for ``x``, ``x.a``, ``x[0]``, ``x.float()``, ``x[0].view(-1)``: the name a value is
    read from, through attributes, subscripts and method calls."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        elif isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        else:
            return node.value if isinstance(node, cst.Name) else None


@dataclass(eq=False)
class Use:
    """A place a loader binding's batches are read: a loop over it (or over a parameter it is
    passed as), an ``iter()`` of it. ``order`` is where it runs in the binding's scope (None:
    in another function, at a time this file does not show)."""

    order: int | None
    fed: bool


@dataclass(eq=False)
class Plan:
    # Statement -> the (loader, device) rebinds to insert after it.
    rebinds: dict[cst.CSTNode, list[tuple[str, str | None]]] = field(default_factory=dict)
    # Loops (and ``iter()`` calls) to wrap where they read the loader: node -> (loader, device).
    wraps: dict[cst.CSTNode, tuple[str, str | None]] = field(default_factory=dict)
    # Loops fed by the device loader (wrapped here or rebound), whose per-batch moves go.
    fed: set[cst.CSTNode] = field(default_factory=set)
    # The first training loop of a file that trains on the host: nothing placed on a device,
    # and the models trained are the file's own (a helper given its model by a caller is not).
    on_host: cst.CSTNode | None = None
    # Each statement line of a loader loop: the names that hold batch values where it starts.
    batch_at: dict[cst.CSTNode, frozenset[str]] = field(default_factory=dict)
    # Loops (and ``iter()`` calls) that would be fed but use a batch element on the host before
    # they move it: node -> (that use, the loader left as it is).
    left: dict[cst.CSTNode, tuple[HostUse, str]] = field(default_factory=dict)


class Planner:
    """Builds the plan from the file's analysis (``Facts``): its loops, loader assignments,
    devices and the data-flow values of each function."""

    def __init__(self, facts: Facts, move, rebind: bool):
        self.facts = facts
        self.is_move = move  # (call, batch names) -> whether it moves a batch to the device
        self.rebind = rebind
        self.plan = Plan()
        self._loops_in: dict[cst.FunctionDef | None, list[cst.For]] = {}
        for loop, scope in facts.for_loops:
            self._loops_in.setdefault(scope, []).append(loop)
        self._training = {loop.node for loop in facts.loops}
        self._fed: dict[cst.For, bool] = {}
        self._host_uses = HostUses(facts)
        # (scope, iterator) -> the first host-side use of what ``next(iterator)`` gives.
        self._drawn_on_host: dict[tuple, HostUse | None] = {}
        self._source_of: dict[cst.For, str | None] = {}
        # Indexes: loops and loader assignments are looked up, not each matched against all the
        # others. (scope, name) -> the scope's loops that read the name, and the scope's loader
        # assignments of it in order (their orders beside them, to bisect).
        self._reading: dict[tuple, list[cst.For]] = {}
        for loop, scope in facts.for_loops:
            self._reading.setdefault((scope, self._source(loop, scope)), []).append(loop)
        self._assigned: dict[tuple, list] = {}
        for binding in sorted(facts.loader_bindings, key=lambda binding: binding.order):
            self._assigned.setdefault((binding.scope, binding.name), []).append(binding)
        self._assigned_orders = {key: [b.order for b in found] for key, found in self._assigned.items()}
        # name -> the functions with loops that read it; (scope, name) -> the ``iter()`` calls of it.
        self._readers: dict[str, list] = {}
        for scope, name in self._reading:
            if scope is not None:
                self._readers.setdefault(name, []).append(scope)
        self._iterated: dict[tuple, list[tuple]] = {}
        for call, scope, statement in facts.iter_calls:
            self._iterated.setdefault((scope, dotted(call.args[0].value)), []).append((call, statement))
        # (name, scope) of the ``next()`` calls in a training loop.
        self._next_in_steps = {(read, where) for read, where, loops in facts.next_calls
                               if any(loop in self._training for loop in loops)}
        # (calling function, name) -> (function of this file, its parameter, the call) for each
        # call that passes the name on.
        self._passing: dict[tuple, list[tuple]] = {}
        for function in facts.file_values.functions:
            for caller, call, arguments in facts.passed(function):
                for param, argument in arguments.items():
                    name = dotted(argument)
                    if name is not None:
                        self._passing.setdefault((caller, name), []).append((function, param, call))

    def build(self) -> Plan:
        facts = self.facts
        bindings = [b for b in facts.loader_bindings if b.name not in facts.device_loaders]
        uses = {binding: self._uses(binding) for binding in bindings}
        anchors = {}
        if self.rebind:
            for binding in bindings:
                anchor = self._anchor(binding, uses[binding])
                if anchor is not None:
                    anchors[binding] = anchor
        served = self._settle(anchors)
        for binding, (statement, device) in anchors.items():
            self.plan.rebinds.setdefault(statement, []).append((binding.name, device))
        for loop, scope in facts.for_loops:
            if self._device_loader(loop, scope):
                self.plan.fed.add(loop)
            elif self._loader_loop(loop, scope) is not None and self.fed(loop, scope):
                self.plan.fed.add(loop)
                if not self._rebound(loop, scope, anchors, served):
                    self.plan.wraps[loop] = (dotted(iterated(loop.iter)), self._device(scope, loop))
        placed = facts.places_on_device
        if not placed and facts.loops and not any(self._model_from_caller(loop.node, loop.scope) for loop in facts.loops):
            self.plan.on_host = min((loop.node for loop in facts.loops), key=facts.order.get)
        for call, scope, statement in facts.iter_calls:
            name = dotted(call.args[0].value)
            if name is None or name in facts.device_loaders or not self._feeds_steps(call, scope, statement):
                continue
            if facts.values(scope).kind(call.args[0].value) is Kind.LOADER and not self._rebound_name(
                    name, scope, statement, anchors):
                self.plan.wraps[call] = (name, self._device(scope, statement))
        return self.plan

    # Loops ------------------------------------------------------------------------------------

    def _device_loader(self, loop: cst.For, scope) -> bool:
        """Whether a loop reads a target's device loader already (a migrated file)."""
        return self._source(loop, scope) in self.facts.device_loaders or any(
            self.facts.file.qualname(call.func) in _DEVICE_LOADERS for call in calls_in(loop.iter))

    def _loader_loop(self, loop: cst.For, scope) -> str | None:
        """The dotted name a loop iterates when it is a loader (not a device loader already)."""
        source = iterated(loop.iter)
        name = dotted(source)
        if name is None or name in self.facts.device_loaders:
            return None
        return name if self.facts.values(scope).kind(source) is Kind.LOADER else None

    def _source(self, loop: cst.For, scope) -> str | None:
        """The dotted name of what a loop reads batches from: what it iterates, through
        ``enumerate``/``tqdm`` and through a name assigned one of them (``pbar = tqdm(loader)``)."""
        if loop not in self._source_of:
            source = iterated(loop.iter)
            if isinstance(source, cst.Name) and self._may_stand_for_another(source.value):
                behind = iterated(self.facts.values(scope).assigned_value(source))
                if behind is not source and dotted(behind) is not None:
                    source = behind
            self._source_of[loop] = dotted(source)
        return self._source_of[loop]

    def _may_stand_for_another(self, name: str) -> bool:
        """Whether an assignment of ``name`` in the file gives it another iterable's batches: a
        name, an attribute, or a call that iterates its first argument (``tqdm(loader)``).
        Where none does, a loop over ``name`` reads ``name``, without the function's values."""
        for value in self.facts.file.assignments.get(name, ()):
            if type(value) in (cst.Name, cst.Attribute):
                return True
            if type(value) is cst.Call:
                callee = (dotted(value.func) or "").split(".")[-1].lower()
                if callee in _PASSING or callee in ITERATE_THROUGH:
                    return True
        return False

    def fed(self, loop: cst.For, scope) -> bool:
        """Whether the loop's batches reach the device (see the module's doc)."""
        found = self._fed.get(loop)
        if found is None:
            values = self.facts.values(scope)
            runs = loop in self._training or calls_a_model(loop.body, values) or _hands_a_model(loop.body, values)
            found = self._moves_a_batch(loop) or runs and (
                self._model_from_caller(loop, scope) or self.facts.places_on_device and not self._on_host(loop, scope))
            if found:
                used = self._host_uses.in_loop(loop, scope)
                if used is not None:
                    self.plan.left[loop] = (used, self._source(loop, scope))
                    found = False
            self._fed[loop] = found
        return found

    def _model_from_caller(self, loop: cst.For | cst.While, scope) -> bool:
        """Whether the model a loop runs may be placed by code this file does not show: it is a
        parameter of the loop's function or an attribute of ``self`` (a training helper that
        another file calls), or no model is named in a loop of a function that is given
        arguments. A loop that names none where nothing is passed in (makemore's tensors built
        by hand, updated by hand) trains what this file made."""
        values = self.facts.values(scope)
        params = set(values.file.functions[scope].params) if scope is not None else set()
        roots = {root(name) for name in _names(loop.body) if values.kind(name) is Kind.MODEL}
        return bool(roots & (params | {"self"})) if roots else bool(params)

    def _on_host(self, loop: cst.For, scope) -> bool:
        """Whether every model the loop runs is one of this file that stays on the host where
        it is built (a course's first model, trained on the CPU before others are placed)."""
        values = self.facts.values(scope)
        roots = {root(name) for name in _names(loop.body) if values.kind(name) is Kind.MODEL}
        return bool(roots) and all(values.file.kept_on_host(name) for name in roots)

    def _moves_a_batch(self, loop: cst.For) -> bool:
        """Whether the loop moves a value read from its batch to the device; records, for each
        statement line of its body, the names that hold batch values where it starts."""
        batch = batch_names(loop)
        moved = False

        def enter(node):
            nonlocal moved
            kind = type(node)
            if kind is cst.FunctionDef or kind is cst.ClassDef or kind is cst.Lambda:
                return False
            if kind is cst.SimpleStatementLine:
                self.plan.batch_at[node] = frozenset(batch)
            elif kind is cst.Assign and len(node.targets) == 1:
                bind_batch(batch, node.targets[0].target, node.value)
            elif kind is cst.For and root(iterated(node.iter)) in batch:
                batch.update(target_names(node.target))
            elif kind in _COMPREHENSIONS:
                bind_comprehension(batch, node)
            elif kind is cst.Call and self.is_move(node, batch):
                moved = True
            return True

        walk(loop.body, enter)
        return moved

    def _feeds_steps(self, call: cst.Call, scope, statement) -> bool:
        """``it = iter(loader)`` whose ``next(it)`` is read in a training loop of the same
        function (a one-off ``next(iter(loader))`` or a peek at one batch is not)."""
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        small = statement.body[0]
        if not isinstance(small, cst.Assign) or small.value is not call or len(small.targets) != 1:
            return False
        iterator = dotted(small.targets[0].target)
        if (iterator, scope) not in self._next_in_steps:
            return False
        if (scope, iterator) not in self._drawn_on_host:
            self._drawn_on_host[scope, iterator] = self._host_uses.after_next(scope, iterator)
        used = self._drawn_on_host[scope, iterator]
        if used is not None:
            self.plan.left[call] = (used, dotted(call.args[0].value))
        return used is None

    # Where a loader flows ------------------------------------------------------------------

    def _uses(self, binding) -> list[Use]:
        facts = self.facts
        uses = []
        for loop in self._reading.get((binding.scope, binding.name), ()):
            if self._owner(binding, facts.order[loop]):
                uses.append(Use(facts.order[loop], self.fed(loop, binding.scope)))
        if binding.scope is None:  # functions that read the module's loader
            for scope in self._readers.get(binding.name, ()):
                if not facts.values(scope).binds(binding.name):
                    uses += [Use(None, self.fed(loop, scope)) for loop in self._reading[scope, binding.name]]
        for call, statement in self._iterated.get((binding.scope, binding.name), ()):
            order = facts.order[statement]
            if self._owner(binding, order):
                uses.append(Use(order, self._feeds_steps(call, binding.scope, statement)))
        for function, param, call in self._passing.get((binding.scope, binding.name), ()):
            order = self._call_order(binding.scope, call)
            if self._owner(binding, order):
                uses += [Use(order, self.fed(loop, where)) for loop, where in self._reached(function, param)]
        return uses

    def _reached(self, function, param: str, seen: frozenset = frozenset()) -> list[tuple[cst.For, object]]:
        """The loader loops that read what ``function`` is given as ``param``: its own, and
        those of the functions it passes it on to."""
        if (function, param) in seen:
            return []
        found = [(loop, function) for loop in self._reading.get((function, param), ())
                 if self._loader_loop(loop, function) is not None]
        for callee, callee_param, _ in self._passing.get((function, param), ()):
            found += self._reached(callee, callee_param, seen | {(function, param)})
        return found

    def _sources(self, function, param: str, seen: frozenset = frozenset()) -> set:
        """Where what ``function`` is given as ``param`` comes from: its callers' loader
        assignments, and ``_UNKNOWN`` for anything else (a call from another file, an
        expression, a default)."""
        if (function, param) in seen:
            return set()
        calls = self.facts.passed(function)
        if not calls:
            return {_UNKNOWN}
        found = set()
        for caller, call, arguments in calls:
            name = dotted(arguments[param]) if param in arguments else None
            if name in self.facts.device_loaders:
                found.add(_DEVICE_LOADER)
                continue
            binding = self._binding_at(caller, name, self._call_order(caller, call)) if name else None
            if binding is not None:
                found.add(binding)
            elif name is not None and caller is not None and name in self.facts.file_values.functions[caller].params:
                found |= self._sources(caller, name, seen | {(function, param)})
            else:
                found.add(_UNKNOWN)
        return found

    def _binding_at(self, scope, name: str, order: int):
        """The loader assignment that ``name`` read at statement ``order`` of ``scope`` holds:
        the scope's own, or the module's where a function reads it as a global."""
        found = self._latest(scope, name, order)
        if found is not None:
            return found
        if scope is not None and not self.facts.values(scope).binds(name):
            return next(iter(self._assigned.get((None, name), ())), None)
        return None

    def _call_order(self, scope, call: cst.Call) -> int:
        return self.facts.order.get(self.facts.values(scope).statement_of(call), 0)

    def _owner(self, binding, order: int) -> bool:
        """Whether ``binding`` is the assignment of its name that a statement at ``order`` of its
        scope reads (the latest before it)."""
        return self._latest(binding.scope, binding.name, order) is binding

    def _latest(self, scope, name: str, order: int):
        """The last loader assignment of ``name`` in ``scope`` before statement ``order`` (the
        first of those at that statement), or None."""
        orders = self._assigned_orders.get((scope, name))
        below = bisect_left(orders, order) if orders else 0
        if not below:
            return None
        return self._assigned[scope, name][bisect_left(orders, orders[below - 1])]

    def _anchor(self, binding, uses: list[Use]) -> tuple[cst.CSTNode, str | None] | None:
        """Where the binding is rebound, and the device variable it names: after the device when
        that is chosen later in the same block, else right after the loader where a device is
        bound there; None where no device variable is, or no point comes before every use it
        must feed and after every use that keeps the loader."""
        facts = self.facts
        device = next((d for d in facts.devices if d.scope is binding.scope and d.order > binding.order), None)
        candidates = []
        if device is not None and self._follows(binding.statement, device.statement):
            candidates.append((device.statement, device.order, device.name))
        bound = facts.device_at(binding.scope, binding.statement)
        if bound is not None:
            candidates.append((binding.statement, binding.order, bound))
        for statement, order, name in candidates:
            if all(_fits(use, order, statement is binding.statement) for use in uses):
                return statement, name
        return None

    def _settle(self, anchors: dict) -> set[tuple]:
        """The (function, parameter) pairs whose fed loops read only rebound loaders, from every
        call; where anything else may come in, the loop is wrapped itself, and the loaders that
        reach it are not rebound after all (they would be wrapped twice)."""
        fed_params = set()
        for function, info in self.facts.file_values.functions.items():
            for loop in self._loops_in.get(function, ()):
                param = self._source(loop, function)
                if param in info.params and self._loader_loop(loop, function) is not None and self.fed(loop, function):
                    fed_params.add((function, param))
        sources = {key: self._sources(*key) for key in fed_params}
        while True:
            served = {key for key, found in sources.items() if found and found <= set(anchors) | {_DEVICE_LOADER}}
            dropped = set().union(*(found for key, found in sources.items() if key not in served)) & set(anchors)
            if not dropped:
                return served
            for binding in dropped:
                del anchors[binding]

    def _rebound(self, loop: cst.For, scope, anchors: dict, served: set) -> bool:
        """Whether a fed loop reads a rebound loader: its own scope's, the module's, or the
        callers' (a parameter every call feeds one)."""
        name = self._source(loop, scope)
        if (scope, name) in served:
            return True
        return self._rebound_name(name, scope, loop, anchors)

    def _rebound_name(self, name: str, scope, statement, anchors: dict) -> bool:
        return self._binding_at(scope, name, self.facts.order[statement]) in anchors

    def _device(self, scope, statement) -> str | None:
        return self.facts.device_at(scope, statement)

    def _follows(self, first: cst.CSTNode, later: cst.CSTNode) -> bool:
        """Whether ``later`` comes after ``first`` in the same block: a rebind placed after it
        runs on every path that the loader takes from ``first`` (not one in a branch, a ``try``
        body or a loop that a path may skip)."""
        following = self.facts.next_statement.get(first)
        while following is not None and following is not later:
            following = self.facts.next_statement.get(following)
        return following is later


def _hands_a_model(body: cst.CSTNode, values) -> bool:
    """Whether ``body`` passes a model to a call (``calc_loss_batch(x, y, model, device)``),
    which runs it on what else it is given."""
    return any(values.kind(arg.value) is Kind.MODEL for call in calls_in(body) for arg in call.args)


def _names(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The names and attribute chains an expression or block reads (``model``, ``self.model``)."""
    found = []

    def enter(child):
        if isinstance(child, (cst.Name, cst.Attribute)) and dotted(child) is not None:
            found.append(child)
            return False
        return True

    walk(node, enter)
    return found


def _fits(use: Use, order: int, at_binding: bool) -> bool:
    """Whether a rebind at statement ``order`` serves ``use``: a use it must feed comes after
    it, one that keeps the loader before it; a use in another function, whose time the file
    does not show, is fed only by a rebind right where the loader is made."""
    if use.order is None:
        return use.fed and at_binding
    return use.order > order if use.fed else use.order < order


def batch_names(loop: cst.For) -> set[str]:
    """The names a loop's target binds: its batch (and counter)."""
    return target_names(loop.target)


def bind_comprehension(batch: set[str], node: cst.BaseComp) -> None:
    """Add the names that a comprehension over the batch binds (``{k: v.to(device) for k, v in
    batch.items()}``), before its element, which comes first, is walked."""
    for_in = node.for_in
    while for_in is not None:
        if root(iterated(for_in.iter)) in batch:
            batch.update(target_names(for_in.target))
        for_in = for_in.inner_for_in


def bind_batch(batch: set[str], target: cst.BaseExpression, value: cst.BaseExpression) -> None:
    """Update the names that hold batch values after ``target = value``: a value read from the
    batch (``images = data[0]``) holds one, anything else (``x = model(x)``, ``z =
    torch.randn(n)``) does not."""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and \
            len(target.elements) == len(value.elements):
        for part, part_value in zip(target.elements, value.elements):
            bind_batch(batch, part.value, part_value.value)
        return
    names = target_names(target)
    if _from_batch(value, batch):
        batch.update(names)
    else:
        batch.difference_update(names)


def _from_batch(value: cst.BaseExpression, batch: set[str]) -> bool:
    """Whether ``value`` is read from the batch: ``data[0]``, ``x.float()``, ``{k: v.to(device)
    for k, v in batch.items()}``, ``tuple(t for t in batch)``, ``(x, y)``."""
    if isinstance(value, cst.Call) and dotted(value.func) in ("tuple", "list", "dict") and len(value.args) == 1:
        value = value.args[0].value
    if isinstance(value, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
        return root(iterated(value.for_in.iter)) in batch
    if isinstance(value, (cst.Tuple, cst.List)) and value.elements:
        return all(_from_batch(element.value, batch) for element in value.elements)
    return root(value) in batch
