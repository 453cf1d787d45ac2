"""Whether a file's gradients are all-reduced where its optimizer steps, read from its syntax
tree (``ast``): the net under DistributedDataParallel's removal, and what the project's pass
(``accrewrite.project``) reads of the modules that step.

A migration removes DDP's wrap (ACC005) only together with the reduction that takes its place:
the target's gradient all-reduce before each optimizer step, or its optimizer step, which
reduces first (ACC006). An output that drops a wrap the input had and leaves an optimizer step
that no reduction comes before would train every rank on its own gradients, the replicas
drifting apart while the losses look normal: the file is refused, as one that leaves a name
unbound is (``accrewrite.unbound``), naming the step and the rule that dropped the wrap.

What counts: a step is ``<x>.step(...)`` where ``x`` is named as an optimizer or a loss scaler
is (``optimizer``, ``opt_g``, ``self._scaler``, ``optimizers[i]``); a reduction, a call of any
target's spelling of the gradient all-reduce or of the optimizer step (through the file's
imports), or of a function of the file that makes one. It comes before a step when it is in
the same function (or both at module level), earlier in the source. A file that steps no
optimizer cannot be judged alone: its steps live in another module (the project's pass reads
that one).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable

from accrewrite.errors import FileError, MigrationError
from accrewrite.registry import Selection
from accrewrite.targets import spelled_callees
from accrewrite.unbound import REFUSAL

_DDP = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})
_STEPPING_CONCEPTS = ("optimizer_step", "optimizer_step_closure")
_REDUCING_CONCEPTS = ("gradient_allreduce", *_STEPPING_CONCEPTS)
# The parallel wrap (``migrate --parallel``): FSDP2 and tensor parallelism reduce the gradients
# of every step themselves.
_PARALLEL_CONCEPTS = ("parallel_accelerate",)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def named_like_optimizer(name: str) -> bool:
    """Whether the last part of ``name`` names an optimizer or a loss scaler: ``optimizer``,
    ``optimizer_g``, ``d_optim``, ``opt``, ``opt_g``, ``self._scaler``."""
    last = name.rsplit(".", 1)[-1].lower().strip("_")
    return "optim" in last or "scaler" in last or last == "opt" or last.startswith("opt_") or last.endswith("_opt")


class Reading:
    """What one syntax tree says about DDP's wraps, the optimizer steps and the reductions."""

    def __init__(self, tree: ast.Module):
        self.imports: dict[str, str] = {}
        self.wraps = 0
        self.steps: list[ast.Call] = []
        # Each call, with the function it is in (None at module level), in source order.
        self._calls: list[tuple[ast.Call, ast.AST | None]] = []
        self._functions: dict[str, list[ast.AST]] = {}
        self._read(tree)
        called = [(call, self._qualname(call.func)) for call, _ in self._calls]
        self._reducing = {id(call) for call, callee in called if callee in _spelled(_REDUCING_CONCEPTS)}
        self.parallel = any(callee in _spelled(_PARALLEL_CONCEPTS) for _, callee in called)
        self._reduce_through_helpers()
        for call, callee in called:
            if callee in _DDP:
                self.wraps += 1
            elif callee in _spelled(_STEPPING_CONCEPTS) or _steps(call):
                self.steps.append(call)

    def _read(self, tree: ast.Module) -> None:
        pending: list[tuple[ast.AST, ast.AST | None]] = [(tree, None)]
        while pending:
            node, function = pending.pop()
            if isinstance(node, ast.Import):
                for alias in node.names:
                    root = alias.name.split(".")[0]
                    self.imports[alias.asname or root] = alias.name if alias.asname else root
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Call):
                self._calls.append((node, function))
            if isinstance(node, _FUNCTIONS):
                if not isinstance(node, ast.Lambda):
                    self._functions.setdefault(node.name, []).append(node)
                function = node
            pending.extend((child, function) for child in reversed(list(ast.iter_child_nodes(node))))

    def _qualname(self, node: ast.AST) -> str | None:
        name = _dotted(node)
        if name is None:
            return None
        root, _, rest = name.partition(".")
        base = self.imports.get(root)
        if base is None:
            return None
        return f"{base}.{rest}" if rest else base

    def _reduce_through_helpers(self) -> None:
        """A call of a function of the file that reduces (a helper, however deep) reduces."""
        changed = True
        while changed:
            reducing_functions = {id(function) for call, function in self._calls if id(call) in self._reducing}
            helpers = {name for name, defined in self._functions.items() if any(id(f) in reducing_functions for f in defined)}
            before = len(self._reducing)
            self._reducing |= {id(call) for call, _ in self._calls
                               if isinstance(call.func, ast.Name) and call.func.id in helpers}
            changed = len(self._reducing) != before

    def unreduced_steps(self) -> list[ast.Call]:
        """The steps that neither reduce themselves (the target's optimizer step) nor come after a
        reduction in their function (none where a parallel wrap reduces them all)."""
        if self.parallel:
            return []
        reduced_from: dict[int, tuple[int, int]] = {}
        for call, function in self._calls:
            if id(call) in self._reducing:
                at = (call.lineno, call.col_offset)
                reduced_from[id(function)] = min(reduced_from.get(id(function), at), at)
        scope = {id(call): function for call, function in self._calls}
        return [step for step in self.steps if id(step) not in self._reducing
                and reduced_from.get(id(scope[id(step)]), (step.lineno, step.col_offset)) >= (step.lineno, step.col_offset)]


@functools.cache
def _spelled(concepts: tuple[str, ...]) -> frozenset[str]:
    """What the targets' spellings of ``concepts`` call, by qualified name."""
    return frozenset().union(*(spelled_callees(concept) for concept in concepts))


def _input_line(step: ast.Call, output: Reading, source: Reading) -> int:
    """The line of the input's step that ``step`` of the output is: the same optimizer's step,
    as many of them before it."""
    owner = ast.unparse(step.func)
    nth = [ast.unparse(s.func) for s in output.steps[:output.steps.index(step)]].count(owner)
    same = [s for s in source.steps if ast.unparse(s.func) == owner]
    return same[nth].lineno if nth < len(same) else step.lineno


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _steps(call: ast.Call) -> bool:
    """``optimizer.step()``, ``scaler.step(optimizer)``, ``optimizers[i].step()``."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr != "step":
        return False
    owner = func.value
    while isinstance(owner, ast.Subscript):
        owner = owner.value
    name = _dotted(owner)
    return name is not None and named_like_optimizer(name)


def drops_ddp_alone(before: ast.Module, after: ast.Module) -> bool:
    """Whether the output drops a DDP wrap of the input and steps no optimizer itself: its
    gradients are to be reduced where another module steps."""
    output = Reading(after)
    return Reading(before).wraps > output.wraps and not output.steps


def no_step_left_unreduced(source: bytes, tree: ast.Module, output_tree: ast.Module, selection, fixes: list,
                           migrate_without: Callable) -> None:
    """The net: refuse an output that drops a DDP wrap of the input (``tree``) and leaves an
    optimizer step with no reduction before it, naming the step's line and the rule whose fixes
    do it: the one without which (``migrate_without(rules)``, the migration run again, only when
    the net trips) no step is left so."""
    if b"DistributedDataParallel" not in source:
        return
    original, output = Reading(tree), Reading(output_tree)
    wraps = original.wraps
    unreduced = output.unreduced_steps() if output.wraps < wraps else []
    if not unreduced:
        return

    def clears(rule) -> bool:
        again = migrate_without(Selection(tuple(r for r in selection.rules if r is not rule), selection.withheld))
        if again is None:
            return True
        rewritten = Reading(ast.parse(again[0]))
        return rewritten.wraps == wraps or not rewritten.unreduced_steps()

    by_code = {rule.code: rule for rule in selection.rules}
    fixing = [by_code[code] for code in dict.fromkeys(fix.code for fix in fixes)]
    culprit = next((f"{rule.code} {rule.name}" for rule in fixing if clears(rule)),
                   f"rules {', '.join(rule.code for rule in fixing)} together")
    line = _input_line(unreduced[0], output, original)
    raise MigrationError(FileError(
        f"{REFUSAL} the optimizer step at line {line} with no gradient all-reduce before it, DistributedDataParallel "
        f"removed ({culprit}); the file was left unchanged; please report it with the file", line,
    ))
