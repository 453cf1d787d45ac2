"""The kind of each expression of a scope, where it is: literals, names, calls of torch, of
Python and of the file's own functions, methods, containers."""

from __future__ import annotations

import libcst as cst

from accrewrite.nodes import dotted
from accrewrite.values.flow import wraps_iterable
from accrewrite.values.kinds import (
    BUILTIN_KINDS, FACTORIES, HOST, HOST_MODULES, HOST_TORCH, HOST_TORCH_FUNCTIONS, ITERATE_THROUGH, META_ATTRS,
    META_METHODS, MODEL_ATTRIBUTES, MODEL_METHODS, MODEL_TENSORS, NUMBERS, PASS_THROUGH, STRING_METHODS, SYNC_BUILTINS,
    SYNC_METHODS, TENSORS, Kind, join,
)


class ExpressionKinds:
    """``ScopeValues``' answer to what an expression holds where it is, in the environment the
    flow (``ScopeFlow``) left at its statement; and the questions rules ask of that kind."""

    def kind(self, node: cst.CSTNode) -> Kind:
        """What ``node`` evaluates to, where it is in the scope. (Asked while the scope is still
        being walked, by a function it calls: what the walk has seen so far.)"""
        found = self._memo.get(node)
        if found is None:
            walking = self._env
            self._env = self._before.get(id(self._statement_of.get(id(node), node)), walking)
            comprehension = self._comprehension_of.get(node)
            try:
                # (a node of a comprehension sees the comprehension's names: ``v`` of ``[v.cpu() for v in out]``)
                found = self._eval(node) if comprehension is None else self._comprehension(comprehension.for_in, node)
            finally:
                self._env = walking
            if self._final:
                self._memo[node] = found
        return found

    def _eval(self, node: cst.CSTNode) -> Kind:
        """``node``'s kind in the environment being evaluated (``self._env``)."""
        if self._final:
            found = self._memo.get(node)
            if found is None:
                found = self._memo[node] = self._kind(node)
            return found
        return self._kind(node)

    def _kind(self, node: cst.CSTNode) -> Kind:
        node_type = type(node)  # libcst's node types are concrete: ``is``, not isinstance against its ABCs
        if node_type is cst.Integer:
            return Kind.INT
        if node_type is cst.Float:
            return Kind.FLOAT
        if node_type is cst.Imaginary:
            return Kind.PYTHON
        if node_type in (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString):
            return Kind.STR
        if node_type is cst.Name:
            if node.value in ("True", "False"):
                return Kind.BOOL
            if node.value == "None":
                return Kind.NONE
            return self._dotted_kind(node)
        if node_type is cst.Attribute:
            return self._attribute_kind(node)
        if node_type is cst.Subscript:
            return self._subscript_kind(node)
        if node_type is cst.Call:
            return self._call_kind(node)
        if node_type is cst.BinaryOperation:
            return self._binary_kind(node)
        if node_type is cst.UnaryOperation:
            if isinstance(node.operator, cst.Not):
                return Kind.BOOL
            return self._eval(node.expression)
        if node_type is cst.Comparison:
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in node.comparisons):
                return Kind.BOOL
            sides = [self._eval(node.left), *(self._eval(c.comparator) for c in node.comparisons)]
            if any(side in TENSORS for side in sides):
                return Kind.MASK
            if Kind.CPU in sides and all(side in NUMBERS or side is Kind.CPU for side in sides):
                return Kind.CPU
            return Kind.BOOL if all(side in HOST for side in sides) else Kind.UNKNOWN
        if node_type is cst.BooleanOperation:
            sides = {self._eval(node.left), self._eval(node.right)}
            if sides & TENSORS:
                return Kind.TENSOR
            return join(sides) if sides <= HOST else Kind.UNKNOWN
        if node_type is cst.IfExp:
            return join([self._eval(node.body), self._eval(node.orelse)])
        if node_type in (cst.List, cst.Tuple, cst.Set):
            return self._container_kind(self._eval(e.value) for e in node.elements)
        if node_type is cst.Dict:
            return self._container_kind(self._eval(e.value) for e in node.elements if isinstance(e, cst.DictElement))
        if node_type in (cst.ListComp, cst.SetComp, cst.GeneratorExp):
            return self._container_kind([self._comprehension(node.for_in, node.elt)])
        if node_type is cst.DictComp:
            return self._container_kind([self._comprehension(node.for_in, node.value)])
        if node_type is cst.NamedExpr:
            return self._eval(node.value)
        if node_type is cst.StarredElement:
            return self._eval(node.value)
        if node_type is cst.Lambda:
            return Kind.PYTHON
        return Kind.UNKNOWN

    @staticmethod
    def _container_kind(kinds) -> Kind:
        found = set(kinds)
        if found & TENSORS:
            return Kind.HOLDER
        if Kind.CPU in found and found <= HOST | {Kind.CPU}:
            return Kind.CPU
        if found <= HOST:
            return Kind.PYTHON
        if found <= {Kind.MODEL}:
            return Kind.MODEL
        return Kind.UNKNOWN

    def _comprehension(self, for_in: cst.CompFor, element: cst.BaseExpression) -> Kind:
        """The kind of a comprehension's element, its loop names bound as the loop binds them."""
        return self.of_comprehension(self, for_in).kind(element)

    def _dotted_kind(self, node: cst.CSTNode) -> Kind:
        name = dotted(node)
        kind = self.name_kind(name)
        if kind is not Kind.UNKNOWN:
            return kind
        if isinstance(node, cst.Name):
            if self.facts.qualname(node) is not None and node.value in self.facts.imports:
                return Kind.UNKNOWN  # an imported module or object
            if node.value in self.facts.models:
                return Kind.MODEL
            if node.value in self.facts.loaders or "loader" in node.value.lower():
                return Kind.LOADER
        return Kind.UNKNOWN

    def _attribute_kind(self, node: cst.Attribute) -> Kind:
        name = dotted(node)
        if name is not None:
            known = self.name_kind(name)
            if known is not Kind.UNKNOWN:
                return known
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                owner = self.file.owner_of(self.scope)
                attribute = self.file.attribute_kind(owner, node.attr.value) if owner is not None else Kind.UNKNOWN
                if attribute is not Kind.UNKNOWN:
                    return attribute
            option = self.file.options.kind(node)
            if option is not None:
                return option
            qualified = self.facts.qualname(node)
            if qualified is not None:
                return Kind.PYTHON if qualified.startswith("torch.") else Kind.UNKNOWN  # torch.float16
            if name in self.facts.models:
                return Kind.MODEL
            if name in self.facts.loaders or "loader" in node.attr.value.lower():
                return Kind.LOADER
        base = self._eval(node.value)
        attr = node.attr.value
        if base in TENSORS or base is Kind.CPU:
            return META_ATTRS.get(attr, base if base is Kind.CPU else Kind.TENSOR)
        if base is Kind.MODEL and attr in MODEL_ATTRIBUTES:
            return MODEL_ATTRIBUTES[attr]
        if base in HOST:
            return Kind.PYTHON
        return Kind.UNKNOWN

    def _subscript_kind(self, node: cst.Subscript) -> Kind:
        base = self._eval(node.value)
        if base in TENSORS:
            return Kind.TENSOR
        if base is Kind.CPU:
            return Kind.CPU
        if base is Kind.STR:
            return Kind.STR
        if base in HOST:
            if dotted(node.value) in ("os.environ",):
                return Kind.STR
            return Kind.PYTHON
        if dotted(node.value) == "os.environ" or self.facts.qualname(node.value) == "os.environ":
            return Kind.STR
        if base is Kind.MODEL:
            return Kind.MODEL  # nn.Sequential / ModuleList
        return Kind.UNKNOWN

    def _binary_kind(self, node: cst.BinaryOperation) -> Kind:
        left, right = self._eval(node.left), self._eval(node.right)
        if left is Kind.STR and isinstance(node.operator, cst.Modulo):
            return Kind.STR  # "%f" % loss is a string whatever it formats
        if left in TENSORS or right in TENSORS:
            if isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)) and Kind.MASK in (left, right):
                return Kind.MASK
            return Kind.TENSOR
        if Kind.CPU in (left, right) and {left, right} <= {Kind.CPU, *NUMBERS}:
            return Kind.CPU
        if left in NUMBERS and right in NUMBERS:
            return Kind.FLOAT if isinstance(node.operator, cst.Divide) else join([left, right])
        if left in HOST and right in HOST:
            return join([left, right]) if left is right else Kind.PYTHON
        return Kind.UNKNOWN

    def _call_kind(self, node: cst.Call) -> Kind:
        func = node.func
        facts = self.facts
        if wraps_iterable(node):
            return self._eval(node.args[0].value)  # tqdm(loader) is still the loader
        callee = facts.qualname(func)
        if isinstance(func, cst.Attribute) and callee is None:
            return self._method_kind(node, func)
        if callee is not None:
            return self._library_kind(node, callee)
        if isinstance(func, cst.Name):
            name = func.value
            if not self._bound_here_or_around(name) and name not in self.file.defined:
                builtin = self._builtin_kind(node, name)
                if builtin is not None:
                    return builtin
            defined = self.file.defined.get(name)
            if defined is not None and self.name_kind(name) is Kind.UNKNOWN:
                return self.file.call_kind(defined, node, self)
            called = self._eval(func)
            if called is Kind.MODEL:
                return Kind.TENSOR
            if called is Kind.LOADER:
                return Kind.LOADER
        return self._unknown_call(node)

    def _unknown_call(self, node: cst.Call) -> Kind:
        """A call of something this analysis cannot see into: a function given a tensor gives one
        (a loss, a metric); a class (``ModelEMA(model)``, ``DistAdam(params)``) builds an object."""
        last = (dotted(node.func) or "").split(".")[-1]
        if last[:1].isupper():
            return Kind.UNKNOWN
        return Kind.TENSOR if self._any_tensor_argument(node) else Kind.UNKNOWN

    def _bound_here_or_around(self, name: str) -> bool:
        values = self
        while values is not None:
            if name in values._local:
                return True
            values = values._parent
        return False

    def _builtin_kind(self, node: cst.Call, name: str) -> Kind | None:
        args = [arg.value for arg in node.args]
        if name in SYNC_BUILTINS:
            if name == "round" and len(args) == 1:
                return Kind.INT
            return SYNC_BUILTINS[name]
        if name in BUILTIN_KINDS:
            return BUILTIN_KINDS[name]
        if name in ("max", "min", "sum", "pow", "divmod"):
            kinds = [self._element_of(args[0])] if len(args) == 1 else [self._eval(a) for a in args]
            if any(kind in TENSORS for kind in kinds):
                return Kind.TENSOR
            return join(kinds) if kinds and all(kind in NUMBERS for kind in kinds) else Kind.UNKNOWN
        if name == "next" and args:
            return self._element_of(args[0])
        if name in ("enumerate", "zip", "map", "filter"):
            kinds = {self._eval(a) for a in args}
            return Kind.LOADER if Kind.LOADER in kinds else Kind.TENSOR if kinds & TENSORS else Kind.PYTHON
        if name in PASS_THROUGH:
            if not args:
                return Kind.PYTHON
            inner = self._eval(args[0])
            return Kind.LOADER if inner is Kind.LOADER and name == "iter" else inner
        if name in ("getattr", "super", "object"):
            return Kind.UNKNOWN
        return None

    def _library_kind(self, node: cst.Call, callee: str) -> Kind:
        if callee in HOST_TORCH_FUNCTIONS:
            return HOST_TORCH_FUNCTIONS[callee]
        if callee.startswith("torch.nn.") and not callee.startswith(("torch.nn.functional.", "torch.nn.init.")):
            # nn.Linear(...), nn.SyncBatchNorm.convert_sync_batchnorm(model), DDP(model): modules
            parts = callee.split(".")
            if callee.startswith("torch.nn.parallel.") or any(part[:1].isupper() for part in parts[2:]):
                return Kind.MODEL
            return Kind.UNKNOWN
        if callee.startswith("torch."):
            if callee.startswith(HOST_TORCH) and not callee.startswith("torch.distributed.nn."):
                return Kind.PYTHON  # (torch.distributed.nn's collectives are differentiable: tensors)
            return self._torch_function_kind(node, callee)
        if callee in ("os.environ.get", "os.getenv"):
            return Kind.STR
        if callee.startswith(("math.floor", "math.ceil", "math.isqrt", "math.prod")):
            return Kind.INT
        if callee.startswith(("math.", "time.")):
            return Kind.FLOAT
        if callee.startswith(HOST_MODULES):
            return Kind.PYTHON
        if callee.split(".")[-1] == "DataLoader":
            return Kind.LOADER
        return self._unknown_call(node)

    def _torch_function_kind(self, node: cst.Call, callee: str) -> Kind:
        """A torch function's tensor: on the host where it makes one without a device, or
        computes from host tensors only (``torch.zeros(n)``, ``torch.stack([...from_numpy...])``)."""
        if any(arg.keyword is not None and arg.keyword.value == "device" for arg in node.args):
            return Kind.TENSOR
        kinds = set()
        for arg in node.args:
            value = arg.value
            elements = value.elements if isinstance(value, (cst.List, cst.Tuple)) else [value]
            for element in elements:
                kinds.add(self._eval(element.value if isinstance(element, cst.BaseElement) else element))
        if kinds & TENSORS:
            return Kind.TENSOR
        if Kind.CPU in kinds or callee.rpartition(".")[2] in FACTORIES:
            return Kind.CPU
        return Kind.TENSOR

    def _method_kind(self, node: cst.Call, func: cst.Attribute) -> Kind:
        method = func.attr.value
        if method in STRING_METHODS:
            return Kind.STR  # "...".format(loss) is a string whatever it formats
        receiver = self._eval(func.value)
        if receiver is Kind.UNKNOWN:
            # Methods that hardly anything but tensors and modules have.
            if method in META_METHODS or method == "item":
                return META_METHODS.get(method, Kind.FLOAT)
            if method in MODEL_TENSORS:
                return Kind.TENSOR
        if receiver is Kind.CPU:
            if method in ("to", "cuda") and not self._casts_only(node):
                return Kind.TENSOR  # moved to the device
            if method in SYNC_METHODS or method in META_METHODS:
                return META_METHODS.get(method) or (SYNC_METHODS[method] if method != "cpu" else Kind.CPU)
            return Kind.CPU
        if receiver in TENSORS:
            if method in SYNC_METHODS:
                return SYNC_METHODS[method]
            if method in META_METHODS:
                return META_METHODS[method]
            if method == "bool":
                return Kind.MASK
            if method == "backward":
                return Kind.NONE
            return Kind.TENSOR
        if receiver is Kind.MODEL:
            return MODEL_METHODS.get(method) or self._own_method_kind(node, func)
        if receiver is Kind.LOADER:
            return Kind.LOADER if method in ("__iter__",) else Kind.UNKNOWN
        if receiver is Kind.STR:
            return Kind.PYTHON if method in ("split", "rsplit", "splitlines", "partition", "encode") else (
                Kind.BOOL if method.startswith(("is", "startswith", "endswith")) else Kind.STR
            )
        if receiver in HOST:
            if method in ("item",):
                return Kind.PYTHON
            if method in ("get", "pop", "values", "items", "keys", "copy", "index", "count"):
                return Kind.PYTHON
            return Kind.PYTHON if not self._any_tensor_argument(node) else Kind.UNKNOWN
        return self._own_method_kind(node, func)

    def _own_method_kind(self, node: cst.Call, func: cst.Attribute) -> Kind:
        """``self.method(...)`` of a class of this file gives what that method returns."""
        if isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
            owner = self.file.owner_of(self.scope)
            defined = self.file.method(owner, func.attr.value) if owner is not None else None
            if defined is not None:
                return self.file.call_kind(defined, node, self)
        return self._unknown_call(node)

    def _casts_only(self, call: cst.Call) -> bool:
        """``x.to(torch.float16)``: a dtype, no device."""
        return bool(call.args) and all(
            (self.facts.qualname(arg.value) or "").startswith("torch.") and arg.keyword in (None,) or
            arg.keyword is not None and arg.keyword.value in ("dtype", "non_blocking", "copy", "memory_format")
            for arg in call.args
        ) and not any(arg.keyword is not None and arg.keyword.value == "device" for arg in call.args)

    def _any_tensor_argument(self, node: cst.Call) -> bool:
        return any(self._eval(arg.value) in TENSORS for arg in node.args)

    def _entered(self, node: cst.BaseExpression) -> Kind:
        """What ``with node as x`` binds: the value of most context managers holds what the
        expression holds (``open`` gives a file, ``autocast`` nothing of interest)."""
        kind = self._eval(node)
        return kind if kind in TENSORS else Kind.UNKNOWN

    def _element_of(self, node: cst.BaseExpression) -> Kind:
        """The kind of what iterating over ``node`` gives."""
        if isinstance(node, (cst.GeneratorExp, cst.ListComp, cst.SetComp)):
            return self._comprehension(node.for_in, node.elt)
        if isinstance(node, cst.Call):
            callee = dotted(node.func) or ""
            last = callee.split(".")[-1]
            args = [arg.value for arg in node.args if arg.keyword is None]
            if callee == "range" or last == "trange":
                return Kind.INT
            if callee in ("enumerate", "zip") or last.lower() in ITERATE_THROUGH:
                if not args:
                    return Kind.UNKNOWN
                kinds = [self._element_of(arg) for arg in args]
                if callee == "enumerate":
                    kinds = [kinds[0]]
                return Kind.TENSOR if any(k in TENSORS for k in kinds) else join(kinds)
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("items", "values"):
                owner = self._eval(node.func.value)
                return Kind.TENSOR if owner in TENSORS else self._container_kind([owner])
            kind = self._eval(node)
            if kind in (Kind.LOADER, Kind.UNKNOWN) and any(self._eval(a) is Kind.LOADER for a in args):
                return Kind.TENSOR  # metric_logger.log_every(loader, ...) yields the loader's batches
        kind = self._eval(node)
        if kind is Kind.LOADER or kind in TENSORS:
            return Kind.TENSOR
        if kind is Kind.CPU:
            return Kind.CPU
        if kind is Kind.MODEL:
            return Kind.MODEL
        if kind in HOST:
            return Kind.PYTHON if kind is not Kind.STR else Kind.STR
        return Kind.UNKNOWN

    def is_tensor(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is known to hold a tensor (or a batch, a container of tensors)."""
        return self.kind(node) in TENSORS

    def tested_as_tensor(self, node: cst.CSTNode) -> bool:
        """Whether ``node``'s truth value is a tensor's (read on the host): not a container of
        tensors, whose truth value is its length."""
        kind = self.kind(node)
        return kind in TENSORS and kind is not Kind.HOLDER

    def is_mask(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is known to be a boolean tensor."""
        return self.kind(node) is Kind.MASK

    def is_host(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is known to be a Python value (no tensor inside)."""
        return self.kind(node) in HOST

    def is_int(self, node: cst.CSTNode) -> bool:
        return self.kind(node) is Kind.INT

    def is_model(self, node: cst.CSTNode) -> bool:
        return self.kind(node) is Kind.MODEL

    def holds_tensor(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is a tensor or a display (list, tuple, dict) with one inside."""
        if self.is_tensor(node):
            return True
        if isinstance(node, cst.Dict):
            return any(self.holds_tensor(e.value) for e in node.elements if isinstance(e, cst.DictElement))
        if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
            return any(self.holds_tensor(e.value) for e in node.elements)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "dict":
            return any(self.holds_tensor(arg.value) for arg in node.args)  # dict(loss=loss)
        return False

