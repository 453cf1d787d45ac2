"""Where a scope reads a tensor's value on the host: ``.item()``, ``float(t)``, a tensor's truth
value, numpy and PIL given a tensor; and where a batch is used on the host before it moves."""

from __future__ import annotations

import libcst as cst

from accrewrite.nodes import descendants, dotted, walk
from accrewrite.values.flow import DEFINED_CODE
from accrewrite.values.kinds import (
    CUDA_TENSOR_TYPE, HOST, HOST_ARRAY_CALLS, META_ATTRS, METRIC_LOADERS, METRIC_READS, NOT_ITS_VALUES, NUMBER_MODULES, SYNC_BUILTINS,
    SYNC_METHODS, TENSORS, WAITS, Kind,
)


class HostReads:
    """``ScopeValues``' questions about reading tensors on the host: where an expression waits
    for the device, and where a name's tensor values are used on the host."""

    def sync(self, node: cst.CSTNode) -> str | None:
        """How ``node`` itself (not its children) reads a tensor's value on the host, else None."""
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in SYNC_METHODS:
                if self.facts.qualname(func) is None and self._reads_receiver(func):
                    return f".{func.attr.value}()"
            if self.facts.qualname(func) in WAITS:
                return "waiting for the device"
            if isinstance(func, cst.Attribute) and func.attr.value == "to" and node.args:
                first = node.args[0].value
                if isinstance(first, cst.Call) and self.facts.qualname(first.func) == "torch.device" and first.args:
                    first = first.args[0].value
                if isinstance(first, cst.SimpleString) and first.evaluated_value == "cpu" and self.is_tensor(func.value):
                    return '.to("cpu")'
            if isinstance(func, cst.Name) and func.value in SYNC_BUILTINS and func.value not in self.facts.imports:
                if any(self.is_tensor(arg.value) for arg in node.args):
                    return f"{func.value}() of a tensor"
            if isinstance(func, cst.Name) and func.value in ("max", "min") and func.value not in self.facts.imports:
                compared = [self._element_of(node.args[0].value)] if len(node.args) == 1 else [
                    self._eval(arg.value) for arg in node.args if arg.keyword is None]
                if any(kind in TENSORS for kind in compared):
                    return f"{func.value}() comparing tensors"
            callee = self.facts.qualname(func) or ""
            if callee.startswith(NUMBER_MODULES) and any(self.is_tensor(arg.value) for arg in node.args):
                return f"{callee}() of a tensor"
            if callee in ("torch.tensor", "torch.as_tensor") and node.args and self._several_tensors(node.args[0].value):
                return f"{callee}() of tensors, each read"
            if (isinstance(func, cst.Attribute) and func.attr.value in METRIC_READS
                    and self.facts.assigned_calls.get(dotted(func.value) or "") in METRIC_LOADERS
                    and any(self.holds_tensor(arg.value) for arg in node.args)):
                return "a metric given tensors"
            if isinstance(func, cst.Attribute) and func.attr.value == "format":
                if any(self.is_tensor(arg.value) for arg in node.args):
                    return "formatting a tensor"
            if isinstance(func, cst.Name) and self.name_kind(func.value) is Kind.UNKNOWN:
                read = self.file.returned_reads(func.value)
                if read and any(self.is_tensor(arg) for param, arg in self.file.arguments(node, func.value).items()
                                if param in read):
                    return f"{func.value}() returns it read on the host"
        if isinstance(node, cst.FormattedStringExpression) and self.is_tensor(node.expression):
            return "formatting a tensor"
        if isinstance(node, cst.IfExp) and self.tested_as_tensor(node.test):
            return "a tensor's truth value"
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            if self.tested_as_tensor(node.expression):
                return "a tensor's truth value"
        if isinstance(node, cst.BooleanOperation) and self.tested_as_tensor(node.left):
            return "a tensor's truth value"
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            if self.kind(node.left) is Kind.STR and self.holds_tensor(node.right):
                return "formatting a tensor"
        return None

    def _several_tensors(self, node: cst.BaseExpression) -> bool:
        """A list of tensors (``torch.tensor(losses)`` reads each), not one tensor (a copy)."""
        if isinstance(node, (cst.List, cst.Tuple)):
            return any(self.holds_tensor(e.value) for e in node.elements)
        return self.kind(node) is Kind.HOLDER

    def _reads_receiver(self, func: cst.Attribute) -> bool:
        """Whether ``x.item()``-like calls read a tensor: ``x`` is one, or (for ``.item()``,
        which hardly anything else has) is not known to be something else."""
        receiver = self.kind(func.value)
        if receiver in TENSORS:
            return True
        return func.attr.value == "item" and receiver is Kind.UNKNOWN

    def reads_value(self, node: cst.CSTNode) -> bool:
        """Whether evaluating ``node`` reads some tensor's value on the host."""
        if type(node) in DEFINED_CODE:
            return False
        return self.sync(node) is not None or any(
            type(child) not in DEFINED_CODE and self.sync(child) is not None
            for child in descendants(node, DEFINED_CODE)
        )

    def tensor_read(self, node: cst.CSTNode, names) -> str | None:
        """The first of ``names`` whose tensor values evaluating ``node`` reads, else None: not
        through what is known of a tensor without them (``x.size(0)``, ``x.shape``, ``len(x)``),
        a number read from it (``x.item()``) or a copy elsewhere (``x.to(device)``, ``x.cpu()``);
        a name that holds a Python value here (a loop counter) reads none."""
        found = None
        labels: set[int] = set()  # the attribute names and keywords met: they name nothing read

        def enter(child):
            nonlocal found
            kind = type(child)
            if found is not None:
                return False
            if kind is cst.Name:
                if id(child) not in labels and child.value in names and self.kind(child) not in HOST:
                    found = child.value
                return False
            if kind is cst.Attribute:
                labels.add(id(child.attr))
                return child.attr.value not in META_ATTRS
            if kind is cst.Arg:
                if child.keyword is not None:
                    labels.add(id(child.keyword))
                return True
            return not (kind is cst.Call and self._not_its_values(child)) and kind not in DEFINED_CODE

        walk(node, enter)
        return found

    def carries(self, node: cst.CSTNode, names) -> bool:
        """Whether ``node`` gives one of ``names``' tensors or one computed from it where it is:
        read from it (``x[i]``, ``x.float()``, ``batch["x"]``), arithmetic with it, a torch
        function of it, a display holding one; not a number or shape read from it, a copy
        elsewhere, nor what another function makes of it (a model's output, a library's result)."""
        kind = type(node)
        if kind is cst.Name:
            return node.value in names and self.kind(node) not in HOST
        if kind is cst.Attribute:
            return node.attr.value not in META_ATTRS and self.carries(node.value, names)
        if kind is cst.Subscript:
            return self.carries(node.value, names)
        if kind is cst.BinaryOperation:
            return self.carries(node.left, names) or self.carries(node.right, names)
        if kind is cst.UnaryOperation:
            return self.carries(node.expression, names)
        if kind is cst.IfExp:
            return self.carries(node.body, names) or self.carries(node.orelse, names)
        if kind in (cst.Tuple, cst.List):
            return any(self.carries(element.value, names) for element in node.elements)
        if kind is cst.Call:
            func = node.func
            if type(func) is cst.Attribute and self.facts.qualname(func) is None:
                return not self._not_its_values(node) and self.carries(func.value, names)
            return (self.facts.qualname(func) or "").startswith("torch.") and any(
                self.carries(arg.value, names) for arg in node.args)
        return False

    def _not_its_values(self, call: cst.Call) -> bool:
        func = call.func
        if type(func) is cst.Name:
            return func.value == "len" and "len" not in self.facts.imports
        if type(func) is cst.Attribute and func.attr.value == "type" and len(call.args) == 1:
            return self._cuda_tensor_type(call.args[0].value)
        return type(func) is cst.Attribute and func.attr.value in NOT_ITS_VALUES and not (
            func.attr.value == "to" and self._casts_only(call))

    def _cuda_tensor_type(self, node: cst.CSTNode) -> bool:
        """``torch.cuda.FloatTensor``, or a name assigned one (``Tensor = torch.cuda.FloatTensor if
        cuda else torch.FloatTensor``): ``x.type(Tensor)`` copies ``x`` onto CUDA, as a move does."""
        if type(node) is cst.Name and node.value not in self.facts.imports:
            return any(self._cuda_tensor_type(value.body if type(value) is cst.IfExp else value)
                       for value in self.facts.assignments.get(node.value, ()))
        return bool(CUDA_TENSOR_TYPE.fullmatch(self.facts.qualname(node) or ""))

    def host_use(self, node: cst.CSTNode, names) -> tuple[str, str] | None:
        """How ``node`` itself (not its children) works on the tensor values of one of ``names``
        where they must be on the host: (the name, what it does), else None. It reads them with
        ``.numpy()`` or passes them to numpy, PIL or OpenCV; it indexes, fills or
        computes with a tensor or numpy array made on the host (``out[rows, labels] = 1``
        after ``out = torch.zeros(n, d)``, ``torch.cat([x, c])``). Indexing such a tensor itself
        (``labels[torch.randperm(n)]``) works where it is."""
        kind = type(node)
        if kind is cst.Call:
            return self._host_call(node, names)
        if kind is cst.Subscript:
            if self._made_on_host(node.value, names):
                name = self._first_read(node.slice, names)
                return (name, "indexes a tensor made on the host with it") if name else None
        elif kind is cst.BinaryOperation:
            return self._computed_with_host(names, node.left, node.right)
        elif kind is cst.Comparison:
            return self._computed_with_host(names, node.left, *(c.comparator for c in node.comparisons))
        elif kind is cst.AugAssign:
            return self._computed_with_host(names, node.target, node.value)
        elif kind is cst.Assign:
            filled = any(type(t.target) is cst.Subscript and self._made_on_host(t.target.value, names)
                         for t in node.targets)
            name = self.tensor_read(node.value, names) if filled else None
            return (name, "puts it into a tensor made on the host") if name else None
        return None

    def _host_call(self, call: cst.Call, names) -> tuple[str, str] | None:
        func = call.func
        arguments = [arg.value for arg in call.args]
        if type(func) is cst.Attribute:
            if func.attr.value == "numpy":
                name = self.tensor_read(func.value, names)
                return (name, "reads it with .numpy()") if name else None
            if self.facts.qualname(func) is None:  # a tensor's method: the tensor is an operand
                return self._computed_with_host(names, func.value, *arguments)
        callee = self.facts.qualname(func) or ""
        if callee.startswith(HOST_ARRAY_CALLS):
            name = self._first_read(arguments, names)
            return (name, f"passes it to {callee}()") if name else None
        if callee.startswith("torch."):
            operands = []  # torch.cat([x, c]): each tensor of a list
            for argument in arguments:
                listed = type(argument) in (cst.List, cst.Tuple)
                operands += [element.value for element in argument.elements] if listed else [argument]
            return self._computed_with_host(names, *operands)
        return None

    def _computed_with_host(self, names, *operands: cst.CSTNode) -> tuple[str, str] | None:
        """(the name, what it does) where one operand reads the values of one of ``names`` and
        another is a tensor made on the host."""
        name = self._first_read(operands, names)
        if name is None or not any(self._made_on_host(operand, names) for operand in operands):
            return None
        return name, "computes with it and a tensor made on the host"

    def _first_read(self, nodes, names) -> str | None:
        return next(filter(None, (self.tensor_read(node, names) for node in nodes)), None)

    def _made_on_host(self, node: cst.CSTNode, names) -> bool:
        """A tensor or numpy array made on the host (``torch.zeros(n, d)``, ``np.zeros((n, d))``),
        not from ``names``' values."""
        made = self.kind(node) is Kind.CPU or (self._made_by(node) or "").startswith("numpy.")
        return made and self.tensor_read(node, names) is None

    def _made_by(self, node: cst.CSTNode) -> str | None:
        """What made ``node``: the callee of a call, or of the call a name is assigned in the file."""
        if type(node) is cst.Call:
            return self.facts.qualname(node.func)
        return self.facts.assigned_calls.get(dotted(node) or "")


