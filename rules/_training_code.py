"""What the step-closure rule (ACC009) and the diagnostics (ACC101-ACC106) share: which calls
log, what a step closure is, a few walks over expressions, and the bookkeeping of a diagnostic that
reports only inside the training loop. Whether a value is a tensor is the engine's data-flow
analysis (``accrewrite.values``), read through ``ctx.facts.values(scope)``.

No class here derives from ``Rule``: the registry registers every Rule subclass of a module,
and this module defines none (``LoopDiagnostic`` is a mixin).
"""

from __future__ import annotations

import builtins
import re

import libcst as cst

from accrewrite.facts import Facts
from accrewrite.nodes import dotted, walk
from accrewrite.targets import called_names

BUILTIN_NAMES = frozenset(dir(builtins))
# What the targets call to queue a step closure (ACC009's output), from their profiles.
STEP_CLOSURE_NAMES = called_names("step_closure")

# Logger methods (logging module, logging.Logger, loguru, accelerate's logger).
_LOG_LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "log"})
# TensorBoard SummaryWriter / tensorboardX methods.
_WRITER_METHODS = frozenset(
    {"add_scalar", "add_scalars", "add_histogram", "add_text", "add_image", "add_images", "add_figure", "add_pr_curve"}
)
# tqdm progress bars.
_PROGRESS_METHODS = frozenset({"set_postfix", "set_postfix_str", "set_description", "write"})
# Logging helpers of the script itself that training scripts commonly define (TorchAcc's migration guide's
# log_metrics, Megatron's print_rank_0, ...).
_LOG_FUNCTIONS = frozenset(
    {"print", "log_metrics", "log_metric", "log_stats", "log_dict", "print_rank_0", "print_rank0", "rank0_print",
     "master_print", "print_log", "log_info", "print_metrics", "log_step", "log", "print_test_update",
     "print_progress", "log_progress", "log_scalars"}
)
_LOGGER_OWNER = re.compile(r"log", re.IGNORECASE)
# Every name a logging call is recognised by (the step-closure rule's trigger words).
LOGGING_WORDS = frozenset(_LOG_FUNCTIONS | _LOG_LEVELS | _WRITER_METHODS | _PROGRESS_METHODS)


def is_logging_call(facts: Facts, call: cst.Call) -> bool:
    """Whether ``call`` logs: print, logging/logger, SummaryWriter, wandb, tqdm, Accelerate's
    ``accelerator.log``, or a known logging helper of the script."""
    func = call.func
    if isinstance(func, cst.Name):
        return func.value in _LOG_FUNCTIONS and (func.value != "log" or func.value in facts.file.imports)
    if not isinstance(func, cst.Attribute):
        return False
    method = func.attr.value
    callee = facts.file.qualname(func) or ""
    owner = dotted(func.value) or ""
    if callee.startswith("logging.") or callee in ("wandb.log", "wandb.run.log"):
        return method in _LOG_LEVELS
    if method in _WRITER_METHODS or method in _PROGRESS_METHODS and method != "write":
        return True
    if method == "log" and facts.file.assigned_calls.get(owner) == "accelerate.Accelerator":
        return True  # accelerator.log({...}) hands its values to the trackers
    if method in _LOG_LEVELS:
        return bool(_LOGGER_OWNER.search(owner.split(".")[-1])) or owner.split(".")[-1] in ("run", "wandb")
    return method in ("print", "master_print") and callee == ""


def records_only(facts: Facts, call: cst.Call) -> bool:
    """A logging call that records (TensorBoard, wandb) or updates a progress bar rather than
    prints a line: where it falls among printed lines does not matter."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    callee = facts.file.qualname(func) or ""
    owner = (dotted(func.value) or "").split(".")[-1]
    method = func.attr.value
    return (method in _WRITER_METHODS or method in _PROGRESS_METHODS and method != "write"
            or callee.startswith("wandb.") or owner in ("run", "wandb"))


def is_step_closure_call(node: cst.CSTNode) -> bool:
    """``xm.add_step_closure(...)`` in any spelling."""
    if type(node) is not cst.Call:
        return False
    func = node.func
    name = func.attr.value if type(func) is cst.Attribute else func.value if type(func) is cst.Name else None
    return name in STEP_CLOSURE_NAMES


def is_step_closure_line(node: cst.CSTNode) -> bool:
    """A statement line that is one step-closure call (what ACC009 writes)."""
    return (
        isinstance(node, cst.SimpleStatementLine)
        and len(node.body) == 1
        and isinstance(node.body[0], cst.Expr)
        and is_step_closure_call(node.body[0].value)
    )


def host_read(value: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """How ``value`` reads a value on the host, and what it reads: ``("item", x)`` for
    ``x.item()``, ``("tolist", x)`` for ``x.tolist()``, ``("float", x)`` for ``float(x)``."""
    if not isinstance(value, cst.Call):
        return None
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("item", "tolist") and not value.args:
        return func.attr.value, func.value
    if isinstance(func, cst.Name) and func.value == "float" and len(value.args) == 1:
        arg = value.args[0]
        if arg.keyword is None and not arg.star:
            return "float", arg.value
    return None


def keeps_on_device(original: cst.CSTNode, updated: cst.CSTNode) -> bool:
    """A statement line whose host reads a rule kept on the device: ACC009's ``name = x.item()``
    made ``name = x.detach()``, ACC033's ``total += x.item()`` made ``total += x.detach()``."""
    reads = [_host_reads(line) for line in (original, updated)]
    return bool(reads[0]) and not reads[1] and contains_call(updated, "detach")


def _host_reads(node: cst.CSTNode) -> list[cst.CSTNode]:
    found = []
    walk(node, lambda child: found.append(child) if host_read(child) is not None else None)
    return found


def contains_call(node: cst.CSTNode, method: str) -> bool:
    """Whether ``node`` calls a method named ``method``."""
    found = []
    walk(node, lambda child: found.append(child) if type(child) is cst.Call and type(child.func) is cst.Attribute
         and child.func.attr.value == method else None)
    return bool(found)


def root_name(node: cst.CSTNode) -> str | None:
    """``a`` for ``a.b[c].d``; None when the chain starts with something else."""
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


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


_CLOSURE_FUNCTION = re.compile(rf"(?:{'|'.join(STEP_CLOSURE_NAMES)})\(\s*([A-Za-z_][A-Za-z0-9_]*)")


def loop_helpers(ctx) -> dict[cst.FunctionDef, frozenset[str]]:
    """Functions of this file that a training loop (or step function) calls with tensors but
    that do not train themselves (``log_metrics`` in TorchAcc's BERT example), with the
    parameters that receive the tensors."""
    facts = ctx.facts
    in_loops: set[cst.CSTNode] = set()
    for loop in facts.loops:
        walk(loop.node, lambda node: in_loops.add(node) if isinstance(node, cst.Call) else None)
    found = {}
    for statement in ctx.module.body:
        if not isinstance(statement, cst.FunctionDef) or statement in facts.step_functions:
            continue
        params = set()
        for caller, call, arguments in facts.passed(statement):
            if call in in_loops or caller in facts.step_functions:
                values = facts.values(caller)
                params.update(param for param, argument in arguments.items() if values.is_tensor(argument))
        if params:
            found[statement] = frozenset(params)
    return found


class LoopDiagnostic:
    """Mixin of the diagnostic rules: where a finding is worth reporting.

    A finding is reported only in a training loop or step function (`in_loop`), never inside
    a step closure: a call to `add_step_closure` or a function passed to one. Findings in a
    simple statement wait for the statement's leave: when a rule that runs earlier (ACC009)
    has turned the statement into a step closure, they are dropped with it.
    """

    def could_report(self) -> bool:
        """Whether ``report`` can say anything in this file: it has a training loop or step
        function, and moves something to a device."""
        facts = self.ctx.facts
        return facts.places_on_device and bool(facts.loops or facts.step_functions)

    def _closure_state(self) -> dict:
        state = getattr(self, "_loop_diagnostic_state", None)
        if state is None:
            text = self.ctx.source_text
            functions = set(_CLOSURE_FUNCTION.findall(text)) if any(name in text for name in STEP_CLOSURE_NAMES) else set()
            state = self._loop_diagnostic_state = {"depth": 0, "functions": functions, "pending": {}}
        return state

    def tensors(self):
        """What the values of the function being walked hold (``accrewrite.values``)."""
        return self.ctx.facts.values(self.ctx.scope)

    @property
    def in_closure(self) -> bool:
        return self._closure_state()["depth"] > 0

    @property
    def in_loop(self) -> bool:
        """In a training loop, or in a step function (one that calls backward or step without
        looping itself, like TorchAcc's migration guide's loop_with_amp); not in a step closure. Code before or
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

    def report(self, node: cst.CSTNode, message: str, help: str = "") -> None:
        """Report ``message`` (and its ``help``) at ``node`` when its statement is left (see the class doc). Not in
        a file that never moves anything to a device (it trains on the CPU, where nothing waits
        for a device), nor on an error path: a ``raise``, or a line right before ``sys.exit()``
        or ``raise``, runs once, when the run ends anyway."""
        statement = self.ctx.statement
        if not self.ctx.facts.places_on_device or _on_error_path(self.ctx, statement):
            return
        if isinstance(statement, cst.SimpleStatementLine):
            self._closure_state()["pending"].setdefault(statement, []).append((node, message, help))
        else:
            self.ctx.diagnose(node, message, help)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        pending = self._closure_state()["pending"].pop(original_node, ())
        if pending and not is_step_closure_line(updated_node) and not keeps_on_device(original_node, updated_node):
            for node, message, help in pending:
                self.ctx.diagnose(node, message, help)
        return updated_node

    def leave_Module(self, original_node, updated_node):
        # Statements that an earlier rule replaced by several (or none): their leave_ did not
        # reach this rule, and their findings still stand.
        for pending in self._closure_state()["pending"].values():
            for node, message, help in pending:
                self.ctx.diagnose(node, message, help)
        self._closure_state()["pending"].clear()
        return updated_node


_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def ends_the_run(ctx, line) -> bool:
    """A ``raise`` or ``sys.exit()`` statement line."""
    if not isinstance(line, cst.SimpleStatementLine):
        return False
    small = line.body[0]
    if isinstance(small, cst.Raise):
        return True
    call = small.value if isinstance(small, cst.Expr) else None
    return isinstance(call, cst.Call) and (ctx.facts.file.qualname(call.func) in _EXITS or dotted(call.func) in _EXITS)


def _on_error_path(ctx, statement) -> bool:
    return ends_the_run(ctx, statement) or ends_the_run(ctx, ctx.facts.next_statement.get(statement))

