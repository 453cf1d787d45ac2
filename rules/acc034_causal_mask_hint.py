from functools import cached_property

import libcst as cst

from accrewrite.nodes import call_arg, walk
from accrewrite.rule import Example, Rule

_ENCODER = "torch.nn.TransformerEncoder"
_TRANSFORMER = "torch.nn.Transformer"
_GENERATE = "generate_square_subsequent_mask"
_MINUS_INFINITY = frozenset({"float('-inf')", "-float('inf')", "-math.inf", "-torch.inf"})


class CausalMaskHint(Rule):
    """Tell a Transformer encoder that its mask is causal, so that torch does not read it each step.

    `nn.TransformerEncoder` given a `mask` and no `is_causal` compares the mask with a causal
    one on every call (`_detect_is_causal_mask`): a read of the device that, on a lazy device,
    cuts the step's graph in two and waits for the first part. pytorch/examples'
    word_language_model and pytorch/tutorials' Transformer tutorial pass the causal mask they
    built. Where the mask is provably that mask (built by `generate_square_subsequent_mask`,
    `torch.log(torch.tril(torch.ones(n, n)))` or `torch.triu(torch.full((n, n), -inf),
    diagonal=1)`, directly or by a method of the class that returns it) or None, the call
    passes `is_causal=True` (`is_causal=mask is not None` where it may be None): what torch
    would have found, so the model computes the same, without the read.
    """

    code = "ACC034"
    name = "causal-mask-hint"
    summary = "encoder(src, mask=causal_mask) -> encoder(src, mask=causal_mask, is_causal=...)"
    concepts = ("lazy_execution",)
    triggers = frozenset({"mask", "src_mask"})
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch
            from torch import nn

            class TransformerModel(nn.Transformer):
                def __init__(self, ninp, nhead):
                    super().__init__(d_model=ninp, nhead=nhead)
                    self.src_mask = None

                def _generate_square_subsequent_mask(self, sz):
                    return torch.log(torch.tril(torch.ones(sz, sz)))

                def forward(self, src, has_mask=True):
                    if has_mask:
                        if self.src_mask is None or self.src_mask.size(0) != len(src):
                            self.src_mask = self._generate_square_subsequent_mask(len(src)).to(src.device)
                    else:
                        self.src_mask = None
                    return self.encoder(src, mask=self.src_mask)
            """,
            after="""
            import torch
            from torch import nn

            class TransformerModel(nn.Transformer):
                def __init__(self, ninp, nhead):
                    super().__init__(d_model=ninp, nhead=nhead)
                    self.src_mask = None

                def _generate_square_subsequent_mask(self, sz):
                    return torch.log(torch.tril(torch.ones(sz, sz)))

                def forward(self, src, has_mask=True):
                    if has_mask:
                        if self.src_mask is None or self.src_mask.size(0) != len(src):
                            self.src_mask = self._generate_square_subsequent_mask(len(src)).to(src.device)
                    else:
                        self.src_mask = None
                    return self.encoder(src, mask=self.src_mask, is_causal=self.src_mask is not None)
            """,
        ),
    )

    def applies(self) -> bool:
        return "Transformer" in self.ctx.source_text

    def leave_Call(self, original_node, updated_node):
        hint = self._hints.get(original_node)
        if hint is None:
            return updated_node
        self.ctx.fix(original_node, "the encoder's mask is causal: `is_causal` says so, and torch does not read it")
        return updated_node.with_changes(args=[*updated_node.args, cst.Arg(
            keyword=cst.Name("is_causal"), value=cst.parse_expression(hint),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))])

    @cached_property
    def _hints(self) -> dict[cst.Call, str]:
        """The encoder calls of the file's classes given a causal mask, with their ``is_causal``."""
        found = {}
        for cls, methods in self.ctx.facts.file.definitions.methods.items():
            encoders = self._encoders(cls, methods)
            if not encoders:
                continue
            for method in methods.values():
                def enter(node):
                    if type(node) is cst.Call and _self_attribute(node.func) in encoders:
                        hint = self._hint(node, cls, methods, method)
                        if hint is not None:
                            found[node] = hint
                    return True

                walk(method, enter)
        return found

    def _encoders(self, cls: cst.ClassDef, methods) -> set[str]:
        """The attributes of ``cls`` that hold an ``nn.TransformerEncoder``: those it assigns one,
        and ``encoder`` of a subclass of ``nn.Transformer`` that does not assign it otherwise."""
        qualname = self.ctx.facts.file.qualname
        assigned = _self_assignments(methods.values())
        found = {name for name, values in assigned.items()
                 if all(type(v) is cst.Call and qualname(v.func) == _ENCODER for v, _ in values)}
        if "encoder" not in assigned and any(qualname(base.value) == _TRANSFORMER for base in cls.bases):
            found.add("encoder")
        return found

    def _hint(self, call: cst.Call, cls, methods, method) -> str | None:
        if call_arg(call, 3, "is_causal") is not None:
            return None
        mask = call_arg(call, 1, "mask")
        if mask is None or mask.star:
            return None
        attribute = _self_attribute(mask.value)
        if attribute is not None:
            values = _self_assignments(methods.values()).get(attribute, [])
        elif type(mask.value) is cst.Name:
            values = [(value, method) for value in _assignments(method, mask.value.value)]
        else:
            values = []
        causal = [(value, where) for value, where in values if not _is_none(value)]
        if not causal or not all(self._causal(value, cls, methods, where) for value, where in causal):
            return None
        code = self.ctx.code(mask.value).strip()
        return "True" if len(causal) == len(values) else f"{code} is not None"

    def _causal(self, value: cst.BaseExpression, cls, methods, method, depth: int = 3) -> bool:
        """Whether ``value`` is the causal mask: built by one of the known forms, or by a name
        or method of the class that gives one."""
        while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value == "to":
            value = value.func.value
        if depth == 0:
            return False
        if type(value) is cst.Name:
            assigned = _assignments(method, value.value)
            return len(assigned) == 1 and self._causal(assigned[0], cls, methods, method, depth - 1)
        if type(value) is not cst.Call:
            return False
        qualname = self.ctx.facts.file.qualname(value.func) or ""
        if qualname == f"{_TRANSFORMER}.{_GENERATE}":
            return True
        helper = _self_attribute(value.func)
        if helper in methods:
            returned = _returned(methods[helper])
            return returned is not None and self._causal(returned, cls, methods, methods[helper], depth - 1)
        if helper == _GENERATE:
            return any(self.ctx.facts.file.qualname(base.value) == _TRANSFORMER for base in cls.bases)
        return self._triangle(value)

    def _triangle(self, call: cst.Call) -> bool:
        """``torch.log(torch.tril(torch.ones(n, n)))`` or ``torch.triu(torch.full((n, n), -inf), diagonal=1)``."""
        qualname = self.ctx.facts.file.qualname
        inner = call.args[0].value if len(call.args) >= 1 else None
        if qualname(call.func) == "torch.log" and len(call.args) == 1 and type(inner) is cst.Call:
            ones = inner.args[0].value if qualname(inner.func) == "torch.tril" and len(inner.args) == 1 else None
            return (type(ones) is cst.Call and qualname(ones.func) == "torch.ones" and len(ones.args) == 2
                    and self._same(ones.args[0].value, ones.args[1].value))
        if qualname(call.func) == "torch.triu" and type(inner) is cst.Call and qualname(inner.func) == "torch.full":
            diagonal = call_arg(call, 1, "diagonal")
            size, fill = (inner.args[0].value, inner.args[1].value) if len(inner.args) >= 2 else (None, None)
            return (diagonal is not None and self.ctx.code(diagonal.value).strip() == "1"
                    and type(size) in (cst.Tuple, cst.List) and len(size.elements) == 2
                    and self._same(size.elements[0].value, size.elements[1].value)
                    and self.ctx.code(fill).strip().replace('"', "'") in _MINUS_INFINITY)
        return False

    def _same(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        return self.ctx.code(first).strip() == self.ctx.code(second).strip()


def _self_attribute(node: cst.CSTNode) -> str | None:
    if type(node) is cst.Attribute and type(node.value) is cst.Name and node.value.value == "self":
        return node.attr.value
    return None


def _self_assignments(methods) -> dict[str, list[tuple[cst.BaseExpression, cst.FunctionDef]]]:
    """``self.<name> = value`` in ``methods``, by name, with the method that assigns it."""
    found: dict[str, list] = {}
    for method in methods:
        def enter(node):
            if type(node) is cst.Assign:
                for target in node.targets:
                    name = _self_attribute(target.target)
                    if name is not None:
                        found.setdefault(name, []).append((node.value, method))
            elif type(node) in (cst.AugAssign, cst.AnnAssign) and _self_attribute(node.target) is not None:
                found.setdefault(_self_attribute(node.target), []).append((node.target, method))  # not a mask it built
            return True

        walk(method, enter)
    return found


def _assignments(function: cst.FunctionDef, name: str) -> list[cst.BaseExpression]:
    found = []

    def enter(node):
        if type(node) is cst.Assign:
            found.extend(node.value for target in node.targets
                         if type(target.target) is cst.Name and target.target.value == name)
        elif type(node) in (cst.AugAssign, cst.AnnAssign, cst.For, cst.With) and name in _bound_names(node):
            found.append(node)  # bound otherwise: not a mask it built
        return True

    walk(function, enter)
    return found


def _bound_names(node: cst.CSTNode) -> set[str]:
    targets = {cst.AugAssign: "target", cst.AnnAssign: "target", cst.For: "target"}
    target = getattr(node, targets.get(type(node), ""), None)
    names = set()
    if target is not None:
        walk(target, lambda n: names.add(n.value) if type(n) is cst.Name else None)
    if type(node) is cst.With:
        for item in node.items:
            if item.asname is not None:
                walk(item.asname.name, lambda n: names.add(n.value) if type(n) is cst.Name else None)
    return names


def _returned(method: cst.FunctionDef) -> cst.BaseExpression | None:
    """What ``method`` returns where its body is one ``return``."""
    body = method.body.body
    line = body[0] if len(body) == 1 else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and type(line.body[0]) is cst.Return:
        return line.body[0].value
    return None


def _is_none(node: cst.CSTNode) -> bool:
    return type(node) is cst.Name and node.value == "None"
