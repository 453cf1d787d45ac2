"""Flow within one scope: its statements walked in order with the names bound where each starts
(their kinds, and the statements that bound them last on every path)."""

from __future__ import annotations

import libcst as cst

from typing import TYPE_CHECKING

from accrewrite.nodes import children, descendants, dotted, node_types, walk
from accrewrite.persistent import PersistentMap, merge
from accrewrite.values.kinds import (
    ADDS, DEVICE_LOADERS, HOST, ITERATE_THROUGH, NAMED_ITEMS, TENSORS, Kind, element_kind, is_initialiser, join,
)
from accrewrite.values.names import read_names, target_names, target_nodes

if TYPE_CHECKING:
    from accrewrite.file_model import FileFacts
    from accrewrite.values.calls import FileValues
    from accrewrite.values.scope import ScopeValues


# A binding's kind; whether it is a literal initialiser (``total = 0``), which gives way to the
# kind of the name's other bindings where they meet; and where every path to here bound it last:
# a statement, a frozenset of them where paths bind it in different statements, None where one
# may bind it nowhere.
_Bound = tuple[Kind, bool, object]
# The names bound where a statement starts: name -> _Bound.
_Env = PersistentMap


class _Ended(PersistentMap):
    """The names bound where a path ends (``return``, ``raise``, ``break``, ``continue``): their
    kinds still meet the other paths', but no path goes on from here to bind them."""

    __slots__ = ()


# The statements that end the path they are on (a call, ``sys.exit()`` too, is not known to).
_ENDS_PATH = frozenset({cst.Return, cst.Raise, cst.Break, cst.Continue})


def _ended(env: _Env) -> _Env:
    return env if type(env) is _Ended else _Ended.of(env)


def _merge(*envs: _Env) -> _Env:
    """Where a loop's paths meet at its head: a name bound on one path only keeps that binding
    (Python has no block scope), and an initialiser from before the loop gives way to what the
    body binds (``total = 0`` before ``total += loss``)."""
    live = [type(env) is not _Ended for env in envs]
    merged = merge(envs, lambda buckets, _: _meet_buckets(buckets, live))
    return merged if any(live) else _ended(merged)


def _meet_buckets(buckets: list[dict | None], live: list[bool]) -> dict[str, _Bound]:
    merged: dict[str, _Bound] = {}
    for bucket in buckets:
        for name, bound in (bucket or {}).items():
            merged[name] = _meet(merged[name], bound) if name in merged else bound
    for name, bound in merged.items():
        origin = _origin(name, buckets, live)
        if origin is not bound[2]:
            merged[name] = (bound[0], bound[1], origin)
    return merged


def _origin(name: str, buckets: list[dict | None], live: list[bool]):
    """Where every path that goes on from the buckets' maps (the ``live`` ones) bound ``name``
    last."""
    found = None
    for index, bucket in enumerate(buckets):
        if not live[index]:
            continue
        bound = bucket.get(name) if bucket is not None else None
        if bound is None or bound[2] is None:
            return None
        origin = bound[2]
        if found is None or found is origin:
            found = origin
        else:
            found = _statements(found) | _statements(origin)
    return found


def _statements(origin) -> frozenset:
    return origin if type(origin) is frozenset else frozenset((origin,))


def _merge_branches(before: _Env, *ends: _Env) -> _Env:
    """After an ``if``/``try``: like ``_merge``, but a literal that a branch assigns itself is
    one of the values, not an initialiser (``value = t if ... else 0.5`` written as a block)."""
    live = [type(env) is not _Ended for env in ends]

    def fresh(buckets: list[dict | None], before_bucket: dict | None) -> dict[str, _Bound]:
        known = before_bucket or {}
        return _meet_buckets([
            {name: (bound[0], False, bound[2]) if bound[1] and bound is not known.get(name) else bound
             for name, bound in (bucket or {}).items()}
            for bucket in buckets
        ], live)

    merged = merge(ends, fresh, before)
    return merged if any(live) else _ended(merged)


def _meet(first: _Bound, second: _Bound) -> _Bound:
    """The kind of a name bound as ``first`` on one path and ``second`` on another (where it is
    bound is ``_origin``'s)."""
    if first == second:
        return first
    (kind, neutral, origin), (other, other_neutral, _) = first, second
    if neutral != other_neutral:
        return first if other_neutral else second
    return join([kind, other]), neutral, origin


class ScopeFlow:
    """The walk of one function's (or module level's) statements, and what it leaves: each
    statement's environment, each name's kinds, where it was bound.

    The statements are walked in order with an environment (name -> kind) that an assignment
    updates, that meets its other branch after an ``if`` and that a loop carries round to its
    head until it settles; each statement keeps the environment it starts with, so ``loss`` is a
    tensor after ``loss = criterion(...)`` even where the same name held a float earlier in the
    script. (``ScopeValues`` adds the kinds of expressions, which the walk asks for what it binds.)
    """

    def __init__(self, file: "FileValues", scope: cst.FunctionDef | None, parent: "ScopeValues | None" = None):
        self.file = file
        self.scope = scope
        self.facts: FileFacts = file.facts
        self._parent = parent
        # The environment the expression being evaluated sees.
        self._env = _Env()
        # Each statement's environment before it runs (small statements and compound headers).
        # (Both by the nodes' ids: a node hashes by a Python method of libcst's, an id in C; the
        # syntax tree outlives them.)
        self._before: dict[int, _Env] = {}
        # Each compound statement's environment after it (where its paths meet again).
        self._after: dict[int, _Env] = {}
        self._statement_of: dict[int, cst.CSTNode] = {}
        # The comprehension whose names each node of one sees (``_note_comprehension``).
        self._comprehension_of: dict[cst.CSTNode, cst.CSTNode] = {}
        # Every kind each name is bound to anywhere in the scope (what nested scopes see).
        self._summary: dict[str, list[tuple[Kind, bool]]] = {}
        # The dotted names bound under each name (``args.lr`` under ``args``), which a binding of
        # the name forgets.
        self._attributes: dict[str, set[str]] = {}
        self._memo: dict[cst.CSTNode, Kind] = {}
        self._final = False
        self._inline = False
        self._local: set[str] = set()
        # Whether the walk used a placeholder for the return of a function still being computed
        # (that function asked this scope what it passes): walked again once it is known.
        self.provisional = False
        # Each name asked of ``reads_reached``: its reads, and whether nested code reads it.
        self._reads_of: dict[str, tuple[list[cst.Name], bool]] = {}
        # Plain ``name = value`` assignments, in order (for loops over such a name).
        self._assignments: dict[str, list[cst.BaseExpression]] = {}
        # The statement whose bindings are being walked (a statement line, a compound header,
        # an except clause; the function for its parameters).
        self._binder: cst.CSTNode | None = scope if scope is not None else file.module

    def walk(self) -> None:
        """Walk the scope's statements (once, when its values are first asked for)."""
        body = self.scope.body if self.scope is not None else self.file.module
        self._local = self.file.local_names(body)
        env = self._bind_params(self.scope) if self.scope is not None else _Env()
        self._block(body.body, env)
        self._final = True

    @classmethod
    def of_comprehension(cls, outer: "ScopeValues", for_in: cst.CompFor) -> "ScopeValues":
        """A comprehension's own names over the enclosing scope's (as its element sees them)."""
        values = cls(outer.file, outer.scope, outer)
        values._inline = True
        env = _Env()
        while for_in is not None:
            values._env = env
            env = values._bind_loop(for_in.target, for_in.iter, env)
            values._local |= target_names(for_in.target)
            for_in = for_in.inner_for_in
        values._env = env
        values._final = True
        return values

    def waits(self) -> None:
        """Mark the scope (not a comprehension's, which belongs to it) as walked with a placeholder."""
        values = self
        while values._inline and values._parent is not None:
            values = values._parent
        values.provisional = True

    # The walk ------------------------------------------------------------------------------------

    def _bind(self, env: _Env, name: str, kind: Kind | None, neutral: bool = False) -> _Env:
        """``env`` with ``name`` bound to a value of ``kind`` by the statement being walked."""
        return self._put(env, name, kind, neutral, self._binder)

    def _refine(self, env: _Env, name: str, kind: Kind) -> _Env:
        """``env`` knowing more of what ``name`` holds (``loss.backward()``: a tensor), bound
        where it was."""
        bound = env.get(name)
        return self._put(env, name, kind, False, bound[2] if bound is not None else None)

    def _put(self, env: _Env, name: str, kind: Kind | None, neutral: bool, origin) -> _Env:
        if kind is None:
            return env
        self._summary.setdefault(name, []).append((kind, neutral))
        prefix, dot, _ = name.rpartition(".")
        while dot:
            self._attributes.setdefault(prefix, set()).add(name)
            prefix, dot, _ = prefix.rpartition(".")
        return env.set(name, (kind, neutral, origin))

    def _bind_params(self, scope: cst.FunctionDef) -> _Env:
        env = _Env()
        owner = self.file.owner_of(scope)
        params = scope.params
        for index, param in enumerate([*params.posonly_params, *params.params, *params.kwonly_params]):
            name = param.name.value
            if index == 0 and owner is not None and name in ("self", "cls"):
                env = self._bind(env, name, self.file.class_kind(owner))
            else:
                env = self._bind(env, name, self.file.param_kind(scope, param))
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                env = self._bind(env, star.name.value, Kind.UNKNOWN)
        return env

    def _block(self, statements, env: _Env) -> _Env:
        ended = False
        for statement in statements:
            env = self._statement(statement, env)
            ended = ended or type(env) is _Ended
        return _ended(env) if ended else env  # (what follows a return is walked, and reached by no path)

    def _body(self, suite, env: _Env) -> _Env:
        if suite is None:
            return env
        if isinstance(suite, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            if isinstance(suite, cst.SimpleStatementSuite):
                return self._smalls(suite, suite.body, env)
            return self._block(suite.body, env)
        if type(suite) is cst.If:
            return self._statement(suite, env)  # elif: its test, body and what else it has
        return self._body(suite.body, env)  # Else, Finally, ExceptHandler: their own suite

    def _smalls(self, line, smalls, env: _Env) -> _Env:
        self._record(line, env)
        self._binder = line
        ended = False
        for small in smalls:
            self._record(small, env)
            env = self._small(small, env)
            ended = ended or type(small) in _ENDS_PATH
        return _ended(env) if ended else env

    def _record(self, statement: cst.CSTNode, env: _Env) -> None:
        """Keep the environment ``statement`` starts with (a loop's last, settled pass wins),
        and note which statement each of its expressions belongs to."""
        key = id(statement)
        if key not in self._before:
            statement_of = self._statement_of
            for child in descendants(statement, _BLOCK_TYPES):
                kind = type(child)
                if kind in _BLOCK_TYPES:
                    continue  # a block nested in the statement: its statements are recorded on their own
                statement_of.setdefault(id(child), statement)
                if kind in _COMPREHENSIONS:
                    self._note_comprehension(child)
        self._before[key] = env

    def _note_comprehension(self, comprehension) -> None:
        """Note the nodes that see a comprehension's own names: its element, conditions and inner
        loops (not its first iterable, which the enclosing scope evaluates). A comprehension
        nested in another is noted after it and keeps its own nodes."""
        first = comprehension.for_in.iter
        noted = self._comprehension_of

        def enter(node):
            if node is first:
                return False
            noted[node] = comprehension
            return True

        for child in children(comprehension):
            walk(child, enter)

    def _statement(self, node: cst.CSTNode, env: _Env) -> _Env:
        if isinstance(node, cst.SimpleStatementLine):
            return self._smalls(node, node.body, env)
        self._record(node, env)
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return env  # calls of the file's functions and classes are answered by what they return
        self._after[id(node)] = after = self._compound(node, env)
        return after

    def _compound(self, node: cst.CSTNode, env: _Env) -> _Env:
        if isinstance(node, cst.If):
            return _merge_branches(env, self._body(node.body, env), self._body(node.orelse, env))
        if isinstance(node, (cst.For, cst.While)):
            return self._loop(node, env)
        if isinstance(node, cst.With):
            inner = env
            self._env = env
            for item in node.items:
                if item.asname is not None:
                    self._binder = node
                    inner = self._assign(item.asname.name, self._entered(item.item), False, None, inner)
            return self._body(node.body, inner)
        if isinstance(node, cst.Try):
            body = self._body(node.body, env)
            ends = [self._body(node.orelse, body)]
            for handler in node.handlers:
                start = _merge(env, body)
                if handler.name is not None:
                    self._binder = handler
                    start = self._bind(start, dotted(handler.name.name) or "", Kind.PYTHON)
                self._record(handler, start)
                ends.append(self._body(handler.body, start))
            merged = _merge_branches(env, *ends)
            return self._body(node.finalbody, merged) if node.finalbody is not None else merged
        # match and other compound statements: each block from the same start
        ends = [env]
        for child in children(node):
            if isinstance(child, (cst.BaseSuite, cst.BaseStatement)) or hasattr(child, "body"):
                if not isinstance(child, cst.BaseExpression):
                    ends.append(self._body(child, env))
        return _merge_branches(env, *ends)

    def _loop(self, node: cst.For | cst.While, env: _Env) -> _Env:
        """A loop's body runs with what the previous iteration left, until that settles."""
        head = env
        for _ in range(4):
            self._record(node, head)
            start = head
            if isinstance(node, cst.For):
                self._env = head
                self._binder = node
                start = self._bind_loop(node.target, node.iter, head)
            end = self._body(node.body, start)
            settled = _merge(env, end)
            if settled == head:
                break
            head = settled
        if node.orelse is None:
            return head
        after = self._body(node.orelse, head)
        # (a ``break`` leaves without the ``else`` clause)
        return _merge_branches(head, after, head) if _breaks(node) else after

    def _small(self, small: cst.BaseSmallStatement, env: _Env) -> _Env:
        self._env = env
        small_type = type(small)
        if small_type is cst.Assign:
            for target in small.targets:
                if isinstance(target.target, cst.Name):
                    value = small.value
                    if wraps_iterable(value):
                        inner = self.assigned_value(value.args[0].value)
                        if isinstance(inner, cst.Call) and (dotted(inner.func) in ("enumerate", "zip")
                                                            or wraps_iterable(inner)):
                            value = inner  # pbar = tqdm(pbar, total=n) after pbar = enumerate(loader)
                    self._assignments.setdefault(target.target.value, []).append(value)
            kind = self._eval(small.value)
            for target in small.targets:
                env = self._assign(target.target, kind, is_initialiser(small.value), small.value, env)
        elif small_type is cst.AnnAssign:
            annotated = self.file.annotation_kind(small.annotation.annotation)
            if small.value is not None and annotated is Kind.UNKNOWN:
                env = self._assign(small.target, self._eval(small.value), is_initialiser(small.value), small.value, env)
            else:
                env = self._assign(small.target, annotated, False, None, env)
        elif small_type is cst.AugAssign:
            augmented = cst.BinaryOperation(left=small.target, operator=_binary_of(small.operator), right=small.value)
            env = self._assign(small.target, self._eval(augmented), False, None, env)
        elif small_type is cst.Expr and type(small.value) is cst.Call:
            call = small.value
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                receiver = call.func.value
                if isinstance(receiver, cst.Call) and receiver.args:  # scaler.scale(loss).backward()
                    receiver = receiver.args[0].value
                elif call.args and call.args[0].keyword is None:  # accelerator.backward(loss)
                    receiver = call.args[0].value
                name = dotted(receiver)
                if name:
                    env = self._refine(env, name, Kind.TENSOR)
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value in ADDS and self._any_tensor_argument(call):
                # ``res.append(correct_k.mul_(100.0 / batch_size))``: the list holds a tensor, like
                # ``out[k] = t``
                name = dotted(call.func.value)
                if name and self._eval(call.func.value) in HOST | {Kind.UNKNOWN}:
                    env = self._refine(env, name, Kind.HOLDER)
        elif small_type is cst.Del:
            for name in target_names(small.target):
                bound = env.get(name)
                if bound is not None:
                    env = env.set(name, (bound[0], bound[1], None))  # what it held, bound on no path now
        elif (small_type is cst.Import or small_type is cst.ImportFrom) and type(small.names) is not cst.ImportStar:
            for alias in small.names:
                name = dotted(alias.asname.name if alias.asname is not None else alias.name)
                if name:
                    env = self._bind(env, name.split(".")[0], Kind.UNKNOWN)
        return env

    def _assign(self, target: cst.CSTNode, kind: Kind, neutral: bool, value, env: _Env):
        """``env`` after binding ``target`` (a name, attribute, subscript or unpacking) to a value
        of ``kind`` (``value``, when known, unpacks element by element)."""
        if isinstance(target, (cst.Tuple, cst.List)):
            elements = [e.value.value if isinstance(e.value, cst.StarredElement) else e.value for e in target.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements) and not any(
                isinstance(e.value, cst.StarredElement) for e in value.elements
            ):
                kinds = [(self._eval(e.value), is_initialiser(e.value), e.value) for e in value.elements]
            else:
                returned = self._returned_parts(value, len(elements))
                kinds = [(part, False, None) for part in returned] if returned else [(element_kind(kind), False, None)] * len(elements)
            for element, (part, part_neutral, part_value) in zip(elements, kinds):
                env = self._assign(element, part, part_neutral, part_value, env)
            return env
        if isinstance(target, cst.StarredElement):
            return self._assign(target.value, kind, neutral, None, env)
        if isinstance(target, cst.Subscript):
            # ``out[k] = t`` puts a tensor into a container; a Python value put into a tensor
            # (``losses[k] = loss.item()``) leaves it a tensor.
            name = dotted(target.value)
            if name and kind in TENSORS:
                env = self._refine(env, name, Kind.TENSOR if env.get(name, (None,))[0] in (Kind.TENSOR, Kind.MASK) else Kind.HOLDER)
            return env
        name = dotted(target)
        if name is None:
            return env
        if name.startswith("self.") and name.count(".") == 1 and self.scope is not None:
            self.file.note_attribute(self.scope, name[5:], target, kind, neutral)
        for attribute in self._attributes.get(name, ()):
            env = env.without(attribute)  # ``args = ...`` forgets what was known of ``args.lr``
        return self._bind(env, name, kind, neutral)

    def _returned_parts(self, value, count: int) -> list[Kind] | None:
        """Each part's kind where ``value`` calls a function of the file that returns ``count``
        values (``perplexity, eval_loss = evaluate(...)``: a float and a tensor)."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        name = value.func.value
        defined = self.file.defined.get(name)
        if not isinstance(defined, cst.FunctionDef) or self.name_kind(name) is not Kind.UNKNOWN:
            return None
        return self.file.returned_parts(defined, count)

    def _bind_loop(self, target: cst.BaseExpression, iterable: cst.BaseExpression, env: _Env):
        """``env`` after ``for target in iterable``: ``enumerate``, ``zip``, ``.items()`` and
        ``.named_parameters()`` bind element by element (the counter of ``enumerate(loader)``
        is an int, not a batch), also through a name assigned one of them (``pbar =
        tqdm(enumerate(loader))``)."""
        source = self.assigned_value(iterable)
        if isinstance(source, cst.Call) and isinstance(target, (cst.Tuple, cst.List)):
            func = source.func
            name = dotted(func)
            method = func.attr.value if isinstance(func, cst.Attribute) else None
            args = [arg.value for arg in source.args if arg.keyword is None and not arg.star]
            elements = [element.value for element in target.elements]
            if name == "enumerate" and args and len(elements) == 2:
                env = self._assign(elements[0], Kind.INT, False, None, env)
                return self._bind_loop(elements[1], args[0], env)
            if name == "zip" and len(args) == len(elements):
                for element, arg in zip(elements, args):
                    env = self._bind_loop(element, arg, env)
                return env
            if method in NAMED_ITEMS and len(elements) == 2:
                env = self._assign(elements[0], Kind.STR if method != "items" else Kind.PYTHON, False, None, env)
                return self._assign(elements[1], self._item_kind(source), False, None, env)
            if wraps_iterable(source):
                return self._bind_loop(target, args[0], env)
            # (a loader rebound to its device loader, ``loader = MpDeviceLoader(loader, d)``, ends here)
            if self.facts.qualname(func) in DEVICE_LOADERS and args and self.assigned_value(args[0]) is not source:
                return self._bind_loop(target, args[0], env)
        return self._assign(target, self._element_of(iterable), False, None, env)

    def assigned_value(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """For a name assigned before (``pbar = tqdm(enumerate(loader))``), its latest value."""
        if isinstance(node, cst.Name):
            found = self._assignments.get(node.value)
            if found:
                return found[-1]
        return node

    def _item_kind(self, call: cst.Call) -> Kind:
        """The values of ``d.items()``, ``model.named_parameters()``, ``model.named_modules()``."""
        method = call.func.attr.value
        if method in ("named_modules", "named_children"):
            return Kind.MODEL
        if method in ("named_parameters", "named_buffers"):
            return Kind.TENSOR
        owner = self._eval(call.func.value)
        return Kind.TENSOR if owner in TENSORS else self._container_kind([owner])

    # Names -------------------------------------------------------------------------------------

    def name_kind(self, name: str) -> Kind:
        """The kind of a (dotted) name where the expression being evaluated is."""
        bound = self._env.get(name)
        if bound is not None:
            return bound[0]
        root = name.split(".")[0]
        if root in self._local or self._parent is None:
            return Kind.UNKNOWN
        if self._inline:
            return self._parent.name_kind(name)  # a comprehension runs where it is written
        return self._parent.summary_kind(name)

    def summary_kind(self, name: str) -> Kind:
        """A name's kind anywhere in this scope (as a nested function, run later, sees it)."""
        bound = self._summary.get(name)
        if bound:
            plain = [kind for kind, neutral in bound if not neutral]
            return join(plain) if plain else join(kind for kind, _ in bound)
        bound = self._env.get(name)
        if bound is not None:
            return bound[0]
        root = name.split(".")[0]
        if root not in self._local and self._parent is not None:
            return self._parent.summary_kind(name)
        return Kind.UNKNOWN

    # Questions about bindings ---------------------------------------------------------------

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The small statement (or compound statement's header) of this scope that holds the
        expression ``node``."""
        return self._statement_of.get(id(node))

    def bindings_at(self, name: str, statement: cst.CSTNode) -> frozenset[cst.CSTNode]:
        """The statements whose binding of ``name`` the paths to ``statement`` (a statement line,
        small statement or compound header of this scope) come through last: none where a path
        binds it nowhere (statement lines and compound headers: the ``.statement`` of the
        analysis's ``Binding``)."""
        return _bindings_in(self._before.get(id(statement)), name)

    def bindings_after(self, name: str, statement: cst.CSTNode) -> frozenset[cst.CSTNode]:
        """The same where the paths that go on past the compound ``statement`` meet again."""
        after = self._after.get(id(statement))
        return frozenset() if type(after) is _Ended else _bindings_in(after, name)

    def passed_string(self, name: str, statement: cst.CSTNode) -> bool:
        """Whether ``name`` may hold at ``statement`` what a caller passed for a parameter
        annotated ``str`` (``def main(device: str)``, before the function makes a device of it)."""
        scope = self.scope
        if scope is None or scope not in self.bindings_at(name, statement):
            return False
        params = scope.params
        param = next((p for p in (*params.posonly_params, *params.params, *params.kwonly_params)
                      if p.name.value == name), None)
        return param is not None and param.annotation is not None and \
            self.file.annotation_kind(param.annotation.annotation) is Kind.STR

    def reads_reached(self, name: str, binding: cst.CSTNode) -> list[cst.Name] | None:
        """The reads of ``name`` in this scope that may see the value ``binding`` (a statement
        line) bound it to: every read that some path reaches through ``binding``, or through no
        binding this walk knows. None where a function, lambda or class in the scope reads it
        (it runs at a time this walk does not know) or the scope declares it ``global``."""
        found, nested = self._reads_of.get(name) or self._find_reads(name)
        if nested:
            return None
        reached = []
        for read in found:
            statement = self.statement_of(read)
            if statement is None:
                return None
            bindings = self.bindings_at(name, statement)
            if not bindings or binding in bindings:
                reached.append(read)
        return reached

    def _find_reads(self, name: str) -> tuple[list[cst.Name], bool]:
        """The reads of ``name`` in this scope's own code, and whether other code may read it
        (nested code that names it, or a ``global`` or ``nonlocal`` declaration of it)."""
        body = self.scope.body if self.scope is not None else self.file.module
        found: list[cst.Name] = []
        labels: set[int] = set()  # attribute names, keywords and assignment targets: not reads
        nested = False

        def enter(node):
            nonlocal nested
            kind = type(node)
            if kind in _NESTED_CODE:
                nested = nested or name in read_names(node)
                return False
            if kind is cst.Global or kind is cst.Nonlocal:  # other functions read it too
                nested = nested or any(item.name.value == name for item in node.names)
                return False
            if kind is cst.Name:
                if node.value == name and id(node) not in labels:
                    found.append(node)
                return False
            if kind is cst.Attribute:
                labels.add(id(node.attr))
            elif kind is cst.Arg and node.keyword is not None:
                labels.add(id(node.keyword))
            elif kind in _BINDING_TARGETS:
                labels.update(id(target) for target in target_nodes(node.target))
            return True

        walk(body, enter)
        self._reads_of[name] = found, nested
        return found, nested

    def binds(self, name: str) -> bool:
        """Whether this scope binds ``name`` itself (an assignment, a parameter, a loop target)."""
        return name in self._local or self.scope is not None and name in self.file.functions[self.scope].params

_COMPREHENSIONS = node_types(cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
# A function or lambda: defining it runs none of its code (a class's body runs).
DEFINED_CODE = frozenset({cst.Lambda, cst.FunctionDef})
# A statement or block nested in a compound statement (not part of its header).
_BLOCK_TYPES = node_types(cst.BaseSuite, cst.BaseStatement, cst.BaseSmallStatement, cst.Else, cst.Finally,
                          cst.ExceptHandler)


# Code that runs when it is called, not where it is written.
_NESTED_CODE = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})
# The nodes whose ``target`` binds names (an augmented assignment's reads its name too).
_BINDING_TARGETS = frozenset({cst.AssignTarget, cst.AnnAssign, cst.For, cst.CompFor})


def _bindings_in(env: _Env | None, name: str) -> frozenset[cst.CSTNode]:
    bound = env.get(name) if env is not None else None
    return frozenset() if bound is None or bound[2] is None else _statements(bound[2])


def _breaks(loop: cst.For | cst.While) -> bool:
    """Whether a ``break`` of ``loop`` itself (not of a loop in it) leaves it."""
    return any(type(node) is cst.Break for node in descendants(loop.body, _OWN_BREAKS))


# What a ``break`` inside belongs to instead of the loop around it.
_OWN_BREAKS = frozenset({cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda})


def wraps_iterable(node: cst.CSTNode) -> bool:
    """``tqdm(it, ...)``, ``iter(it)``, ``list(it)``: iterating it gives ``it``'s elements."""
    if not isinstance(node, cst.Call) or not node.args or node.args[0].keyword is not None:
        return False
    return (dotted(node.func) or "").split(".")[-1].lower() in ITERATE_THROUGH


def _binary_of(operator: cst.BaseAugOp) -> cst.BaseBinaryOp:
    name = type(operator).__name__.replace("Assign", "")
    return getattr(cst, name)()
