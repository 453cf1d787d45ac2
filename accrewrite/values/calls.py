"""Calls across the functions of a file: what each function's callers pass, what it returns, the
kinds of its parameters and of its class's attributes, the processes it spawns; and each
scope's values, computed when first asked."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accrewrite.file_model import DefinedFunction, FileFacts
from accrewrite.nodes import call_arg, descendants, dotted, string_value
from accrewrite.targets import spelled_callees
from accrewrite.values.kinds import (
    ANNOTATION_KINDS, JOINING, MODEL_ANNOTATIONS, PLAIN_ANNOTATIONS, SYNC_BUILTINS, SYNC_METHODS, TENSORS, Kind, join,
    is_initialiser, literal_kind,
)
from accrewrite.values.options import CommandLineOptions
from accrewrite.values.scope import ScopeValues

# torch.multiprocessing.spawn, and the targets' spellings of it (a migrated file still spawns).
SPAWN_NAMES = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn", *spelled_callees("spawn")})
_NESTED_SCOPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})


def _moves(call: cst.Call) -> bool:
    """``x.to(...)`` or ``x.cuda()``, but for ``x.to("cpu")`` (a course's "keep the model on
    the CPU")."""
    func = call.func
    if type(func) is not cst.Attribute or func.attr.value not in ("to", "cuda"):
        return False
    return func.attr.value == "cuda" or not call.args or string_value(call.args[0].value) != "cpu"


@dataclass(frozen=True, eq=False)
class Spawn:
    """``mp.spawn(fn, args=(...), nprocs=n)``: ``fn(index, *args)`` in ``n`` new processes."""

    call: cst.Call
    scope: cst.FunctionDef | None
    # The functions of the file it runs: ``fn``, or what the callers of the function that holds
    # the call pass as ``fn`` (the DDP tutorial's ``run_demo(demo_fn, world_size)``).
    workers: tuple[cst.FunctionDef, ...]
    # Where the workers receive the number of processes: (position of a parameter, the
    # attributes read from it), for an argument that is ``nprocs`` itself (``args=(world_size,),
    # nprocs=world_size``: ``(1, "")``) or holds it (``args=(args,), nprocs=args.nprocs``:
    # ``(1, ".nprocs")``).
    counted: tuple[tuple[int, str], ...]


class FileValues:
    """The per-file state of the analysis: functions and classes of the file, what their
    callers pass, what they return, and each scope's values (computed when first asked)."""

    def __init__(self, facts: FileFacts, options: CommandLineOptions) -> None:
        self.module = facts.module
        self.facts = facts
        self.options = options
        definitions = facts.definitions
        self.functions, self.classes, self.defined = definitions.functions, definitions.classes, definitions.defined
        self._methods, self._nested = definitions.methods, definitions.nested
        self._scopes: dict[cst.FunctionDef | None, ScopeValues] = {}
        self._returning: set = set()
        self._returns: dict[cst.FunctionDef, Kind] = {}
        self._params: dict[tuple, Kind] = {}
        self._attributes: dict[cst.ClassDef, dict[str, list]] = {}
        self._attribute_kinds: dict[tuple, Kind] = {}
        self._calls: dict[cst.CSTNode, list[tuple[cst.Call, cst.FunctionDef | None, int]]] | None = None
        self._spawns: list[Spawn] | None = None
        # How many scope walks are under way (``of`` re-walks provisional scopes at none).
        self._walking = 0
        # Per function, what ``_joined`` gives (a provisional scope's walk runs again, and asks).
        self._joined_names: dict[cst.FunctionDef, frozenset[str]] = {}
        # The names a ``.to()``/``.cuda()`` may move (``kept_on_host``), found when first asked.
        self._handed: frozenset[str] | None = None

    def forget(self) -> None:
        """Drop the scopes' values, which refer back to this analysis."""
        self._scopes.clear()

    def local_names(self, body: cst.CSTNode) -> frozenset[str]:
        """The names a function's body (or the module) binds, which are local to it throughout."""
        return self.facts.local_names[body]

    # Scopes ------------------------------------------------------------------------------------

    def of(self, scope: cst.FunctionDef | None) -> ScopeValues:
        """A scope's values; while they are being computed (a function called from the scope
        asks what its callers pass), what the walk has seen so far."""
        found = self._scopes.get(scope)
        if found is None:
            self._walking += 1
            try:
                parent = self.parent_values(scope)
                found = self._scopes.get(scope)  # the parent's walk may have asked for this scope
                if found is None:
                    found = self._scopes[scope] = ScopeValues(self, scope, parent)
                    found.walk()
            finally:
                self._walking -= 1
        if found.provisional and not self._walking:
            # Walked while a function it calls was being computed (``test()`` asked this scope what
            # it passes while the scope bound ``test()``'s result): that return is known now, so
            # the provisional scopes are walked again (each round knows more returns: it ends).
            for stale in [key for key, values in self._scopes.items() if values.provisional]:
                del self._scopes[stale]
            found = self.of(scope)
        return found

    def parent_values(self, scope: cst.FunctionDef | None) -> ScopeValues | None:
        if scope is None:
            return None
        function = self.functions.get(scope)
        return self.of(function.parent if function is not None else None)

    def owner_of(self, scope: cst.FunctionDef | None) -> cst.ClassDef | None:
        function = self.functions.get(scope)
        return function.owner if function is not None else None

    def method(self, owner: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        found = self._methods.get(owner, {}).get(name)
        if found is not None:
            return found
        for base in owner.bases:
            parent = self.classes.get(dotted(base.value) or "")
            if parent is not None and parent is not owner:
                found = self.method(parent, name)
                if found is not None:
                    return found
        return None

    def class_kind(self, owner: cst.ClassDef) -> Kind:
        return Kind.MODEL if self._is_module(owner) else Kind.UNKNOWN

    def _is_module(self, owner: cst.ClassDef, seen=()) -> bool:
        for base in owner.bases:
            name = dotted(base.value) or ""
            qualified = self.facts.qualname(base.value) or ""
            if qualified in MODEL_ANNOTATIONS or qualified.startswith("torch.nn.") or name in ("nn.Module", "Module"):
                return True
            parent = self.classes.get(name)
            if parent is not None and parent not in seen and self._is_module(parent, (*seen, owner)):
                return True
        return False

    # Calls -------------------------------------------------------------------------------------

    def call_kind(self, defined: cst.CSTNode, call: cst.Call, caller: ScopeValues) -> Kind:
        """What calling a function or class of this file gives."""
        if isinstance(defined, cst.ClassDef):
            return self.class_kind(defined)
        if defined in self._returning and defined not in self._returns:
            caller.waits()
            return Kind.UNKNOWN
        returned = self.return_kind(defined)
        if returned is Kind.UNKNOWN and caller._any_tensor_argument(call):
            return Kind.TENSOR
        return returned

    def return_kind(self, function: cst.FunctionDef) -> Kind:
        if function in self._returns:
            return self._returns[function]
        if function in self._returning:
            return Kind.UNKNOWN
        self._returning.add(function)
        try:
            values = self.of(function)
            returned, yielded = _returns_and_yields(function)
            if yielded:
                kinds = [values.kind(node) for node in yielded]
                kind = Kind.LOADER if any(k in TENSORS for k in kinds) else Kind.UNKNOWN
            elif not returned:
                kind = Kind.NONE
            else:
                kinds = [values.kind(node) if node is not None else Kind.NONE for node in returned]
                plain = [k for k in kinds if k is not Kind.NONE] or kinds
                kind = join(plain)
        finally:
            self._returning.discard(function)
        self._returns[function] = kind
        return kind

    def returned_parts(self, function: cst.FunctionDef, count: int) -> list[Kind] | None:
        """The kind of each of the ``count`` values that every return of ``function`` gives as a
        tuple, or None."""
        returned, yielded = _returns_and_yields(function)
        if yielded or not returned or function in self._returning:
            return None
        if not all(isinstance(r, cst.Tuple) and len(r.elements) == count for r in returned):
            return None
        if any(isinstance(e, cst.StarredElement) for r in returned for e in r.elements):
            return None
        self._returning.add(function)
        try:
            values = self.of(function)
            return [join([values.kind(r.elements[i].value) for r in returned]) for i in range(count)]
        finally:
            self._returning.discard(function)

    def returned_reads(self, name: str) -> frozenset[str]:
        """The parameters that the file's function ``name`` returns read on the host (apex's
        ``def to_python_float(t): return t.float().item()``): a call passing a tensor there waits
        for it."""
        if not isinstance(self.defined.get(name), cst.FunctionDef):
            return frozenset()
        return self.facts.returned_reads.get(name, frozenset())

    def arguments(self, call: cst.Call, name: str) -> dict[str, cst.BaseExpression]:
        """Parameter name -> argument of a call of the file's function ``name``."""
        info = self.functions.get(self.defined.get(name))
        return _passing(info, call, 0) if info is not None else {}

    def param_kind(self, scope: cst.FunctionDef, param: cst.Param) -> Kind:
        """A parameter's kind: its annotation's, else what the file's callers pass, else its
        default's."""
        key = (scope, param.name.value)
        if key in self._params:
            return self._params[key]
        self._params[key] = Kind.UNKNOWN  # while computing (recursion)
        kind = Kind.UNKNOWN
        if param.annotation is not None:
            kind = self.annotation_kind(param.annotation.annotation)
        if kind is Kind.UNKNOWN:
            passed = self._passed(scope, param)
            if param.default is not None and not is_initialiser(param.default):
                passed.append(literal_kind(param.default))
            kind = join(passed) if passed else Kind.UNKNOWN
        if kind is Kind.UNKNOWN and param.name.value in self._joined(scope):
            kind = Kind.TENSOR  # torch.cat((idx, idx_next)) takes tensors only
        if kind is Kind.UNKNOWN and self._spawned_index(scope, param):
            kind = Kind.INT  # mp.spawn(fn, ...) calls fn(index, *args)
        self._params[key] = kind
        return kind

    def _spawned_index(self, scope: cst.FunctionDef, param: cst.Param) -> bool:
        """Whether ``param`` is the first parameter of a function the file spawns processes of."""
        params = scope.params
        first = (*params.posonly_params, *params.params)[:1]
        return bool(first) and first[0] is param and any(scope in spawn.workers for spawn in self.spawns())

    def _joined(self, scope: cst.FunctionDef) -> frozenset[str]:
        """The names that ``scope`` concatenates or stacks (``torch.cat((idx, idx_next), dim=1)``):
        tensors, whatever its callers pass."""
        known = self._joined_names.get(scope)
        if known is not None:
            return known
        found: set[str] = set()
        for node in descendants(scope.body, _NESTED_SCOPES):
            if type(node) is cst.Call and node.args and self.facts.qualname(node.func) in JOINING:
                parts = node.args[0].value
                if isinstance(parts, (cst.Tuple, cst.List)):
                    found.update(e.value.value for e in parts.elements if isinstance(e.value, cst.Name))
        found = self._joined_names[scope] = frozenset(found)
        return found

    def _passed(self, scope: cst.FunctionDef, param: cst.Param) -> list[Kind]:
        kinds = []
        for caller, _, arguments in self.passed(scope):
            if param.name.value in arguments:
                kinds.append(self.of(caller).kind(arguments[param.name.value]))
        return kinds

    def passed(self, function: cst.FunctionDef) -> list[tuple[cst.FunctionDef | None, cst.Call, dict]]:
        """What each call of ``function`` in this file passes: (calling scope, the call,
        parameter name -> argument)."""
        info = self.functions.get(function)
        if info is None:
            return []
        return [(caller, call, _passing(info, call, shift)) for call, caller, shift in self.calls_of(function)]

    def callee(self, call: cst.Call, scope) -> tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None:
        """The function of this file that ``call`` (in ``scope``) runs, and parameter name ->
        argument; None for a call of anything else."""
        function, shift = self._target(call, scope)
        info = self.functions.get(function)
        return (function, _passing(info, call, shift)) if info is not None else None

    def calls_of(self, function: cst.FunctionDef) -> list[tuple[cst.Call, cst.FunctionDef | None, int]]:
        """The calls of ``function`` in this file: (call, calling scope, how many leading
        parameters the call does not pass: 1 for ``self``)."""
        if self._calls is None:
            self._calls = {}
            for call, scope in self.facts.calls:
                self._note_call(call, scope)
        return self._calls.get(function, [])

    def kept_on_host(self, name: str) -> bool:
        """Whether the module ``name`` stays on the host where the file builds it (a course's
        first model, trained on the CPU before others are placed): each assignment of it builds
        one (no ``.to()``, no ``device=``, no other model inside), no ``.to()``/``.cuda()`` is
        called on it, and it is passed only to functions of this file that neither move nor
        pass on that parameter (a wrapper or a helper of another file may move it)."""
        if self._handed is None:
            self._handed = self._moved_or_passed()
        built = self.facts.assignments.get(name)
        return bool(built) and name not in self._handed and all(self._builds_on_host(value) for value in built)

    def _builds_on_host(self, value: cst.BaseExpression) -> bool:
        if type(value) is not cst.Call:
            return False
        for node in (value, *descendants(value, _NESTED_SCOPES)):
            if type(node) is cst.Arg and node.keyword is not None and node.keyword.value == "device":
                return False
            if type(node) is cst.Call and _moves(node):
                return False
            if type(node) is cst.Name and node.value in self.facts.models:
                return False
        return True

    def _moved_or_passed(self) -> frozenset[str]:
        """The names of the file that a ``.to()``/``.cuda()`` may move: in place, or in a
        function they are passed to (or in anything of another file)."""
        moved: set[str] = set()
        handled: dict[cst.FunctionDef | None, set[str]] = {}  # per scope: names moved or passed on
        passing: list[tuple[cst.Call, cst.FunctionDef | None, str]] = []
        for call, scope in self.facts.calls:
            if _moves(call):
                receiver = call.func.value
                while type(receiver) in (cst.Attribute, cst.Subscript):
                    receiver = receiver.value
                if type(receiver) is cst.Name:
                    moved.add(receiver.value)
                    handled.setdefault(scope, set()).add(receiver.value)
            for arg in call.args:
                if type(arg.value) is cst.Name:
                    handled.setdefault(scope, set()).add(arg.value.value)
                    passing.append((call, scope, arg.value))
        for call, scope, name in passing:
            found = self.callee(call, scope)
            param = None if found is None else next((p for p, value in found[1].items() if value is name), None)
            if param is None or param in handled.get(found[0], ()):
                moved.add(name.value)
        # Another name for the module (``model = model_0``, ``models = [model_0]``) may move it.
        for values in self.facts.assignments.values():
            for value in values:
                parts = [e.value for e in value.elements] if type(value) in (cst.Tuple, cst.List, cst.Set) else [value]
                moved.update(part.value for part in parts if type(part) is cst.Name)
        return frozenset(moved)

    def _note_call(self, call: cst.Call, scope) -> None:
        target, shift = self._target(call, scope)
        if target is not None:
            self._calls.setdefault(target, []).append((call, scope, shift))

    def _target(self, call: cst.Call, scope) -> tuple[cst.FunctionDef | None, int]:
        """The function of this file that ``call`` runs (None if none), and how many leading
        parameters the call does not pass (1 for ``self``)."""
        func = call.func
        target, shift = None, 0
        kind = type(func)
        if kind is cst.Name:
            defined = self._visible(scope, func.value)
            if type(defined) is cst.FunctionDef:
                target = defined
            elif type(defined) is cst.ClassDef:
                target, shift = self.method(defined, "__init__"), 1
        elif kind is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self":
            owner = self.owner_of(scope)
            if owner is not None:
                target, shift = self.method(owner, func.attr.value), 1
        return target, shift

    def _visible(self, scope, name: str) -> cst.CSTNode | None:
        """The function or class ``name`` calls from ``scope``: one defined in it or in a
        function around it, else one of module level."""
        while scope is not None:
            nested = self._nested.get((scope, name))
            if nested is not None:
                return nested
            function = self.functions.get(scope)
            scope = function.parent if function is not None else None
        return self.defined.get(name)

    # self.attributes ---------------------------------------------------------------------------

    def note_attribute(self, scope, attribute: str, target: cst.CSTNode, kind: Kind, neutral: bool) -> None:
        """Record that ``target`` (``self.attribute = ...`` in method ``scope``) binds a value of
        ``kind``; a loop's later, settled pass over the same target replaces the earlier one."""
        owner = self.owner_of(scope)
        if owner is not None:
            self._attributes.setdefault(owner, {}).setdefault(attribute, {})[target] = (kind, neutral)

    def attribute_kind(self, owner: cst.ClassDef, attribute: str) -> Kind:
        """The kind of ``self.attribute`` in ``owner``'s methods: the join of what every method
        assigns it."""
        key = (owner, attribute)
        if key in self._attribute_kinds:
            return self._attribute_kinds[key]
        self._attribute_kinds[key] = Kind.UNKNOWN  # while computing
        for method in self._methods.get(owner, {}).values():
            self.of(method)  # walking a method records its self.attribute bindings
        plain, neutral = [], []
        for kind, is_neutral in self._attributes.get(owner, {}).get(attribute, {}).values():
            (neutral if is_neutral else plain).append(kind)
        kind = join(plain) if plain else join(neutral)
        self._attribute_kinds[key] = kind
        return kind

    # Spawned processes -------------------------------------------------------------------------

    def spawns(self) -> list[Spawn]:
        """The file's ``torch.multiprocessing.spawn`` calls (or a target's spelling of one)."""
        if self._spawns is None:
            self._spawns = [self._spawn(call, scope) for call, scope in self.facts.calls
                            if self.facts.qualname(call.func) in SPAWN_NAMES] if self.facts.called & SPAWN_NAMES else []
        return self._spawns

    def _spawn(self, call: cst.Call, scope: cst.FunctionDef | None) -> Spawn:
        fn, args, nprocs = call_arg(call, 0, "fn"), call_arg(call, 1, "args"), call_arg(call, 2, "nprocs")
        named = [fn.value] if fn is not None else []
        if scope is not None and named and isinstance(named[0], cst.Name) and named[0].value not in self.defined:
            named = [arguments[named[0].value] for _, _, arguments in self.passed(scope) if named[0].value in arguments]
        workers = tuple(self.defined[n.value] for n in named
                        if isinstance(n, cst.Name) and isinstance(self.defined.get(n.value), cst.FunctionDef))
        counted = ()
        if args is not None and nprocs is not None and isinstance(args.value, (cst.Tuple, cst.List)):
            count = self.module.code_for_node(nprocs.value)
            for position, element in enumerate(args.value.elements):
                passed = self.module.code_for_node(element.value)
                if count == passed or count.startswith(passed + ".") and dotted(element.value) is not None:
                    counted += ((position + 1, count[len(passed):]),)
        return Spawn(call, scope, workers, counted)

    # Annotations ------------------------------------------------------------------

    def annotation_kind(self, annotation: cst.BaseExpression) -> Kind:
        name = dotted(annotation)
        if name in PLAIN_ANNOTATIONS:
            return PLAIN_ANNOTATIONS[name]
        return ANNOTATION_KINDS.get(self.facts.qualname(annotation) or "", Kind.UNKNOWN)

def _passing(info: DefinedFunction, call: cst.Call, shift: int) -> dict[str, cst.BaseExpression]:
    """Parameter name -> argument of ``call`` of a function whose first ``shift`` parameters
    the call does not pass."""
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    arguments = dict(zip(info.params[shift:], positional))
    arguments.update((a.keyword.value, a.value) for a in call.args if a.keyword is not None)
    return arguments


def returned_read(statement: cst.Return, params: set[str]) -> frozenset[str]:
    """The ``params`` whose value a return statement reads on the host: ``t`` of
    ``return t.float().item()`` or ``return float(t[0])``."""
    found = set()
    for node in descendants(statement):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in SYNC_METHODS:
            read = func.value
        elif isinstance(func, cst.Name) and func.value in SYNC_BUILTINS and node.args:
            read = node.args[0].value
        else:
            continue
        while isinstance(read, (cst.Attribute, cst.Subscript, cst.Call)):
            read = read.func if isinstance(read, cst.Call) else read.value
        if isinstance(read, cst.Name) and read.value in params:
            found.add(read.value)
    return frozenset(found)


def _returns_and_yields(function: cst.FunctionDef) -> tuple[list, list]:
    """The values of ``function``'s own return and yield statements (None for a bare return)."""
    returned, yielded = [], []
    for node in descendants(function.body, _NESTED_SCOPES):
        kind = type(node)
        if kind is cst.Return:
            returned.append(node.value)
        elif kind is cst.Yield:
            value = node.value
            if isinstance(value, cst.From):
                value = value.item
            yielded.append(value if value is not None else cst.Name("None"))
    return returned, yielded
