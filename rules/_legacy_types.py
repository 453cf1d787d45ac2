"""Legacy CUDA tensor types (``torch.cuda.FloatTensor``), which ACC027 migrates and ACC002 refuses
where ACC027 does not run: each place a file names one, what it does there, and whether it can be
spelled with a device.

A type is named directly (``torch.cuda.LongTensor(n)``) or through an alias the file assigns,
``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``, with the CPU type of the same
dtype where CUDA is not available. Each name of one is a use of it:

- a call, with sizes (``Tensor(imgs.size(0), 1)``: ints, a size, a shape, several arguments) or
  with data (``Tensor(np.random.normal(...))``: a numpy call, a list or tuple written out);
- a conversion, ``x.type(Tensor)``;
- anything else (passed to a function, compared, a call whose argument may be either), which no
  device spelling replaces: the type stays, and so does every use of its alias.

Found once per file (``legacy_types``), only in one whose text names a CUDA tensor type.

No class here derives from ``Rule``: the registry registers every Rule subclass of a module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from accrewrite.nodes import dotted, walk
from accrewrite.rule import RuleContext, excerpt
from accrewrite.values import Kind

LEGACY_RULE = "ACC027"
# A legacy tensor type's name -> its dtype's attribute of torch.
DTYPES = {
    "FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16", "BFloat16Tensor": "bfloat16",
    "LongTensor": "int64", "IntTensor": "int32", "ShortTensor": "int16", "CharTensor": "int8",
    "ByteTensor": "uint8", "BoolTensor": "bool",
}
# The words of the statements that use a legacy type (ACC027's triggers): an alias of another name
# is not followed.
WORDS = frozenset({"cuda", "type", "Variable", "Tensor", *DTYPES})
_NAMED = re.compile(r"cuda\.[A-Z][A-Za-z0-9]*Tensor|from torch\.cuda import")
_AVAILABLE = "torch.cuda.is_available"
_SEQUENCES = frozenset({"list", "tuple"})
_VARIABLE = frozenset({"torch.autograd.Variable", "torch.autograd.variable.Variable"})
# Methods that return the tensor they are called on, changed in place and without a graph.
_IN_PLACE = frozenset({"fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_"})
# torch functions that make a new tensor without a graph.
_FACTORIES = frozenset(f"torch.{name}" for name in (
    "randn", "rand", "randint", "randperm", "zeros", "ones", "full", "empty", "arange", "tensor", "eye", "linspace",
    "from_numpy", "as_tensor",
))


_EITHER = ("A legacy type's constructor reads ints as sizes and a sequence or array as data. Make the tensor "
           "with a device: `torch.empty(n, m, dtype=..., device=device)` for sizes, `torch.tensor(x, dtype=..., "
           "device=device)` for data, and migrate again.")
_USED = ("A legacy CUDA tensor type makes CUDA tensors and has no spelling for another device. Make the tensor with "
         "a device (`torch.ones(n, 1, device=device)`, `torch.as_tensor(array, device=device)`, `x.to(device, "
         "torch.float32)`) and migrate again.")
_ALIAS = ("Its uses are spelled with a device only where every one is a constructor call or `x.type(...)` and the "
          "alias is one CUDA type, or one chosen by `torch.cuda.is_available()` or a tensor's `is_cuda` beside its "
          "CPU type. Make the tensors with a device and dtype (`torch.empty(n, m, dtype=torch.float32, "
          "device=device)`) and migrate again.")


@dataclass(frozen=True, eq=False)
class Use:
    """A call that a legacy type's use is: ``kind`` is "sizes" or "data" for a constructor,
    "conversion" for ``x.type(T)``; ``dtype`` the attribute of torch it keeps."""

    kind: str
    dtype: str
    device: str | None = None  # ``mu.device`` where the type followed a tensor's; None: the device


@dataclass(eq=False)
class LegacyTypes:
    """What ``legacy_types`` finds in a file."""

    uses: dict[cst.Call, Use] = field(default_factory=dict)
    # The alias assignments that go once their uses are spelled with a device.
    aliases: set[cst.CSTNode] = field(default_factory=set)
    # The names of a type that stay, and why (one fact, what to do).
    left: list[tuple[cst.CSTNode, str, str]] = field(default_factory=list)
    # ``Variable(...)`` calls: the wrapper of torch's first autograd API, a detaching copy today.
    variables: list[cst.Call] = field(default_factory=list)


def names_legacy_types(text: str | None) -> bool:
    """Whether a file's text (None: not known) may name a legacy CUDA tensor type."""
    return text is None or _NAMED.search(text) is not None


def legacy_types(ctx: RuleContext) -> LegacyTypes:
    """The file's legacy CUDA tensor types, worked out once for the rules that ask."""
    found = ctx.shared.get("legacy_types")
    if found is None:
        found = _Finder(ctx).found() if names_legacy_types(ctx.facts.file.text) else LegacyTypes()
        ctx.shared["legacy_types"] = found
    return found


@dataclass(eq=False)
class _Alias:
    """A name the file assigns a legacy CUDA type: its assignments (statement lines, and the
    functions they are in), the dtype they agree on (None where they do not), and the tensor whose
    device chose the type (``mu`` of ``torch.cuda.FloatTensor if mu.is_cuda else ...``)."""

    dtype: str | None
    tensor: str | None
    statements: list[cst.CSTNode] = field(default_factory=list)
    scopes: set = field(default_factory=set)


class _Finder:
    """One walk of the file for the names of legacy types and the calls, then what each is."""

    def __init__(self, ctx: RuleContext) -> None:
        self.ctx = ctx
        self.file = ctx.facts.file
        self.aliases = self._aliases()
        self.refs: dict[cst.CSTNode, cst.FunctionDef | None] = {}  # each name of a type -> its function
        self.calls: list[tuple[cst.Call, cst.FunctionDef | None]] = []
        self._scopes: list[cst.FunctionDef] = []

    def found(self) -> LegacyTypes:
        self._walk()
        result = LegacyTypes()
        explained: dict[cst.CSTNode, cst.Call] = {}
        for call, scope in self.calls:
            if self.file.qualname(call.func) in _VARIABLE:
                result.variables.append(call)
            elif call.func in self.refs:
                kind = self._arguments(call, scope)
                explained[call.func] = call
                if kind is None:
                    result.left.append((call, f"`{excerpt(self.ctx.code(call))}` may take sizes or data", _EITHER))
                else:
                    result.uses[call] = self._use(kind, call.func)
            elif self._converts(call):
                explained[call.args[0].value] = call
                result.uses[call] = self._use("conversion", call.args[0].value)
        for ref in self.refs:
            if ref not in explained:
                result.left.append((ref, f"`{self.ctx.code(ref)}` is used where no device can be given to it", _USED))
        for name, alias in self.aliases.items():
            reads = [ref for ref in self.refs if type(ref) is cst.Name and ref.value == name]
            why = self._alias_left(name, alias, reads, explained, result.uses)
            if why is None:
                result.aliases.update(alias.statements)
                continue
            for read in reads:
                result.uses.pop(explained.get(read), None)
            if alias.statements:
                result.left.append((alias.statements[0], why, _ALIAS))
        return result

    def _use(self, kind: str, ref: cst.CSTNode) -> Use:
        name = self._cuda_type(ref)
        if name:
            return Use(kind, DTYPES[name])
        alias = self.aliases[ref.value]
        return Use(kind, alias.dtype, f"{alias.tensor}.device" if alias.tensor else None)

    # The file's names of legacy types ----------------------------------------------------

    def _aliases(self) -> dict[str, _Alias]:
        """Names assigned a legacy CUDA type, their statements filled by the walk."""
        found = {}
        for name, values in self.file.assignments.items():
            chosen = {self._alias_choice(value) for value in values}
            if "." not in name and any(chosen):
                found[name] = _Alias(*chosen.pop()) if len(chosen) == 1 else _Alias(None, None)
        return found

    def _alias_choice(self, value: cst.BaseExpression) -> tuple[str, str | None] | None:
        """``torch.cuda.FloatTensor``, and ``torch.cuda.FloatTensor if cuda else
        torch.FloatTensor`` (``torch.Tensor``, the default type, beside the float type) where
        ``cuda`` tests CUDA's availability or a tensor's ``is_cuda``: the dtype and that tensor
        (None: the device's), else None."""
        if type(value) is not cst.IfExp:
            name = self._cuda_type(value)
            return (DTYPES[name], None) if name else None
        name = self._cuda_type(value.body)
        other = self.file.qualname(value.orelse)
        cpu = {f"torch.{name}"} | ({"torch.Tensor"} if name == "FloatTensor" and not self._default_changed() else set())
        if not name or other not in cpu:
            return None
        test = value.test
        if type(test) is cst.Attribute and test.attr.value == "is_cuda" and type(test.value) is cst.Name:
            return DTYPES[name], test.value.value
        return (DTYPES[name], None) if self._tests_cuda(test) else None

    def _default_changed(self) -> bool:
        text = self.file.text
        return text is None or "set_default" in text

    def _tests_cuda(self, test: cst.BaseExpression) -> bool:
        """``torch.cuda.is_available()``, or a name only ever assigned it (``cuda = True if
        torch.cuda.is_available() else False``): where it holds, the models are on CUDA."""
        if type(test) is cst.Name:
            values = self.file.assignments.get(test.value, ())
            return bool(values) and all(self._availability(value) for value in values)
        return self._availability(test)

    def _availability(self, value: cst.BaseExpression) -> bool:
        if type(value) is cst.IfExp:
            return (self._availability(value.test) and dotted(value.body) == "True"
                    and dotted(value.orelse) == "False")
        return type(value) is cst.Call and not value.args and self.file.qualname(value.func) == _AVAILABLE

    def _cuda_type(self, node: cst.CSTNode) -> str | None:
        if type(node) not in (cst.Name, cst.Attribute):
            return None
        module, _, name = (self.file.qualname(node) or "").rpartition(".")
        return name if module == "torch.cuda" and name in DTYPES else None

    def _walk(self) -> None:
        """The names of legacy types (not the targets their aliases are assigned to), the calls,
        the alias assignments; in source order."""
        walk(self.ctx.module, self._enter, self._leave)

    # Methods, not closures: a closure that walks with itself is a reference cycle, which would
    # keep the file's tree until the cycle collector runs.
    def _enter(self, node) -> bool:
        kind = type(node)
        scope = self._scopes[-1] if self._scopes else None
        if kind is cst.Name or kind is cst.Attribute:
            if self._cuda_type(node) or kind is cst.Name and node.value in self.aliases:
                self.refs[node] = scope
                return False
            if kind is cst.Attribute:
                walk(node.value, self._enter, self._leave)
                return False
        elif kind is cst.Arg:
            walk(node.value, self._enter, self._leave)
            return False
        elif kind is cst.Call:
            self.calls.append((node, scope))
        elif kind is cst.FunctionDef:
            self._scopes.append(node)
        elif kind is cst.SimpleStatementLine and self._alias_line(node):
            alias = self.aliases[node.body[0].targets[0].target.value]
            alias.statements.append(node)
            alias.scopes.add(scope)
            return False  # its value names the type, which goes or stays with the alias
        return kind is not cst.Import and kind is not cst.ImportFrom

    def _leave(self, node) -> None:
        if type(node) is cst.FunctionDef:
            self._scopes.pop()

    def _alias_line(self, line: cst.SimpleStatementLine) -> bool:
        small = line.body[0] if len(line.body) == 1 else None
        return (type(small) is cst.Assign and len(small.targets) == 1 and type(small.targets[0].target) is cst.Name
                and small.targets[0].target.value in self.aliases)

    def _alias_left(self, name: str, alias: _Alias, reads, explained, uses) -> str | None:
        """Why an alias stays, or None where it goes with its uses."""
        if alias.dtype is None or len(alias.statements) != len(self.file.assignments[name]):
            return f"`{name}` is not always one legacy type chosen by CUDA's availability"
        if name not in WORDS:
            return f"`{name}` names a legacy type under a name the migration does not follow"
        if any(read not in explained or explained[read] not in uses for read in reads):
            return f"`{name}` stays a legacy type: one of its uses cannot be given a device"
        if alias.tensor is not None and not self._same_tensor(alias, reads):
            return f"`{name}` follows `{alias.tensor}`, which may be another tensor where it is used"
        return None

    def _same_tensor(self, alias: _Alias, reads) -> bool:
        """Whether the tensor whose device chose the alias is a parameter of the one function that
        assigns and reads the alias, never assigned there: its device is the type's at every read."""
        if len(alias.scopes) != 1 or None in alias.scopes:
            return False
        scope = next(iter(alias.scopes))
        values = self.ctx.facts.values(scope)
        return all(self.refs[read] is scope and values.bindings_at(alias.tensor, values.statement_of(read)) == {scope}
                   for read in reads)

    # What a call does with its type ------------------------------------------------------------

    def _converts(self, call: cst.Call) -> bool:
        """``x.type(T)``."""
        return (type(call.func) is cst.Attribute and call.func.attr.value == "type" and len(call.args) == 1
                and call.args[0].keyword is None and not call.args[0].star and call.args[0].value in self.refs)

    def _arguments(self, call: cst.Call, scope) -> str | None:
        """"sizes" or "data", as a legacy constructor reads its arguments; None where that cannot
        be told (a keyword, a name of unknown kind)."""
        args = call.args
        if any(arg.keyword is not None for arg in args):
            return None
        if not args:
            return "sizes"
        if len(args) > 1:
            return "sizes" if all(arg.star != "**" for arg in args) else None  # several: ints alone
        arg = args[0]
        if arg.star == "*":
            return "sizes" if self._shape(arg.value) else None
        if arg.star:
            return None
        values = self.ctx.facts.values(scope)
        if self._size(arg.value, values) or self._shape(arg.value):
            return "sizes"
        return "data" if self._data(arg.value, values) else None

    def _size(self, node: cst.BaseExpression, values) -> bool:
        """An int: ``imgs.size(0)``, ``imgs.shape[0]``, ``len(x)``, one the analysis knows, a name
        that every path here assigned one last."""
        if type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "size":
            return len(node.args) == 1
        if type(node) is cst.Subscript and len(node.slice) == 1 and type(node.slice[0].slice) is cst.Index:
            return self._shape(node.value)
        if type(node) is cst.Name and values.kind(node) is not Kind.INT:
            return _reaching(node, values, lambda value: self._size(value, values))
        return type(node) is cst.Integer or values.kind(node) is Kind.INT

    def _shape(self, node: cst.BaseExpression) -> bool:
        """A shape: ``x.shape``, ``x.size()``, ``D.output_shape``, a tuple of sizes written out."""
        if type(node) is cst.Call:
            return type(node.func) is cst.Attribute and node.func.attr.value == "size" and not node.args
        if type(node) is cst.Name and not node.value.endswith("shape"):
            values = self.file.assignments.get(node.value, ())
            return bool(values) and all(type(value) is cst.Tuple and value.elements for value in values)
        return (dotted(node) or "").endswith("shape")

    def _data(self, node: cst.BaseExpression, values) -> bool:
        """Data: a numpy call, a list or tuple written out or built (``tuple(map(...))``),
        arithmetic on those, or a name that every path here assigned one last."""
        if type(node) in (cst.List, cst.Tuple, cst.ListComp):
            return True
        if type(node) is cst.BinaryOperation:
            return self._data(node.left, values) or self._data(node.right, values)
        if type(node) is cst.Call:
            if dotted(node.func) in _SEQUENCES and self.file.qualname(node.func) is None:
                return True  # a tuple or list, never a torch.Size
            return (self.file.qualname(node.func) or "").partition(".")[0] == "numpy"
        if type(node) is cst.Name:
            return _reaching(node, values, lambda value: self._data(value, values))
        return False


def _reaching(name: cst.Name, values, test) -> bool:
    """Whether every path to ``name``'s read assigned it last a value that passes ``test``."""
    statement = values.statement_of(name)
    bindings = values.bindings_at(name.value, statement) if statement is not None else ()
    assigned = [_assigned(binding, name.value) for binding in bindings]
    return bool(assigned) and all(value is not None and test(value) for value in assigned)


def _assigned(statement: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The value ``statement`` (a statement line) assigns to ``name`` alone, else None."""
    small = statement.body[0] if type(statement) is cst.SimpleStatementLine and len(statement.body) == 1 else None
    if type(small) is cst.Assign and len(small.targets) == 1 and dotted(small.targets[0].target) == name:
        return small.value
    return None


def fresh(ctx: RuleContext, node: cst.BaseExpression, uses: dict[cst.Call, Use], made: bool = False) -> bool:
    """Whether ``node`` (an original expression) is a tensor without a graph: a legacy
    constructor's, a torch factory's, an in-place fill of one, a conversion of one, a loader's
    batch, a name every path here assigned one last. With ``made``, only a tensor made there: a
    conversion may return the tensor it converts, which a name still holds."""
    while type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in _IN_PLACE:
        node = node.func.value
    if type(node) is not cst.Call:
        return not made and (_batch(ctx, node) or type(node) is cst.Name and _reaching(
            node, ctx.facts.values(ctx.scope), lambda value: fresh(ctx, value, uses)))
    use = uses.get(node)
    if use is not None and use.kind == "conversion":
        return not made and fresh(ctx, node.func.value, uses)
    return use is not None or ctx.facts.file.qualname(node.func) in _FACTORIES


def _batch(ctx: RuleContext, node: cst.BaseExpression) -> bool:
    """A batch of a loader (``imgs``, ``batch["A"]``): the target of a loop over one, around here."""
    while type(node) is cst.Subscript:
        node = node.value
    if type(node) is not cst.Name:
        return False
    values = ctx.facts.values(ctx.scope)
    for statement in ctx.open_statements:
        if type(statement) is cst.For and node.value in _bound(statement.target):
            loader = statement.iter
            if type(loader) is cst.Call and dotted(loader.func) == "enumerate" and loader.args:
                loader = loader.args[0].value
            return values.kind(loader) is Kind.LOADER
    return False


def _bound(target: cst.BaseExpression) -> set[str]:
    names = set()
    walk(target, lambda node: names.add(node.value) if type(node) is cst.Name else None)
    return names
