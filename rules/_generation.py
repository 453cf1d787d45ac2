"""Token-by-token generation, which ACC003 and ACC103 both look for: a loop that calls a model
and grows a tensor by concatenating onto it every iteration (``idx = torch.cat((idx, idx_next),
dim=1)``, a GPT's ``generate``). On a lazy target the graph of such a loop grows with every token
unless each iteration ends the step (ACC003), and every new length compiles a new graph (ACC103).

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accrewrite.nodes import call_arg, descendants, dotted, string_value, walk
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


# The model's context padded to a bucket length already (a migrated file): nothing to do.
BUCKETED = "the context is padded to a bucket length already"
_UNCROPPED = cst.Name("None")  # the model's context is the whole sequence
_SCOPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})
_PAD = "torch.nn.functional.pad"
# Layers that compute each position from that position alone.
_POSITIONWISE = frozenset(
    {"Embedding", "Linear", "LayerNorm", "RMSNorm", "Dropout", "GELU", "ReLU", "SiLU", "Tanh", "Sigmoid",
     "LeakyReLU", "Mish", "Softplus", "Identity", "Sequential", "ModuleList", "ModuleDict", "Parameter"}
)
_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
_SDPA = "torch.nn.functional.scaled_dot_product_attention"
_SOFTMAX = frozenset({"torch.softmax", "torch.nn.functional.softmax"})


@dataclass(frozen=True, eq=False)
class Generation:
    """A generation loop whose model may run on its context padded on the right: the nodes of
    the loop that the padding changes."""

    grown: str
    call: cst.Call  # the model's call
    limit: cst.BaseExpression | None  # N where the context is cropped to the last N (``idx[:, -N:]``)
    reads: tuple[cst.Subscript, ...]  # the logits read at the last position (``logits[:, -1, :]``)
    cat: cst.Call  # ``torch.cat((idx, idx_next), dim=1)``


def generation(facts: Facts, loop: cst.For | cst.While, values: ScopeValues,
               scope: cst.FunctionDef | None) -> Generation | str | None:
    """How ``loop`` generates: None where it does not (``grown_sequence``); a Generation where
    its model can be run on the context padded on the right, its logits read at the last real
    position, exactly as on the context itself; otherwise why not (``BUCKETED`` where it is
    padded already)."""
    grown = grown_sequence(facts, loop, values)
    if grown is None:
        return None
    calls = _model_calls(loop.body, values)
    growth = _concatenation(facts, loop.body, grown)
    if "." in grown or len(calls) != 1 or growth is None:
        return f"the loop's model call and `{grown}`'s growth are not those of one sampling step"
    if any(isinstance(node, cst.Return) for node in descendants(loop.body, prune=_SCOPES)):
        return f"the loop returns from inside, where `{grown}` would be on the host"
    [call] = calls
    context = call_arg(call, 0)
    if context is None or len(call.args) != 1:
        return "the model is given more than its context"
    if _padded(facts, context.value):
        return BUCKETED
    model = model_class(facts, call.func, scope)
    if model is None:
        return "the model's class is not defined in this file, so it cannot be shown causal"
    limit = _limit(facts, loop.body, context.value, grown)
    if isinstance(limit, str):
        return limit
    why = not_causal(facts, model, cropped=limit is not _UNCROPPED)
    if why is not None:
        return why
    reads = _last_position_reads(loop.body, call)
    if isinstance(reads, str):
        return reads
    if _stray_reads(loop.body, grown, allowed=_context_nodes(loop.body, context.value, grown) | {growth}):
        return f"`{grown}` is read elsewhere in the loop, where it would be on the host"
    return Generation(grown, call, None if limit is _UNCROPPED else limit, reads, growth.value)


def planned_generation(ctx, loop: cst.For | cst.While) -> Generation | str | None:
    """``generation`` of a loop of the file being migrated, worked out once for the rules that
    ask (ACC028 pads it, ACC103 reports it where it cannot be padded)."""
    plans = ctx.shared.setdefault("generation", {})
    if loop not in plans:
        plans[loop] = generation(ctx.facts, loop, ctx.facts.values(ctx.scope), ctx.scope)
    return plans[loop]


def _model_calls(body: cst.CSTNode, values: ScopeValues) -> list[cst.Call]:
    found = []

    def enter(child):
        if isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(child, cst.Call) and values.kind(child.func) is Kind.MODEL:
            found.append(child)
        return True

    walk(body, enter)
    return found


def _concatenation(facts: Facts, body: cst.CSTNode, grown: str) -> cst.Assign | None:
    """``grown = torch.cat((grown, new), dim=1)``: the one growth, which the padding keeps on
    the host."""
    found = []

    def enter(child):
        if isinstance(child, cst.Assign) and isinstance(child.value, cst.Call) and len(child.targets) == 1 \
                and concatenates_itself(facts, child.targets[0].target, child.value):
            found.append(child)
        return not isinstance(child, (cst.FunctionDef, cst.ClassDef))

    walk(body, enter)
    if len(found) != 1:
        return None
    call = found[0].value
    parts = call.args[0].value.elements
    dim = call_arg(call, 1, "dim")
    if len(parts) != 2 or dotted(parts[0].value) != grown or dim is None or not _is_int(dim.value, 1):
        return None
    return found[0]


def _padded(facts: Facts, context: cst.BaseExpression) -> bool:
    """``F.pad(window, ...).to(device)``: the form this module's loops are rewritten to."""
    return isinstance(context, cst.Call) and isinstance(context.func, cst.Attribute) \
        and isinstance(context.func.value, cst.Call) and facts.file.qualname(context.func.value.func) == _PAD


def _limit(facts, body, context, grown: str):
    """N where the model's context is the last N of ``grown`` (``idx[:, -N:]``, maybe through a
    name bound in the loop, maybe as minGPT's ``idx if idx.size(1) <= N else idx[:, -N:]``),
    ``_UNCROPPED`` where it is ``grown`` itself; a string says why neither."""
    if dotted(context) == grown:
        return _UNCROPPED
    value = context
    if isinstance(context, cst.Name):
        value = _bound_in(body, context.value)
        if value is None or len(_stray_reads(body, context.value, allowed=set())) != 2:
            return f"the model's context `{context.value}` is not only the model's input"
    whole = None
    if isinstance(value, cst.IfExp) and dotted(value.body) == grown:
        value, whole = value.orelse, value.test
    limit = _cropped(value, grown)
    if limit is None or whole is not None and not _no_longer_than(whole, grown, limit):
        return f"the model's context is not the last tokens of `{grown}`"
    return limit


def _bound_in(body: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The value of the one ``name = value`` in ``body``."""
    values = []

    def enter(child):
        if isinstance(child, cst.Assign) and any(dotted(t.target) == name for t in child.targets):
            values.append(child.value)
        return not isinstance(child, (cst.FunctionDef, cst.ClassDef))

    walk(body, enter)
    return values[0] if len(values) == 1 else None


def _cropped(value: cst.BaseExpression, grown: str) -> cst.BaseExpression | None:
    """N of ``grown[:, -N:]``."""
    if not isinstance(value, cst.Subscript) or dotted(value.value) != grown or len(value.slice) != 2:
        return None
    batch, time = (element.slice for element in value.slice)
    if not _whole(batch) or not isinstance(time, cst.Slice) or time.upper is not None or time.step is not None:
        return None
    lower = time.lower
    if isinstance(lower, cst.UnaryOperation) and isinstance(lower.operator, cst.Minus):
        return lower.expression
    return None


def _no_longer_than(test: cst.BaseExpression, grown: str, limit: cst.BaseExpression) -> bool:
    """``idx.size(1) <= N``: the test under which minGPT's context is the whole sequence."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    [compared] = test.comparisons
    left = test.left
    return isinstance(compared.operator, cst.LessThanEqual) and compared.comparator.deep_equals(limit) \
        and isinstance(left, cst.Call) and dotted(left.func) == f"{grown}.size" and len(left.args) == 1 \
        and _is_int(left.args[0].value, 1)


def _context_nodes(body, context, grown: str) -> set[cst.CSTNode]:
    """The nodes that read ``grown`` for the model's context: its crop, or the context itself."""
    if isinstance(context, cst.Name) and dotted(context) != grown:
        return {_bound_in(body, context.value)}
    return {context}


def _stray_reads(body: cst.CSTNode, name: str, allowed: set[cst.CSTNode]) -> list[cst.Name]:
    """The places ``body`` names ``name`` (read or bound) outside the nodes ``allowed``."""
    found = []
    labels: set[int] = set()

    def enter(child):
        if child in allowed or isinstance(child, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(child, cst.Attribute):
            labels.add(id(child.attr))
        elif isinstance(child, cst.Arg) and child.keyword is not None:
            labels.add(id(child.keyword))
        elif isinstance(child, cst.Name) and child.value == name and id(child) not in labels:
            found.append(child)
        return True

    walk(body, enter)
    return found


def _last_position_reads(body: cst.CSTNode, call: cst.Call) -> tuple[cst.Subscript, ...] | str:
    """Where the model's logits are read at the last position: on the call itself
    (``model(x)[:, -1, :]``) or on the name it binds, in the statements after it up to the one
    that binds the name again (``logits = logits[:, -1, :] / temperature``)."""
    found = _statement_of(body, call)
    if found is None:
        return "the model is called in a one-line suite (`if x: logits = model(idx)`)"
    block, index = found
    statement = block[index]
    direct = [s for s in _subscripts(statement) if s.value is call]
    if direct:
        return tuple(direct) if all(_last_position(s) for s in direct) else _NOT_LAST
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    if not isinstance(small, cst.Assign) or small.value is not call or len(small.targets) != 1:
        return _NOT_LAST
    target = small.targets[0].target
    if isinstance(target, cst.Tuple) and target.elements:
        target = target.elements[0].value
    if not isinstance(target, cst.Name):
        return _NOT_LAST
    reads: list[cst.Subscript] = []
    for later in block[index + 1:]:
        named = [s for s in _subscripts(later) if dotted(s.value) == target.value]
        if not all(_last_position(s) for s in named) or len(_stray_reads(later, target.value, allowed=set(named))) \
                > _binds(later, target.value):
            return _NOT_LAST
        reads += named
        if _binds(later, target.value):
            break
    return tuple(reads) if reads else _NOT_LAST


_NOT_LAST = "the model's logits are read elsewhere than at the last position"


def _statement_of(body: cst.CSTNode, call: cst.Call) -> tuple[list, int] | None:
    """The block holding the simple statement line that makes ``call``, and its index there
    (None where the call is in a one-line suite, ``if x: logits = model(idx)``)."""
    found = []

    def enter(child):
        if found:
            return False
        if isinstance(child, cst.IndentedBlock):
            for index, statement in enumerate(child.body):
                if isinstance(statement, cst.SimpleStatementLine) and _holds(statement, call):
                    found.append((list(child.body), index))
        return True

    walk(body, enter)
    return found[0] if found else None


def _holds(tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(child is node for child in descendants(tree))


def _subscripts(tree: cst.CSTNode) -> list[cst.Subscript]:
    return [node for node in descendants(tree) if isinstance(node, cst.Subscript)]


def _binds(statement: cst.CSTNode, name: str) -> int:
    """1 where ``statement`` is ``name = ...``, else 0."""
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    return int(isinstance(small, cst.Assign) and any(dotted(t.target) == name for t in small.targets))


def _last_position(subscript: cst.Subscript) -> bool:
    """``x[:, -1, :]``, ``x[:, -1]`` or ``x[:, [-1], :]``: the last position of each row."""
    elements = [element.slice for element in subscript.slice]
    if len(elements) not in (2, 3) or not all(_whole(e) for e in elements[:1] + elements[2:]):
        return False
    index = elements[1]
    if not isinstance(index, cst.Index):
        return False
    value = index.value
    if isinstance(value, cst.List) and len(value.elements) == 1:
        value = value.elements[0].value
    return _is_int(value, -1)


def keeps_dimension(subscript: cst.Subscript) -> bool:
    """Whether a last-position read keeps the position's dimension (``x[:, [-1], :]``)."""
    return isinstance(subscript.slice[1].slice.value, cst.List)


def _whole(piece) -> bool:
    return isinstance(piece, cst.Slice) and piece.lower is None and piece.upper is None and piece.step is None


def _is_int(node: cst.BaseExpression, number: int) -> bool:
    if number < 0:
        return isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
            and _is_int(node.expression, -number)
    return isinstance(node, cst.Integer) and node.evaluated_value == number


def model_class(facts: Facts, func: cst.BaseExpression, scope: cst.FunctionDef | None) -> cst.ClassDef | None:
    """The file's class of the model that ``func`` calls: ``self`` in a method of the class, or a
    name bound once to an instance (``GPT(config)``, ``GPT(config).to(device)``, ``model.to(device)``)."""
    if isinstance(func, cst.Name) and func.value == "self" and scope is not None:
        return facts.file.method_class.get(scope)
    return _instance_class(facts, func, depth=0)


def _instance_class(facts: Facts, value: cst.BaseExpression, depth: int) -> cst.ClassDef | None:
    if depth > 4:
        return None
    if isinstance(value, cst.Name):
        bound = facts.file.assignments.get(value.value, ())
        return _instance_class(facts, bound[0], depth + 1) if len(bound) == 1 else None
    if not isinstance(value, cst.Call):
        return None
    made = value.func
    if isinstance(made, cst.Name):
        return facts.file.definitions.classes.get(made.value)
    if isinstance(made, cst.Attribute) and made.attr.value in ("to", "cuda", "eval", "train"):
        return _instance_class(facts, made.value, depth + 1)
    return None


def not_causal(facts: Facts, model: cst.ClassDef, cropped: bool) -> str | None:
    """Why running ``model`` on a context padded on the right could change its logits at the
    real positions, or None where its ``__init__`` and ``forward`` show it causal: each position
    computed from the positions before it (layers of one position, attention masked with a
    lower-triangular buffer or ``is_causal=True``, one-directional RNNs), every position's logits
    returned, and, where the context is not cropped to a fixed length, no positions of a fixed
    number (``arange``, an ``assert`` on the length)."""
    classes = _model_classes(facts, model)
    masks = _triangular_buffers(facts, classes)
    for cls in classes:
        methods = facts.file.definitions.methods.get(cls, {})
        forward = methods.get("forward")
        for method in filter(None, (methods.get("__init__"), forward)):
            why = _layers_not_causal(facts, method)
            if why is not None:
                return why
        if forward is None:
            continue
        if _attends(facts, forward) and not _masks_causally(facts, forward, masks):
            return f"`{cls.name.value}` attends to every position (no causal mask)"
        if any(_last_position(s) for s in _subscripts(forward)):
            return "the model returns only its last position's logits"
        if not cropped and any(isinstance(n, cst.Assert) or isinstance(n, cst.Call) and dotted(n.func) is not None
                               and dotted(n.func).endswith("arange") for n in descendants(forward)):
            return "the model has positions up to a fixed length and the context is not cropped to it"
    return None


def _model_classes(facts: Facts, model: cst.ClassDef) -> list[cst.ClassDef]:
    """``model``, the file's classes it derives from or builds, at any depth, and those that
    derive from any of these (``self`` in a method may be an instance of a subclass)."""
    classes = facts.file.definitions.classes
    found = [model]
    for cls in found:
        named = {dotted(base.value) for base in cls.bases}
        named |= {dotted(n.func) for n in descendants(cls) if isinstance(n, cst.Call)}
        named |= {name for name, other in classes.items() if _derives(other, found)}
        found += [classes[name] for name in sorted(named & classes.keys()) if classes[name] not in found]
    return found


def _derives(cls: cst.ClassDef, classes: list[cst.ClassDef]) -> bool:
    return any(dotted(base.value) == other.name.value for base in cls.bases for other in classes)


def _triangular_buffers(facts: Facts, classes: list[cst.ClassDef]) -> set[str]:
    """The attributes the model's classes hold a lower-triangular matrix in (``tril``)."""
    names = set()
    for cls in classes:
        for node in descendants(cls):
            if isinstance(node, cst.Call) and dotted(node.func) == "self.register_buffer" and len(node.args) >= 2 \
                    and _makes_triangle(facts, node.args[1].value):
                names.add(string_value(node.args[0].value))
            elif isinstance(node, cst.Assign) and _makes_triangle(facts, node.value):
                names.update(dotted(t.target)[5:] for t in node.targets if (dotted(t.target) or "").startswith("self."))
    return names


def _makes_triangle(facts: Facts, value: cst.BaseExpression) -> bool:
    return any(isinstance(n, cst.Call) and facts.file.qualname(n.func) == "torch.tril" for n in (value, *descendants(value)))


def _layers_not_causal(facts: Facts, method: cst.FunctionDef) -> str | None:
    """Why a layer ``method`` builds or calls may read later positions."""
    for node in descendants(method):
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) \
                and any((dotted(t.target) or "").startswith("self.") for t in node.targets):
            built = _unknown_builder(facts, node.value.func)
            if built is not None:
                return f"`{built}` builds a layer whose positions the file does not show"
        if not isinstance(node, cst.Call):
            continue
        qualified = facts.file.qualname(node.func) or ""
        layer = qualified.rpartition(".")[2]
        if qualified == _SDPA and not _causal_attention_call(node):
            return "its `scaled_dot_product_attention` is not given is_causal=True"
        if not qualified.startswith("torch.nn.") or not layer[:1].isupper() or layer in _POSITIONWISE:
            continue
        if layer not in _RECURRENT:
            return f"`{layer}` may read later positions"
        both = call_arg(node, 99, "bidirectional")
        if both is not None and not (isinstance(both.value, cst.Name) and both.value.value == "False"):
            return f"its `{layer}` may be bidirectional"
    return None


def _unknown_builder(facts: Facts, func: cst.BaseExpression) -> str | None:
    """``func``'s name where what it makes, kept as a module's attribute, may be a layer that is
    neither the file's own class nor torch's: a parameter, a factory, another library's class."""
    name = dotted(func)
    qualified = facts.file.qualname(func)
    if name in facts.file.definitions.classes or name in _HARMLESS_BUILTINS:
        return None
    if qualified is not None and qualified.startswith("torch.") or isinstance(func, cst.Attribute) \
            and func.attr.value in ("to", "cuda", "float", "half", "bool", "view", "type_as"):
        return None
    return name or "a call"


# Builtins whose results, kept by a module, are no layer.
_HARMLESS_BUILTINS = frozenset({"hasattr", "getattr", "isinstance", "int", "float", "bool", "len", "max", "min",
                                "sum", "dict", "list", "tuple", "range", "str"})


def _causal_attention_call(call: cst.Call) -> bool:
    causal = call_arg(call, 6, "is_causal")
    mask = call_arg(call, 3, "attn_mask")
    return causal is not None and dotted(causal.value) == "True" and (mask is None or dotted(mask.value) == "None")


def _attends(facts: Facts, forward: cst.FunctionDef) -> bool:
    """Whether ``forward`` weighs positions against each other (a product of matrices, a
    softmax, a scaled-dot-product attention)."""
    for node in descendants(forward):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            return True
        if isinstance(node, cst.Call):
            qualified = facts.file.qualname(node.func)
            if qualified in _SOFTMAX or qualified == _SDPA or qualified in ("torch.matmul", "torch.bmm", "torch.einsum") \
                    or isinstance(node.func, cst.Attribute) and node.func.attr.value in ("softmax", "matmul", "bmm"):
                return True
    return False


def _masks_causally(facts: Facts, forward: cst.FunctionDef, masks: set[str]) -> bool:
    """Whether ``forward`` masks its attention causally: ``masked_fill(self.tril[...] == 0, ...)``
    with a lower-triangular buffer, or ``scaled_dot_product_attention(..., is_causal=True)``."""
    for node in descendants(forward):
        if not isinstance(node, cst.Call):
            continue
        if facts.file.qualname(node.func) == _SDPA:
            return _causal_attention_call(node)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("masked_fill", "masked_fill_") \
                and node.args and _upper_triangle(node.args[0].value, masks):
            return True
    return False


def _upper_triangle(mask: cst.BaseExpression, masks: set[str]) -> bool:
    """``self.tril[:T, :T] == 0``: the positions after each one."""
    if not isinstance(mask, cst.Comparison) or len(mask.comparisons) != 1:
        return False
    [compared] = mask.comparisons
    left = mask.left.value if isinstance(mask.left, cst.Subscript) else mask.left
    return isinstance(compared.operator, cst.Equal) and _is_int(compared.comparator, 0) \
        and dotted(left) in {f"self.{name}" for name in masks}
