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
        calls: list[ast.Call] = []
        self._functions: list[ast.AST] = []
        for node in ast.walk(tree):  # breadth first: the calls are put in source order below
            kind = type(node)
            if kind is ast.Call:
                calls.append(node)
            elif kind in _FUNCTIONS:
                self._functions.append(node)
            elif kind is ast.Import or kind is ast.ImportFrom:
                self._note_import(node)
        calls.sort(key=_position)
        called = [(call, self._qualname(call.func)) for call in calls]
        self._reducing = [call for call, callee in called if callee in _spelled(_REDUCING_CONCEPTS)]
        self.parallel = any(callee in _spelled(_PARALLEL_CONCEPTS) for _, callee in called)
        self._reduce_through_helpers(calls)
        for call, callee in called:
            if callee in _DDP:
                self.wraps += 1
            elif callee in _spelled(_STEPPING_CONCEPTS) or _steps(call):
                self.steps.append(call)

    def _note_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if type(node) is ast.Import:
            for alias in node.names:
                root = alias.name.split(".")[0]
                self.imports[alias.asname or root] = alias.name if alias.asname else root
        elif not node.level and node.module:
            for alias in node.names:
                self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _qualname(self, node: ast.AST) -> str | None:
        name = _dotted(node)
        if name is None:
            return None
        root, _, rest = name.partition(".")
        base = self.imports.get(root)
        if base is None:
            return None
        return f"{base}.{rest}" if rest else base

    def _function_of(self, node: ast.AST) -> ast.AST | None:
        """The innermost function (or lambda) that holds ``node``; None at module level."""
        at = _position(node)
        holding = [f for f in self._functions if _position(f) < at <= (f.end_lineno, f.end_col_offset)]
        return max(holding, key=_position, default=None)

    def _reduce_through_helpers(self, calls: list[ast.Call]) -> None:
        """A call of a function of the file that reduces (a helper, however deep) reduces."""
        named = [call for call in calls if type(call.func) is ast.Name]
        helpers: set[str] = set()
        while True:
            reducing = {getattr(self._function_of(call), "name", None) for call in self._reducing} - {None}
            if reducing <= helpers:
                return
            helpers |= reducing
            known = {id(call) for call in self._reducing}
            self._reducing += [call for call in named if call.func.id in helpers and id(call) not in known]

    def unreduced_steps(self) -> list[ast.Call]:
        """The steps that neither reduce themselves (the target's optimizer step) nor come after a
        reduction in their function (none where a parallel wrap reduces them all)."""
        if self.parallel:
            return []
        first_reduction: dict[int, tuple[int, int]] = {}
        for call in self._reducing:
            function = id(self._function_of(call))
            first_reduction[function] = min(first_reduction.get(function, _position(call)), _position(call))
        reducing = {id(call) for call in self._reducing}
        return [step for step in self.steps if id(step) not in reducing
                and first_reduction.get(id(self._function_of(step)), _position(step)) >= _position(step)]


def _position(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset


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


def no_step_left_unreduced(source: bytes, tree: ast.Module, output_tree: ast.Module, selection, fixes: list,
                           migrate_without: Callable) -> bool:
    """The net: refuse an output that drops a DDP wrap of the input (``tree``) and leaves an
    optimizer step with no reduction before it, naming the step's line and the rule whose fixes
    do it: the one without which (``migrate_without(rules)``, the migration run again, only when
    the net trips) no step is left so. Whether the output drops a wrap and steps no optimizer
    itself: its gradients are to be reduced where another module steps (the project's pass,
    ``accrewrite.project``, reads that one)."""
    if b"DistributedDataParallel" not in source:
        return False
    output = Reading(output_tree)
    unreduced = output.unreduced_steps()
    if output.steps and not unreduced:
        return False
    original = Reading(tree)
    wraps = original.wraps
    if output.wraps >= wraps or not output.steps:
        return output.wraps < wraps

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
