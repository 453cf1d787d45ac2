"""Running sums of a step's loss that can stay on the device (ACC033), and the names that then
hold tensors, which ACC009 reads in its step closures.

Two shapes, each in a training loop's own lines, of a host read (``x.item()``, ``float(x)``,
times or over a host number) of a tensor that holds one value (a loss, a ``.mean()``):

- ``total += loss.item()``, where ``total`` is otherwise only set to a number (``total = 0``)
  and read formatted (``'{:5.2f}'.format(t)``, an f-string, ``'%.2f' % t``), by ``math``,
  ``float`` or ``int``, or in arithmetic bound to a name read the same way
  (``cur = total / n``);
- ``meter.update(loss.item(), n)``, where ``meter`` is an instance of a class of the file whose
  ``update`` the script already gives a device tensor (imagenet's ``top1.update(acc1[0], n)``),
  and ``meter`` is read only as the receiver of ``update`` or beside such an instance in a list
  (``ProgressMeter(..., [losses, top1])``).

A value printed whole (``print(total)``, ``'%s' % total``) would print as a tensor, and one
returned, compared or passed on could reach code that wants a number: those keep the read.

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accrewrite.nodes import walk
from accrewrite.rule import RuleContext
from accrewrite.rules._losses import is_loss_call
from accrewrite.rules._training_code import host_read
from accrewrite.values import target_names

RUNNING_SUMS_RULE = "ACC033"
# Reductions of a whole tensor: each gives one value.
_REDUCTIONS = frozenset({"mean", "sum", "norm", "std", "var", "prod"})
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power)
_NUMBER_CALLS = frozenset({"float", "int"})
# How deep names computed from a sum are followed (``cur = total / n``, then ``ppl = ...``).
_DEPTH = 3


@dataclass(frozen=True)
class RunningSums:
    """``reads``: the host reads that stay tensors, by their statement line. ``names``: per
    training loop, the names that then hold a tensor (the sums and what is computed of them)."""

    reads: dict[cst.CSTNode, cst.Call] = field(default_factory=dict)
    names: dict[cst.CSTNode, frozenset[str]] = field(default_factory=dict)


def running_sums(ctx: RuleContext) -> RunningSums:
    """The file's ``RunningSums``, worked out once; empty where ACC033 does not run on the file."""
    if "running_sums" not in ctx.shared:
        text = ctx.source_text
        found = RunningSums()
        if RUNNING_SUMS_RULE in ctx.running and (".item()" in text or "float(" in text):
            found = _Search(ctx).run()
        ctx.shared["running_sums"] = found
    return ctx.shared["running_sums"]


class _Search:
    def __init__(self, ctx: RuleContext):
        self.ctx = ctx
        self.facts = ctx.facts
        self.found = RunningSums()
        self._fed: set[str] | None = None
        self._updates: dict | None = None

    def run(self) -> RunningSums:
        for loop in self.facts.loops:
            values = self.facts.values(loop.scope)
            lines = {line.body[0]: line for line in _own_lines(loop.node)}
            names: set[str] = set()
            for line in lines.values():
                read = self._sum(line, values, lines, names) or self._meter_update(line, values)
                if read is not None and not self.ctx.suppressed(RUNNING_SUMS_RULE, line):
                    self.found.reads[line] = read
            if names:
                self.found.names[loop.node] = frozenset(names)
        return self.found

    # ``total += loss.item()`` ----------------------------------------------------------------

    def _sum(self, line, values, lines, names: set[str]) -> cst.Call | None:
        statement = line.body[0]
        if not self._is_sum(line, values):
            return None
        name = statement.target.value
        derived = self._read_as_numbers(name, line, values, lines, _DEPTH)
        if derived is None:
            return None
        names.update({name, *derived})
        return self._kept_read(statement.value, values)

    def _read_as_numbers(self, name: str, binding, values, lines, depth: int) -> set[str] | None:
        """The names computed from ``name`` where every read of the value ``binding`` gives it
        takes a tensor as it took a number; None where one does not. ``binding`` is a running
        sum of ``name`` or, for a name computed from one, its assignment."""
        reads = values.reads_reached(name, binding)
        if not reads or depth == 0:
            return None
        derived: set[str] = set()
        for read in reads:
            statement = values.statement_of(read)
            line = lines.get(statement)
            if not self._bound_as(name, statement, binding, values):
                return None
            if line is None:  # after the loop: read once, and only as a number
                if _use(statement, read) != "number":
                    return None
                continue
            if self._is_sum(line, values):
                continue
            use = _use(statement, read)
            if use == "number" and self._is_sum(binding, values) and self._added_to_next(name, line, lines, values):
                return None  # a step closure given the sum would read it after this step's addition
            if use == "assigned":
                target = statement.targets[0].target.value
                more = self._read_as_numbers(target, line, values, lines, depth - 1)
                if more is None:
                    return None
                derived.update({target, *more})
            elif use != "number":
                return None
        return derived

    def _added_to_next(self, name: str, line, lines, values) -> bool:
        """Whether the next line after ``line`` in the loop that binds ``name`` adds to it in place,
        rather than binding it anew (``total = 0``)."""
        order = list(lines.values())
        for later in order[order.index(line) + 1:]:
            if self._is_sum(later, values) and later.body[0].target.value == name:
                return True
            if name in _bound_by(later):
                return False
        return False

    def _bound_as(self, name: str, statement, binding, values) -> bool:
        """Whether every value ``name`` may hold at ``statement`` comes from ``binding``, or, for a
        running sum, from another running sum of it or a number literal (``total = 0``)."""
        bindings = values.bindings_at(name, statement)
        if not bindings:
            return False
        if not self._is_sum(binding, values):
            return bindings == {binding}
        return all(self._is_sum(other, values) and other.body[0].target.value == name
                   or type(_assigned(other)) in (cst.Integer, cst.Float) for other in bindings)

    def _is_sum(self, line, values) -> bool:
        """``name += x.item()`` (the read as ``_kept_read`` takes it)."""
        statement = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        return (type(statement) is cst.AugAssign and type(statement.operator) is cst.AddAssign
                and type(statement.target) is cst.Name and self._kept_read(statement.value, values) is not None)

    # ``meter.update(loss.item(), n)`` --------------------------------------------------------

    def _meter_update(self, line, values) -> cst.Call | None:
        statement = line.body[0]
        call = statement.value if type(statement) is cst.Expr else None
        if not _is_update(call) or not call.args or call.args[0].keyword is not None:
            return None
        read = self._kept_read(call.args[0].value, values)
        if read is None:
            return None
        meter = call.func.value.value
        bindings = values.bindings_at(meter, statement)
        if not bindings or not all(self._makes_fed_meter(binding) for binding in bindings):
            return None
        for binding in bindings:
            reads = values.reads_reached(meter, binding)
            if reads is None or not all(self._meter_read(values.statement_of(read), read) for read in reads):
                return None
        return read

    def _meter_read(self, statement, read: cst.Name) -> bool:
        """Whether ``read`` of a meter takes a meter holding tensors: its ``update``, an attribute
        read as a number (``f"{losses.avg:.4f}"``), a list beside a meter given tensors."""
        if statement is None:
            return False
        path = _path(statement, read)
        parent = path[-2] if path and len(path) > 1 else None
        if type(parent) is cst.Attribute and parent.attr.value != "update":
            return _use(statement, parent) == "number"
        return self._beside_fed(statement, read)

    def _makes_fed_meter(self, binding) -> bool:
        return _class_made(binding) in self._fed_classes

    @property
    def _fed_classes(self) -> set[str]:
        """The file's classes with an ``update`` method that some call gives a device tensor."""
        if self._fed is None:
            self._fed = set()
            classes = self.facts.file.definitions.classes
            for scope, instances in self._instances().items():
                values = self.facts.values(scope)
                for call, class_name in instances:
                    if class_name in classes and values.is_tensor(call.args[0].value):
                        self._fed.add(class_name)
        return self._fed

    def _instances(self) -> dict:
        """Per scope, the ``x.update(value, ...)`` calls whose ``x`` is assigned ``Class(...)`` there."""
        if self._updates is not None:
            return self._updates
        found = self._updates = {}
        for scope, values in self._scopes():
            def enter(node):
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not scope:
                    return False
                if _is_update(node) and node.args and host_read(node.args[0].value) is None:
                    statement = values.statement_of(node)
                    made = {_class_made(binding) for binding in values.bindings_at(node.func.value.value, statement)} \
                        if statement is not None else set()
                    if len(made) == 1 and None not in made:
                        found.setdefault(scope, []).append((node, made.pop()))
                return True

            walk(scope if scope is not None else self.ctx.module, enter)
        return found

    def _scopes(self):
        for scope in dict.fromkeys(loop.scope for loop in self.facts.loops):
            yield scope, self.facts.values(scope)

    def _beside_fed(self, statement, read: cst.Name) -> bool:
        """Whether ``read`` is the receiver of an ``update`` call, or an element of a list or
        tuple that also holds a meter the script gives device tensors."""
        found = False
        fed = {call.func.value.value for calls in self._instances().values() for call, name in calls
               if name in self._fed_classes}

        def enter(node):
            nonlocal found
            if _is_update(node) and node.func.value is read:
                found = True
            elif isinstance(node, (cst.List, cst.Tuple)) and any(element.value is read for element in node.elements):
                found = any(type(e.value) is cst.Name and e.value.value in fed for e in node.elements)
            return not found

        walk(statement, enter)
        return found

    # The read ---------------------------------------------------------------------------------

    def _kept_read(self, value: cst.BaseExpression, values) -> cst.Call | None:
        """The host read that ``value`` is (or multiplies or divides by a host number), of a
        tensor that holds one value."""
        if type(value) is cst.BinaryOperation and type(value.operator) in (cst.Multiply, cst.Divide):
            sides = (value.left, value.right) if type(value.operator) is cst.Multiply else (value.left,)
            reads = [side for side in sides if host_read(side) is not None]
            others = [side for side in (value.left, value.right) if side not in reads]
            if len(reads) != 1 or any(values.is_tensor(other) or values.reads_value(other) for other in others):
                return None
            value = reads[0]
        read = host_read(value)
        if read is None or read[0] == "tolist" or not self._one_value(read[1], values, 1):
            return None
        return value

    def _one_value(self, tensor: cst.BaseExpression, values, depth: int) -> bool:
        """Whether ``tensor`` is known to hold a single value in a 0-d tensor (a read of it
        formatted as a number would fail on a tensor of shape [1])."""
        if not values.is_tensor(tensor):
            return False
        if type(tensor) is cst.Call:
            func = tensor.func
            if type(func) is cst.Attribute and func.attr.value in _REDUCTIONS and not tensor.args:
                return True
            return is_loss_call(self.facts, tensor)
        if type(tensor) is cst.BinaryOperation:
            return any(self._one_value(side, values, depth) for side in (tensor.left, tensor.right)) and not any(
                values.is_tensor(side) and not self._one_value(side, values, depth) for side in (tensor.left, tensor.right))
        if type(tensor) is cst.Name and depth > 0:
            statement = values.statement_of(tensor)
            bindings = values.bindings_at(tensor.value, statement) if statement is not None else ()
            assigned = [_assigned(binding) for binding in bindings]
            return bool(assigned) and all(a is not None and self._one_value(a, values, depth - 1) for a in assigned)
        return False


def _own_lines(loop: cst.CSTNode) -> list[cst.SimpleStatementLine]:
    """The one-statement lines of ``loop``'s body, also under its ``if``/``with``/``try``; not
    those of a nested loop, function or class."""
    found = []

    def enter(node):
        if node is not loop and isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(node, cst.SimpleStatementLine):
            if len(node.body) == 1:
                found.append(node)
            return False
        return True

    walk(loop, enter)
    return found


def _bound_by(line) -> set[str]:
    statement = line.body[0]
    if type(statement) is cst.Assign:
        return {name for target in statement.targets for name in target_names(target.target)}
    if type(statement) in (cst.AugAssign, cst.AnnAssign):
        return target_names(statement.target)
    return set()


def _is_update(node) -> bool:
    return (type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "update"
            and type(node.func.value) is cst.Name)


def _class_made(binding) -> str | None:
    """``C`` where ``binding`` is ``name = C(...)``."""
    value = _assigned(binding)
    return value.func.value if isinstance(value, cst.Call) and type(value.func) is cst.Name else None


def _assigned(binding) -> cst.BaseExpression | None:
    small = binding.body[0] if isinstance(binding, cst.SimpleStatementLine) and len(binding.body) == 1 else None
    if type(small) is cst.Assign and len(small.targets) == 1 and type(small.targets[0].target) is cst.Name:
        return small.value
    return None


def _arithmetic(node: cst.BaseExpression) -> bool:
    return type(node) is cst.BinaryOperation and type(node.operator) in _ARITHMETIC


def _use(statement: cst.CSTNode, read: cst.Name) -> str | None:
    """How ``statement`` uses ``read``, through arithmetic: "number" where it becomes a number or
    text as a tensor would (formatted with a format spec or none, given to ``math``, ``float``
    or ``int``), "assigned" where it is the value of a one-name assignment, else None."""
    path = _path(statement, read)
    if path is None:
        return None
    for parent, child in zip(reversed(path[:-1]), reversed(path[1:])):
        if _arithmetic(parent) or type(parent) is cst.UnaryOperation:
            continue
        if type(parent) is cst.Arg:
            continue
        if type(parent) is cst.BinaryOperation and type(parent.operator) is cst.Modulo and child is parent.right:
            return "number" if _numeric_percent(parent.left) else None
        if type(parent) is cst.FormattedStringExpression:
            return "number" if parent.conversion is None else None
        if type(parent) is cst.Call:
            func = parent.func
            if type(func) is cst.Name and func.value in _NUMBER_CALLS:
                return "number"
            if type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == "math":
                return "number"
            if type(func) is cst.Attribute and func.attr.value == "format" and _plain_braces(func.value):
                return "number"
            return None
        if type(parent) is cst.Assign and child is parent.value:
            one = len(parent.targets) == 1 and type(parent.targets[0].target) is cst.Name
            return "assigned" if one else None
        if isinstance(parent, (cst.Tuple, cst.Element)) and _in_percent(path, parent):
            continue
        return None
    return None


def _path(statement: cst.CSTNode, target: cst.CSTNode) -> list[cst.CSTNode] | None:
    """The nodes from ``statement`` down to ``target``."""
    stack: list[cst.CSTNode] = []
    found: list[cst.CSTNode] | None = None

    def enter(node):
        nonlocal found
        stack.append(node)
        if node is target:
            found = list(stack)
        return found is None

    walk(statement, enter, lambda node: stack.pop())
    return found


def _in_percent(path: list[cst.CSTNode], node: cst.CSTNode) -> bool:
    """Whether ``node`` is (in) the right side of a ``%`` formatting on the path."""
    at = path.index(node)
    return any(type(p) is cst.BinaryOperation and type(p.operator) is cst.Modulo for p in path[:at])


def _numeric_percent(left: cst.BaseExpression) -> bool:
    """A format string literal whose conversions all format numbers (no ``%s``, ``%r``)."""
    if not isinstance(left, (cst.SimpleString, cst.ConcatenatedString)):
        return False
    text = left.evaluated_value
    return isinstance(text, str) and "%s" not in text and "%r" not in text and "%a" not in text


def _plain_braces(receiver: cst.BaseExpression) -> bool:
    """A literal ``str.format`` template without ``!r``/``!s`` conversions."""
    if not isinstance(receiver, (cst.SimpleString, cst.ConcatenatedString)):
        return False
    text = receiver.evaluated_value
    return isinstance(text, str) and "!r" not in text and "!s" not in text and "!a" not in text
