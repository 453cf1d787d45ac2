"""Definite assignment over Python's ``ast``: each read of a scope's own name on a path where no
binding of it has run (a function's UnboundLocalError, a NameError at module level), for the net
under every migration (``accrewrite.unbound``).

pyflakes does not follow paths: for it, a name assigned anywhere in a function is bound
everywhere after. Here each scope is walked once, in order, with the set of names bound on every
path to the point walked: both arms of an ``if`` must bind a name for it to be bound after; a
loop's body may run no time (``while True:`` leaves only by its ``break``s), an ``except``
handler may start before any line of its ``try`` ran, and ``return``, ``raise``, ``break`` and
``continue`` end the path they are on. A test repeated (``if args.resume:`` twice, its names not
bound again between, no call in it) takes the branch it took before: what the first one's body
bound is bound in the second's, and what its ``else`` bound in the second's ``else`` (or in the
body of its negation, ``if not args.resume:``), where the first ``if`` is on every path to the
second (an earlier statement of a block that holds it); a call of a function named ``steady`` (the guard's
``enabled()``) gives the same answer each time. ``del`` and the end of an ``except E as e:`` handler
unbind, ``with ... as``, ``match`` captures and ``:=`` bind, and a comprehension's loop names are
its own. A name declared ``global`` or ``nonlocal`` is not the scope's; at module level and in a
class body a name the scope binds that is also a builtin (or, in a class body, a module-level
name) falls back to that, and a scope with a star import or an ``exec`` call may bind anything,
so none of those is reported. A call never ends a path (``sys.exit()`` included), a ``with``
block runs to its end, a generator expression is read where it is written, and a function reads
the names around it when it runs, which is not followed.

The set is an int, a bit per name in the order the walk meets them; ``-1`` (every bit) is where no
path goes, so that meeting paths is ``&``.
"""

from __future__ import annotations

import ast
import builtins

# (scope, name, line): the scope as dotted names of the functions and classes around the read,
# ``<module>`` at module level.
Read = tuple[str, str, int]

_BUILTINS = frozenset(dir(builtins))
_NOWHERE = -1  # no path reaches here: every name counts as bound, and ``&`` with it is a no-op
# Fields of expression nodes that hold no expression to walk.
_NOT_WALKED = frozenset({"ctx", "op", "ops", "type_comment", "kind", "conversion", "is_async"})
_fields: dict[type, tuple[str, ...]] = {}
# What makes a test's value differ from one evaluation to the next.
_CHANGING = frozenset({ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda, ast.ListComp,
                       ast.SetComp, ast.DictComp, ast.GeneratorExp})


def unbound_on_a_path(tree: ast.Module, steady: frozenset[str] = frozenset()) -> list[Read]:
    """Each read of a name on a path where its scope has not bound it, in the order walked;
    ``steady``: the functions whose call without arguments a test may repeat."""
    module = _Scope("<module>", "module", steady)
    module.block(tree.body, 0)
    found: list[Read] = []
    for scope in module.scopes():
        found += scope.findings(module)
    return found


class _Scope:
    """One function, class body or module level, walked once (a loop's body again until the
    names bound at its head settle); the functions, lambdas and classes in it are scopes of
    their own, walked where the walk meets them."""

    def __init__(self, path: str, kind: str, steady: frozenset[str]):
        self.path = path
        self.kind = kind  # "module", "class" or "function"
        self.steady = steady
        self.bits: dict[str, int] = {}  # each name the scope binds -> its bit
        # Reads on a path that binds nothing of the name yet: node id -> (name, line). Names the
        # scope never binds (globals, builtins) are dropped at the end.
        self.reads: dict[int, tuple[str, int]] = {}
        # The names declared global, and nonlocal: not the scope's own.
        self.globals: set[str] = set()
        self.nonlocals: set[str] = set()
        self.loops: list[list[int]] = []  # per loop walked: [where its breaks go, where its continues go]
        self.killed = 0  # names ``del`` unbinds (and handlers' ``as`` names), for an enclosing ``try``
        self.recording = True
        self.shadowed: frozenset[str] = frozenset()  # loop names of the comprehensions being read
        self.opaque = False  # a star import or ``exec``: any name may be bound
        self.nested: list[_Scope] = []
        # Per block being walked, the tests of its ``if`` statements walked so far: test -> the
        # names its body bound (``_if``); and the names those tests read.
        self.guards: list[dict[str, int] | None] = []
        self.guard_names: dict[str, set[str]] = {}
        self.forgotten = 0  # how many times a test's name was bound again (``_forget``)
        self._walked: set[int] = set()  # the nested definitions walked (a loop body is walked again)

    # Scopes -------------------------------------------------------------------------------------

    def scopes(self):
        yield self
        for scope in self.nested:
            yield from scope.scopes()

    def findings(self, module: _Scope) -> list[Read]:
        if self.opaque:
            return []
        own = set(self.bits) - self.globals - self.nonlocals
        for scope in self.nested:
            own -= scope.nonlocal_names()
        if self.kind != "function":
            own -= _BUILTINS
        if self.kind == "module":
            own -= {name for scope in self.scopes() for name in scope.globals}
        elif self.kind == "class":
            own -= set(module.bits)
        return [(self.path, name, line) for name, line in self.reads.values() if name in own]

    def nonlocal_names(self) -> set[str]:
        """The names this scope (or one in it) declares nonlocal: the calls that bind them are
        not followed."""
        found = set(self.nonlocals)
        for scope in self.nested:
            found |= scope.nonlocal_names()
        return found

    def _nested(self, node: ast.AST, name: str, kind: str) -> _Scope | None:
        """A new scope for ``node``, the first time the walk meets it (None after)."""
        if id(node) in self._walked:
            return None
        self._walked.add(id(node))
        scope = _Scope(name if self.kind == "module" else f"{self.path}.{name}", kind, self.steady)
        self.nested.append(scope)
        return scope

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, state: int) -> int:
        arguments = node.args
        for default in (*arguments.defaults, *arguments.kw_defaults):
            state = self.expr(default, state)
        name = node.name if type(node) is not ast.Lambda else "<lambda>"
        if type(node) is not ast.Lambda:
            for decorator in node.decorator_list:
                state = self.expr(decorator, state)
        scope = self._nested(node, name, "function")
        if scope is not None:
            bound = 0
            for arg in (*arguments.posonlyargs, *arguments.args, arguments.vararg, *arguments.kwonlyargs,
                        arguments.kwarg):
                if arg is not None:
                    bound |= scope.bit(arg.arg)
            if type(node) is ast.Lambda:
                scope.expr(node.body, bound)
            else:
                scope.block(node.body, bound)
        return state

    def _class(self, node: ast.ClassDef, state: int) -> int:
        for part in (*node.decorator_list, *node.bases, *(keyword.value for keyword in node.keywords)):
            state = self.expr(part, state)
        scope = self._nested(node, node.name, "class")
        if scope is not None:
            scope.block(node.body, 0)
        return state | self.bit(node.name)

    # Names --------------------------------------------------------------------------------------

    def bit(self, name: str) -> int:
        found = self.bits.get(name)
        if found is None:
            found = self.bits[name] = 1 << len(self.bits)
        return found

    def read(self, node: ast.Name, state: int) -> None:
        name = node.id
        bit = self.bits.get(name)
        if (bit is not None and state & bit) or state == _NOWHERE or not self.recording or name in self.shadowed:
            return
        self.reads[id(node)] = (name, node.lineno)

    def bind(self, target: ast.AST, state: int) -> int:
        """``state`` after assigning to ``target`` (a name, an unpacking, an attribute or item)."""
        kind = type(target)
        if kind is ast.Name:
            if target.id in self.guard_names:
                self._forget(target.id)
            return state | self.bit(target.id)
        if kind is ast.Tuple or kind is ast.List:
            for element in target.elts:
                state = self.bind(element, state)
            return state
        if kind is ast.Starred:
            return self.bind(target.value, state)
        root = _root(target)
        if root in self.guard_names:
            self._forget(root)  # args.resume = ... changes what ``if args.resume:`` tests
        return self.expr(target, state)  # a.b = ..., a[i] = ...: reads a (and i)

    # Repeated tests -----------------------------------------------------------------------------

    def _guarded(self, test: str) -> int:
        """The names that an earlier ``if`` of the same test bound in its body."""
        bound = 0
        for guards in self.guards:
            if guards is not None:
                bound |= guards.get(test, 0)
        return bound

    def _remember(self, test: str, names: set[str], bound: int) -> None:
        guards = self.guards[-1]
        if guards is None:
            guards = self.guards[-1] = {}
        guards[test] = guards.get(test, 0) | bound
        for name in names:
            self.guard_names.setdefault(name, set()).add(test)

    def _forget(self, name: str) -> None:
        """``name`` is bound again: the tests that read it may not hold as they did."""
        self.forgotten += 1
        for test in self.guard_names.pop(name):
            for guards in self.guards:
                if guards is not None:
                    guards.pop(test, None)

    def _unbind_guarded(self, bit: int) -> None:
        for guards in self.guards:
            if guards is not None:
                for test in guards:
                    guards[test] &= ~bit

    # Statements ---------------------------------------------------------------------------------

    def block(self, statements: list[ast.stmt], state: int) -> int:
        self.guards.append(None)
        for statement in statements:
            state = _STATEMENTS.get(type(statement), _Scope._generic_statement)(self, statement, state)
        self.guards.pop()
        return state

    def _generic_statement(self, node: ast.stmt, state: int) -> int:
        return self.expr(node, state)  # Expr, Assert, Pass: their expressions in order

    def _assign(self, node: ast.Assign, state: int) -> int:
        state = self.expr(node.value, state)
        for target in node.targets:
            state = self.bind(target, state)
        return state

    def _augmented(self, node: ast.AugAssign, state: int) -> int:
        target = node.target
        if type(target) is ast.Name:
            self.read(target, state)  # x += 1 reads x first
        state = self.expr(node.value, state)
        return self.bind(target, state)

    def _annotated(self, node: ast.AnnAssign, state: int) -> int:
        if node.value is None:
            if type(node.target) is ast.Name:
                self.bit(node.target.id)  # ``x: int`` makes x the scope's without binding it
            return state
        return self.bind(node.target, self.expr(node.value, state))

    def _delete(self, node: ast.Delete, state: int) -> int:
        for target in node.targets:
            if type(target) is ast.Name:
                self.read(target, state)
                bit = self.bit(target.id)
                state &= ~bit
                self.killed |= bit
                self._unbind_guarded(bit)
            else:
                state = self.expr(target, state)
        return state

    def _import(self, node: ast.Import | ast.ImportFrom, state: int) -> int:
        for alias in node.names:
            if alias.name == "*":
                self.opaque = True
            else:
                state |= self.bit(alias.asname or alias.name.partition(".")[0])
        return state

    def _declare(self, node: ast.Global | ast.Nonlocal, state: int) -> int:
        (self.globals if type(node) is ast.Global else self.nonlocals).update(node.names)
        return state

    def _ends(self, node: ast.Return | ast.Raise, state: int) -> int:
        self.expr(node, state)
        return _NOWHERE

    def _break(self, node: ast.Break, state: int) -> int:
        if self.loops:
            self.loops[-1][0] &= state
        return _NOWHERE

    def _continue(self, node: ast.Continue, state: int) -> int:
        if self.loops:
            self.loops[-1][1] &= state
        return _NOWHERE

    def _if(self, node: ast.If, state: int) -> int:
        state = self.expr(node.test, state)
        test = _test(node.test, self.steady)
        if test is None:
            return self.block(node.body, state) & self.block(node.orelse, state)
        (holds, fails), names = test
        body = self.block(node.body, state | self._guarded(holds))
        if body != _NOWHERE and body & ~state:
            self._remember(holds, names, body & ~state)
        orelse = self.block(node.orelse, state | self._guarded(fails))
        if orelse != _NOWHERE and orelse & ~state:
            self._remember(fails, names, orelse & ~state)
        return body & orelse

    def _loop(self, node: ast.For | ast.AsyncFor | ast.While, state: int) -> int:
        """The body runs from the names bound at the loop's head, which are those bound before it
        and at the body's end (and each ``continue``): walked again until they settle (only a
        ``del`` in the body unbinds, so a second walk is rare). The ``else`` clause runs when the
        loop ends without a ``break``."""
        looping = type(node) is not ast.While
        if looping:
            state = self.expr(node.iter, state)
        head = state
        again = True  # a test's name bound again in the body: the next time round tests anew
        while True:
            self.loops.append([_NOWHERE, _NOWHERE])
            forgotten = self.forgotten
            start = self.bind(node.target, head) if looping else self.expr(node.test, head)
            end = self.block(node.body, start)
            breaks, continues = self.loops.pop()
            settled = head & end & continues
            if settled == head and not (again and forgotten != self.forgotten):
                break
            again = again and settled != head
            head = settled
        if looping:
            finished = head
        else:
            finished = _NOWHERE if _always_true(node.test) else self.expr(node.test, head)
        return self.block(node.orelse, finished) & breaks

    def _with(self, node: ast.With | ast.AsyncWith, state: int) -> int:
        for item in node.items:
            state = self.expr(item.context_expr, state)
            if item.optional_vars is not None:
                state = self.bind(item.optional_vars, state)
        return self.block(node.body, state)

    def _try(self, node: ast.Try, state: int) -> int:
        """A handler may start before any line of the body ran (or after one that ``del``s);
        after the statement, the body with its ``else`` and every handler have run to their ends
        (those that end on a ``raise`` do not come here). A ``finally`` block's reads are judged
        on the path of an exception from anywhere, and what it binds joins the normal path."""
        killed, self.killed = self.killed, 0
        body = self.block(node.body, state)
        raised = state & ~self.killed
        after = self.block(node.orelse, body)
        for handler in node.handlers:
            start = self.expr(handler.type, raised)
            if handler.name is None:
                after &= self.block(handler.body, start)
                continue
            bit = self.bit(handler.name)
            after &= self.block(handler.body, start | bit) & ~bit  # Python deletes ``e`` at the end
            self.killed |= bit
        if node.finalbody:
            self.block(node.finalbody, after & state & ~self.killed)
            recording, self.recording = self.recording, False
            after = self.block(node.finalbody, after)
            self.recording = recording
        self.killed |= killed
        return after

    def _match(self, node: ast.Match, state: int) -> int:
        state = self.expr(node.subject, state)
        after = _NOWHERE
        unmatched = state  # no case may match
        for case in node.cases:
            start = self.expr(case.guard, self._pattern(case.pattern, state))
            after &= self.block(case.body, start)
            if case.guard is None and type(case.pattern) is ast.MatchAs and case.pattern.pattern is None:
                unmatched = _NOWHERE  # ``case _:`` or ``case name:`` matches whatever is left
        return after & unmatched

    def _pattern(self, pattern: ast.pattern, state: int) -> int:
        for part in ast.walk(pattern):
            kind = type(part)
            if kind is ast.MatchValue:
                state = self.expr(part.value, state)
            elif kind is ast.MatchClass:
                state = self.expr(part.cls, state)
            name = getattr(part, "name", None) if kind is not ast.MatchMapping else part.rest
            if name is not None:
                state |= self.bit(name)
        return state

    def _define(self, node: ast.FunctionDef | ast.AsyncFunctionDef, state: int) -> int:
        return self._function(node, state) | self.bit(node.name)

    # Expressions --------------------------------------------------------------------------------

    def expr(self, node: ast.AST | None, state: int) -> int:
        """``state`` after evaluating ``node``, its reads judged as they come (``:=`` binds for
        what follows)."""
        if node is None:
            return state
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is ast.Load:
                self.read(node, state)
            return state
        if kind is ast.Constant:
            return state
        special = _EXPRESSIONS.get(kind)
        if special is not None:
            return special(self, node, state)
        fields = _fields.get(kind)
        for field in fields if fields is not None else _walked_fields(kind):
            value = getattr(node, field)
            if type(value) is list:
                for item in value:
                    if isinstance(item, ast.AST):
                        state = self.expr(item, state)
            elif value is not None and isinstance(value, ast.AST):
                state = self.expr(value, state)
        return state

    def _walrus(self, node: ast.NamedExpr, state: int) -> int:
        return self.expr(node.value, state) | self.bit(node.target.id)

    def _either(self, node: ast.BoolOp, state: int) -> int:
        state = self.expr(node.values[0], state)
        for value in node.values[1:]:
            self.expr(value, state)  # may not run: what it binds is not bound after
        return state

    def _choice(self, node: ast.IfExp, state: int) -> int:
        state = self.expr(node.test, state)
        return self.expr(node.body, state) & self.expr(node.orelse, state)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, state: int) -> int:
        """The first iterable is read here; the rest runs in the comprehension's own scope, whose
        loop names shadow the scope's, and may run no time (a ``:=`` in it binds nothing for sure)."""
        generators = node.generators
        state = self.expr(generators[0].iter, state)
        shadowed = self.shadowed
        inner = state
        for index, generator in enumerate(generators):
            if index:
                inner = self.expr(generator.iter, inner)
            self.shadowed = self.shadowed | _target_names(generator.target)
            for condition in generator.ifs:
                inner = self.expr(condition, inner)
        if type(node) is ast.DictComp:
            self.expr(node.value, self.expr(node.key, inner))
        else:
            self.expr(node.elt, inner)
        self.shadowed = shadowed
        return state

    def _call(self, node: ast.Call, state: int) -> int:
        if type(node.func) is ast.Name and node.func.id == "exec":
            self.opaque = True
        state = self.expr(node.func, state)
        for arg in node.args:
            state = self.expr(arg, state)
        for keyword in node.keywords:
            state = self.expr(keyword.value, state)
        return state


def _walked_fields(kind: type) -> tuple[str, ...]:
    found = _fields[kind] = tuple(field for field in kind._fields if field not in _NOT_WALKED)
    return found


def _test(test: ast.expr, steady: frozenset[str]) -> tuple[tuple[str, str], set[str]] | None:
    """A test that gives the same result again while its names are not bound again: the keys of
    its outcomes (where it holds, where it fails: ``not X`` holds where ``X`` fails) and those
    names; None for one that calls (but a ``steady`` function), binds or iterates."""
    names = set()
    for part in ast.walk(test):
        kind = type(part)
        if kind is ast.Name:
            names.add(part.id)
        elif kind is ast.Call:
            func = part.func
            if type(func) is not ast.Name or func.id not in steady or part.args or part.keywords:
                return None
        elif kind in _CHANGING:
            return None
    negated = type(test) is ast.UnaryOp and type(test.op) is ast.Not
    text = ast.dump(test.operand if negated else test)
    return ((f"not {text}", text) if negated else (text, f"not {text}")), names


def _root(target: ast.AST) -> str | None:
    while type(target) is ast.Attribute or type(target) is ast.Subscript:
        target = target.value
    return target.id if type(target) is ast.Name else None


def _target_names(target: ast.AST) -> frozenset[str]:
    return frozenset(node.id for node in ast.walk(target) if type(node) is ast.Name)


def _always_true(test: ast.expr) -> bool:
    """``while True:`` and ``while 1:``, which leave only by a ``break``."""
    return type(test) is ast.Constant and bool(test.value)


_STATEMENTS = {
    ast.Assign: _Scope._assign,
    ast.AugAssign: _Scope._augmented,
    ast.AnnAssign: _Scope._annotated,
    ast.Delete: _Scope._delete,
    ast.Import: _Scope._import,
    ast.ImportFrom: _Scope._import,
    ast.Global: _Scope._declare,
    ast.Nonlocal: _Scope._declare,
    ast.Return: _Scope._ends,
    ast.Raise: _Scope._ends,
    ast.Break: _Scope._break,
    ast.Continue: _Scope._continue,
    ast.If: _Scope._if,
    ast.For: _Scope._loop,
    ast.AsyncFor: _Scope._loop,
    ast.While: _Scope._loop,
    ast.With: _Scope._with,
    ast.AsyncWith: _Scope._with,
    ast.Try: _Scope._try,
    ast.Match: _Scope._match,
    ast.FunctionDef: _Scope._define,
    ast.AsyncFunctionDef: _Scope._define,
    ast.ClassDef: _Scope._class,
}
if hasattr(ast, "TryStar"):
    _STATEMENTS[ast.TryStar] = _Scope._try
_EXPRESSIONS = {
    ast.NamedExpr: _Scope._walrus,
    ast.BoolOp: _Scope._either,
    ast.IfExp: _Scope._choice,
    ast.ListComp: _Scope._comprehension,
    ast.SetComp: _Scope._comprehension,
    ast.GeneratorExp: _Scope._comprehension,
    ast.DictComp: _Scope._comprehension,
    ast.Lambda: _Scope._function,
    ast.Call: _Scope._call,
}
