"""What the step-closure rule (ACC009) and the diagnostics (ACC101-ACC106) share: which values in
a training loop are tensors, which expressions read a tensor's value on the host, what a step
closure is, and the walk bookkeeping of a diagnostic that reports only inside the loop.

Tensor values are inferred per function (or module) by a small forward pass over assignments,
not by types: a value is a tensor when it is a batch from a loader, a model's output, the loss
that ``backward()`` is called on, a ``torch.*`` result, or computed from one of those by tensor
methods, arithmetic, indexing or a call that takes a tensor. ``.item()``, ``.tolist()``,
``float(t)`` and metadata (``.shape``, ``.size()``, ``.dtype``) give Python values.

No class here derives from ``Rule``: the registry registers every Rule subclass of a module,
and this module defines none (``LoopDiagnostic`` is a mixin).
"""

from __future__ import annotations

import builtins
import re

import libcst as cst

from accrewrite.analysis import children, dotted, string_value

# Methods that copy a tensor's value to the host (the caller waits for the device).
SYNC_METHODS = frozenset({"item", "tolist", "numpy", "cpu"})
# Builtins that read a tensor's value when given one.
SYNC_BUILTINS = frozenset({"float", "int", "bool", "str", "repr", "format", "round"})
# Tensor metadata: known on the host without waiting for the device.
META_ATTRS = frozenset(
    {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_leaf", "grad_fn", "layout", "names"}
)
META_METHODS = frozenset({"size", "dim", "numel", "nelement", "element_size", "get_device", "stride", "is_contiguous"})
# Builtins that return Python values even when given tensors.
PYTHON_FUNCS = frozenset(
    {"len", "str", "repr", "int", "float", "bool", "round", "print", "isinstance", "type", "id", "hash",
     "format", "range", "enumerate", "zip", "list", "tuple", "dict", "set", "sorted", "getattr", "hasattr"}
)
# torch namespaces whose functions return Python values or objects, not tensors.
_HOST_TORCH = ("torch.cuda.", "torch.distributed.", "torch.backends.", "torch.utils.", "torch.optim.")
BUILTIN_NAMES = frozenset(dir(builtins))
STEP_CLOSURE = "add_step_closure"

# Logger methods (logging module, logging.Logger, loguru, accelerate's logger).
_LOG_LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "log"})
# TensorBoard SummaryWriter / tensorboardX methods.
_WRITER_METHODS = frozenset(
    {"add_scalar", "add_scalars", "add_histogram", "add_text", "add_image", "add_images", "add_figure", "add_pr_curve"}
)
# tqdm progress bars.
_PROGRESS_METHODS = frozenset({"set_postfix", "set_postfix_str", "set_description", "write"})
# Logging helpers of the script itself that training scripts commonly define (seed 001's
# log_metrics, Megatron's print_rank_0, ...).
_LOG_FUNCTIONS = frozenset(
    {"print", "log_metrics", "log_metric", "log_stats", "log_dict", "print_rank_0", "print_rank0", "rank0_print",
     "master_print", "print_log", "log_info", "print_metrics", "log_step", "log", "print_test_update",
     "print_progress", "log_progress", "log_scalars"}
)
_LOGGER_OWNER = re.compile(r"log", re.IGNORECASE)
# Every name a logging call is recognised by (the step-closure rule's trigger words).
LOGGING_WORDS = frozenset(_LOG_FUNCTIONS | _LOG_LEVELS | _WRITER_METHODS | _PROGRESS_METHODS)


def is_logging_call(facts, call: cst.Call) -> bool:
    """Whether ``call`` logs: print, logging/logger, SummaryWriter, wandb, tqdm, or a known
    logging helper of the script."""
    func = call.func
    if isinstance(func, cst.Name):
        return func.value in _LOG_FUNCTIONS and (func.value != "log" or func.value in facts.imports)
    if not isinstance(func, cst.Attribute):
        return False
    method = func.attr.value
    callee = facts.qualname(func) or ""
    owner = dotted(func.value) or ""
    if callee.startswith("logging.") or callee in ("wandb.log", "wandb.run.log"):
        return method in _LOG_LEVELS
    if method in _WRITER_METHODS or method in _PROGRESS_METHODS and method != "write":
        return True
    if method in _LOG_LEVELS:
        return bool(_LOGGER_OWNER.search(owner.split(".")[-1])) or owner.split(".")[-1] in ("run", "wandb")
    return method in ("print", "master_print") and callee == ""


def is_step_closure_call(node: cst.CSTNode) -> bool:
    """``xm.add_step_closure(...)`` in any spelling."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
    return name == STEP_CLOSURE


def is_step_closure_line(node: cst.CSTNode) -> bool:
    """A statement line that is one step-closure call (what ACC009 writes)."""
    return (
        isinstance(node, cst.SimpleStatementLine)
        and len(node.body) == 1
        and isinstance(node.body[0], cst.Expr)
        and is_step_closure_call(node.body[0].value)
    )


def root_name(node: cst.CSTNode) -> str | None:
    """``a`` for ``a.b[c].d``; None when the chain starts with something else."""
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def walk(node: cst.CSTNode, enter) -> None:
    """Call ``enter`` on ``node`` and its descendants in source order, without libcst's
    rebuilding visit (see ``accrewrite.analysis._Walker``); ``enter`` returning False skips a
    node's children."""
    stack = [node]
    while stack:
        current = stack.pop()
        if enter(current) is False:
            continue
        stack.extend(reversed(children(current)))


def free_names(node: cst.CSTNode) -> set[str]:
    """Names an expression reads (not attribute names or keywords)."""
    found: set[str] = set()

    def enter(child):
        if isinstance(child, cst.Name):
            found.add(child.value)
        elif isinstance(child, cst.Attribute):
            walk(child.value, enter)
            return False
        elif isinstance(child, cst.Arg):
            walk(child.value, enter)
            return False
        return True

    walk(node, enter)
    return found


def bound_names(node: cst.CSTNode) -> set[str]:
    """Names bound inside an expression (comprehension targets, lambda parameters)."""
    found: set[str] = set()

    def enter(child):
        if isinstance(child, cst.CompFor):
            found.update(free_names(child.target))
        elif isinstance(child, cst.Lambda):
            found.update(p.name.value for p in child.params.params)
        return True

    walk(node, enter)
    return found


def contains(node: cst.CSTNode, kind: type) -> bool:
    found = False

    def enter(child):
        nonlocal found
        if found or isinstance(child, kind):
            found = True
            return False
        return True

    walk(node, enter)
    return found


class Tensors:
    """The tensor-valued names of one function (or of module level) and questions about
    expressions there."""

    def __init__(self, facts, scope: cst.CSTNode | None, module: cst.Module, params=frozenset()):
        self.facts = facts
        # ``params``: parameters that the training loop passes tensors to (logging helpers).
        self.names: set[str] = set(params)
        self.masks: set[str] = set()
        body = scope.body if isinstance(scope, cst.FunctionDef) else module
        statements = _own_statements(body)
        for _ in range(2):  # a second pass sees names assigned after their first use in a loop
            for statement in statements:
                self._learn(statement)

    # Learning --------------------------------------------------------------------------------

    def _learn(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.For):
            self._learn_loop_target(node)
        elif isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            value = node.value
            if value is None:
                return
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            if self.is_tensor(value):
                for target in targets:
                    self._add_target(target, self.is_mask(value))
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            receiver = node.func.value
            if isinstance(receiver, cst.Call) and receiver.args:  # scaler.scale(loss).backward()
                receiver = receiver.args[0].value
            name = dotted(receiver)
            if name:
                self.names.add(name)

    def _add_target(self, target: cst.CSTNode, mask: bool) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._add_target(element.value, False)
            return
        if isinstance(target, cst.StarredElement):
            target = target.value
        name = dotted(target)
        if name:
            self.names.add(name)
            if mask:
                self.masks.add(name)

    def _learn_loop_target(self, loop: cst.For) -> None:
        source = loop.iter
        target = loop.target
        if isinstance(source, cst.Call) and dotted(source.func) == "enumerate" and source.args:
            source = source.args[0].value
            if isinstance(target, cst.Tuple) and len(target.elements) == 2:
                target = target.elements[1].value
            else:
                return
        while isinstance(source, cst.Call) and source.args:  # tqdm(loader), iter(loader)
            source = source.args[0].value
        name = dotted(source) or ""
        if name in self.facts.loaders or "loader" in name.split(".")[-1].lower():
            self._add_target(target, False)

    # Questions -------------------------------------------------------------------------------

    def is_model(self, func: cst.CSTNode) -> bool:
        name = dotted(func)
        if name is None:
            return False
        models = self.facts.models
        return name in models or root_name(func) in models or name.split(".")[-1].endswith("model")

    def is_tensor(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` evaluates to a tensor (or a container of tensors, such as a batch)."""
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted(node)
            if name in self.names:
                return True
            if isinstance(node, cst.Attribute):
                if node.attr.value in META_ATTRS:
                    return False
                return self.is_tensor(node.value)
            return False
        if isinstance(node, cst.Subscript):
            return self.is_tensor(node.value)
        if isinstance(node, cst.Call):
            return self._call_is_tensor(node)
        if isinstance(node, cst.BinaryOperation):
            return self.is_tensor(node.left) or self.is_tensor(node.right)
        if isinstance(node, cst.UnaryOperation):
            return not isinstance(node.operator, cst.Not) and self.is_tensor(node.expression)
        if isinstance(node, cst.Comparison):
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in node.comparisons):
                return False
            return self.is_tensor(node.left) or any(self.is_tensor(c.comparator) for c in node.comparisons)
        if isinstance(node, cst.BooleanOperation):
            return self.is_tensor(node.left) or self.is_tensor(node.right)
        if isinstance(node, cst.IfExp):
            return self.is_tensor(node.body) or self.is_tensor(node.orelse)
        return False

    def _call_is_tensor(self, node: cst.Call) -> bool:
        func = node.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in SYNC_METHODS - {"cpu"} or method in META_METHODS:
                return False
            if self.is_tensor(func.value):
                return True
        callee = self.facts.qualname(func)
        if callee is not None:
            if callee.startswith("torch.") and not callee.startswith(_HOST_TORCH):
                return True
            if not callee.startswith("torch."):
                return any(self.is_tensor(arg.value) for arg in node.args)
            return False
        if isinstance(func, cst.Name) and func.value in PYTHON_FUNCS:
            return False
        if self.is_model(func):
            return True
        return any(self.is_tensor(arg.value) for arg in node.args)

    def is_mask(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is a boolean tensor (a comparison of tensors, ``.bool()``, ``~m``)."""
        if isinstance(node, cst.Comparison):
            return self.is_tensor(node)
        if isinstance(node, (cst.Name, cst.Attribute)):
            return dotted(node) in self.masks
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            return node.func.attr.value == "bool" and self.is_tensor(node.func.value)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return self.is_mask(node.expression)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            return self.is_mask(node.left) or self.is_mask(node.right)
        return False

    def sync(self, node: cst.CSTNode) -> str | None:
        """How ``node`` itself (not its children) reads a tensor's value on the host, else None."""
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in SYNC_METHODS:
                if self.facts.qualname(func) is None:  # a method, not a module's function
                    return f".{func.attr.value}()"
            if isinstance(func, cst.Attribute) and func.attr.value == "to" and node.args:
                first = node.args[0].value
                if isinstance(first, cst.Call) and self.facts.qualname(first.func) == "torch.device" and first.args:
                    first = first.args[0].value
                if string_value(first) == "cpu" and self.is_tensor(func.value):
                    return '.to("cpu")'
            if isinstance(func, cst.Name) and func.value in SYNC_BUILTINS and func.value not in self.facts.imports:
                if any(self.is_tensor(arg.value) for arg in node.args):
                    return f"{func.value}() of a tensor"
            if isinstance(func, cst.Attribute) and func.attr.value == "format":
                if any(self.is_tensor(arg.value) for arg in node.args):
                    return "formatting a tensor"
        if isinstance(node, cst.FormattedStringExpression) and self.is_tensor(node.expression):
            return "formatting a tensor"
        if isinstance(node, cst.IfExp) and self.is_tensor(node.test):
            return "a tensor's truth value"
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            if isinstance(node.left, (cst.SimpleString, cst.ConcatenatedString)) and self.is_tensor(node.right):
                return "formatting a tensor"
        return None

    def reads_value(self, node: cst.CSTNode) -> bool:
        """Whether evaluating ``node`` reads some tensor's value on the host."""
        found = False

        def enter(child):
            nonlocal found
            if found or self.sync(child) is not None:
                found = True
                return False
            return True

        walk(node, enter)
        return found


def _own_statements(body: cst.CSTNode) -> list[cst.CSTNode]:
    """Assignments, loops and backward calls (``loss.backward()`` as a statement) of a function
    body (not of nested functions or classes), in source order. Expressions are not entered:
    what is learned sits at statement level, and entering every expression was most of the cost
    of the diagnostics."""
    found: list[cst.CSTNode] = []

    def enter(node):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.BaseExpression)):
            return False
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            found.append(node)
            return False
        if isinstance(node, cst.For):
            found.append(node)
        elif isinstance(node, cst.Expr):
            call = node.value
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                found.append(call)
            return False
        return True

    for statement in body.body:
        walk(statement, enter)
    return found


# Tensor facts by function, for the file being migrated (the rules of one file share them; a
# new file replaces them, so at most one file's facts are held).
_TENSORS: dict = {"module": None, "by_scope": {}, "helpers": None}
_CLOSURE_FUNCTION = re.compile(rf"{STEP_CLOSURE}\(\s*([A-Za-z_][A-Za-z0-9_]*)")


def _file_cache(ctx) -> dict:
    if _TENSORS["module"] is not ctx.module:
        _TENSORS.update(module=ctx.module, by_scope={}, helpers=None)  # a new file: the last one's facts go
    return _TENSORS


def tensors_of(ctx, scope: cst.FunctionDef | None) -> Tensors:
    """Tensor facts of ``scope`` (a function, or None for module level), computed once per file."""
    cache = _file_cache(ctx)
    by_scope = cache["by_scope"]
    found = by_scope.get(scope)
    if found is None:
        params = loop_helpers(ctx).get(scope, frozenset())
        found = by_scope[scope] = Tensors(ctx.facts, scope, ctx.module, params)
    return found


def loop_helpers(ctx) -> dict[cst.FunctionDef, frozenset[str]]:
    """Functions of this file that a training loop (or step function) calls with tensors but
    that do not train themselves (seed 001's ``log_metrics``), with the parameters that
    receive the tensors."""
    cache = _file_cache(ctx)
    if cache["helpers"] is not None:
        return cache["helpers"]
    cache["helpers"] = {}  # while computing: tensors_of() below must not recurse here
    facts = ctx.facts
    defs: dict[str, cst.FunctionDef] = {}
    for statement in ctx.module.body:
        if isinstance(statement, cst.FunctionDef) and statement not in facts.step_functions:
            defs[statement.name.value] = statement
    if not defs:
        return cache["helpers"]
    found: dict[cst.FunctionDef, set[str]] = {}
    places = [(loop.node, loop.scope) for loop in facts.loops]
    places += [(function, function) for function in facts.step_functions]
    for node, scope in places:
        tensors = tensors_of(ctx, scope)

        def enter(child, tensors=tensors):
            if isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and child is not node:
                return False
            if isinstance(child, cst.Call) and isinstance(child.func, cst.Name) and child.func.value in defs:
                helper = defs[child.func.value]
                params = [p.name.value for p in helper.params.params]
                positional = [a for a in child.args if a.keyword is None and not a.star]
                for index, arg in enumerate(positional):
                    if index < len(params) and tensors.is_tensor(arg.value):
                        found.setdefault(helper, set()).add(params[index])
                for arg in child.args:
                    if arg.keyword is not None and tensors.is_tensor(arg.value):
                        found.setdefault(helper, set()).add(arg.keyword.value)
            return True

        walk(node, enter)
    helpers = {helper: frozenset(names) for helper, names in found.items()}
    cache["helpers"] = helpers
    for helper in helpers:
        cache["by_scope"].pop(helper, None)  # computed without the helper's parameters
    return helpers


class LoopDiagnostic:
    """Mixin of the diagnostic rules: where a finding is worth reporting.

    A finding is reported only in a training loop or step function (``in_loop``), never inside
    a step closure: a call to ``add_step_closure`` or a function passed to one. Findings in a
    simple statement wait for the statement's leave: when a rule that runs earlier (ACC009)
    has turned the statement into a step closure, they are dropped with it.
    """

    def _closure_state(self) -> dict:
        state = getattr(self, "_loop_diagnostic_state", None)
        if state is None:
            text = self.ctx.source_text
            functions = set(_CLOSURE_FUNCTION.findall(text)) if STEP_CLOSURE in text else set()
            state = self._loop_diagnostic_state = {"depth": 0, "functions": functions, "pending": {}}
        return state

    def tensors(self) -> Tensors:
        """Tensor facts of the function being walked (shared by the rules of one file)."""
        return tensors_of(self.ctx, self.ctx.scope)

    @property
    def in_closure(self) -> bool:
        return self._closure_state()["depth"] > 0

    @property
    def in_loop(self) -> bool:
        """In a training loop, or in a step function (one that calls backward or step without
        looping itself, like seed 001's loop_with_amp); not in a step closure. Code before or
        after the loop of the function that holds it runs once, and is not in the loop."""
        ctx = self.ctx
        if self.in_closure:
            return False
        if ctx.loops:
            return True
        scope = ctx.scope
        if scope is None or scope not in ctx.facts.step_functions:
            return False
        return not any(loop.scope is scope for loop in ctx.facts.loops)

    def visit_Call(self, node: cst.Call) -> None:
        if is_step_closure_call(node):
            self._closure_state()["depth"] += 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value in self._closure_state()["functions"]:
            self._closure_state()["depth"] += 1

    def leave_FunctionDef(self, original_node, updated_node):
        if original_node.name.value in self._closure_state()["functions"]:
            self._closure_state()["depth"] -= 1
        return updated_node

    def leave_Call(self, original_node, updated_node):
        self.check_call(original_node)
        if is_step_closure_call(original_node):
            self._closure_state()["depth"] -= 1
        return updated_node

    def check_call(self, node: cst.Call) -> None:
        """Overridden by rules that look at calls."""

    def report(self, node: cst.CSTNode, message: str) -> None:
        """Report ``message`` at ``node`` when its statement is left (see the class doc)."""
        statement = self.ctx.statement
        if isinstance(statement, cst.SimpleStatementLine):
            self._closure_state()["pending"].setdefault(statement, []).append((node, message))
        else:
            self.ctx.diagnose(node, message)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        pending = self._closure_state()["pending"].pop(original_node, ())
        if not is_step_closure_line(updated_node):
            for node, message in pending:
                self.ctx.diagnose(node, message)
        return updated_node

    def leave_Module(self, original_node, updated_node):
        # Statements that an earlier rule replaced by several (or none): their leave_ did not
        # reach this rule, and their findings still stand.
        for pending in self._closure_state()["pending"].values():
            for node, message in pending:
                self.ctx.diagnose(node, message)
        self._closure_state()["pending"].clear()
        return updated_node
