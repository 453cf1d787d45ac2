"""A project is one decision: what migrating one file means for the files it imports.

Files are migrated one by one (``accrewrite.runner``, in worker processes), but a script and
the modules it imports run together, and two migrations decide for more than their own file:

- A file a rule leaves as it is (``RuleContext.refuse``: Hogwild training where the device
  cannot share memory, ACC108) runs as it was, on the CPU or CUDA: the modules it imports and
  drives must too. Migrated alone, ``mnist_hogwild``'s ``train.py`` would put each batch on the
  target's device while ``main.py`` keeps the model on the CPU. So each module of the project
  that a refused file imports, directly or through another, is left as it is, with a
  diagnostic that names the importer and the refusal's rule.
- A file that drops DistributedDataParallel and steps no optimizer itself (MAE's and DeiT's
  ``main.py``, whose loss scaler steps in ``util/misc.py``) relies on the modules it imports
  that do step: each must all-reduce the gradients in its migrated form (or, out of this run,
  as it is on disk). Where one does not, or none steps, the file is migrated again keeping DDP
  (``Options.keep_ddp``, which ACC005 reports).

The project's modules are the files of the run, and, for a run given one file, the scripts in
its folder that import it (migrated only to learn whether a rule leaves them as they are).
Imports are read from each file's import statements (``ast``), resolved as Python would from
the importer's folder, the folders above it within the run's roots, and its package for a
relative import; only files that exist count. Nothing here runs unless a file was refused or
drops DDP without a step of its own, so a run without either pays nothing more.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from accrewrite.reduction import Reading
from accrewrite.rule import Finding

# Errors that reading a file's imports may meet; such a file imports nothing that is known.
_UNREADABLE = (OSError, SyntaxError, ValueError, RecursionError, MemoryError)


@dataclass
class Member:
    """One file of the project as its migration left it."""

    path: Path  # as the run names it
    changed: bool = False
    output: bytes | None = None  # the migrated bytes, where they differ from the file's
    refusal: Finding | None = None  # the rule's finding that left it as it is
    drops_ddp_alone: bool = False  # drops a DDP wrap and steps no optimizer itself


@dataclass(frozen=True)
class Left:
    """A file left as it is, the diagnostic that says why, and the line it points at."""

    finding: Finding
    first_line: str


@dataclass
class Decisions:
    """What the project's decision changes: files to leave as they are (with their diagnostic),
    files to migrate again keeping DistributedDataParallel (with why)."""

    left: dict[int, Left] = field(default_factory=dict)
    keep_ddp: dict[int, str] = field(default_factory=dict)


def member(path: Path, result) -> Member:
    """What the project reads of a file's migration (``result``, an ``engine.FileResult``)."""
    changed = result.changed
    return Member(path, changed, result.output if changed else None,
                  result.diagnostics[0] if result.refused else None, changed and result.drops_ddp_alone)


def needs_deciding(members: list[Member]) -> bool:
    """Whether any file's migration concerns the others: one refused, or one that drops DDP and
    steps no optimizer itself."""
    return any(member.refusal is not None or member.drops_ddp_alone for member in members)


def importers_beside(path: Path) -> list[Path]:
    """The scripts in ``path``'s folder that import it (a run given this file alone)."""
    folder = path.parent
    word = re.compile(rf"\b{re.escape(path.stem)}\b")
    graph, found = _Graph([folder]), []
    try:
        siblings = sorted(folder.glob("*.py"))
    except OSError:
        return []
    for sibling in siblings:
        try:
            text = sibling.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if _real(sibling) != _real(path) and word.search(text) and _real(path) in graph.imports(sibling):
            found.append(sibling)
    return found


def decide(members: list[Member], roots: list[Path], outside: list[Member] = ()) -> Decisions:
    """The project's decisions about ``members`` (the run's files, in order); ``outside`` are
    files migrated only to learn whether they are refused (scripts that import a lone file)."""
    graph = _Graph(roots)
    by_path = {_real(member.path): index for index, member in enumerate(members)}
    decisions = Decisions()
    for importer in [*members, *outside]:
        if importer.refusal is not None:
            _leave_driven(importer, members, by_path, graph, decisions)
    for index, member in enumerate(members):
        if member.drops_ddp_alone and index not in decisions.left:
            why = _unreduced_elsewhere(member, members, by_path, graph, decisions)
            if why is not None:
                decisions.keep_ddp[index] = why
    return decisions


def _leave_driven(refused: Member, members: list[Member], by_path: dict, graph: _Graph, decisions: Decisions) -> None:
    """Leave each changed module the refused file drives as it is, naming its importer."""
    rule = refused.refusal
    for path, importer in graph.reached(_real(refused.path)):
        index = by_path.get(path)
        if index is None or index in decisions.left or not members[index].changed or members[index].refusal:
            continue
        name = _relative(importer, path)
        line = graph.first_line(path)
        finding = Finding(
            rule.code, rule.name, f"left as it is: {name}, which imports it, is left as it is ({rule.code})", None,
            line=1, end_line=1, end_col=len(line),
            help=f"{name} runs this module in its processes, and {rule.code} leaves {name} as it is: migrated "
                 f"alone, this module would put its tensors on the target's device while {name} keeps its model "
                 f"where it was. Change {name} as its {rule.code} finding says, then migrate both.",
        )
        decisions.left[index] = Left(finding, line)


def _unreduced_elsewhere(member: Member, members: list[Member], by_path: dict, graph: _Graph,
                         decisions: Decisions) -> str | None:
    """Why the modules that ``member`` imports do not reduce the gradients it leaves to them,
    or None where every one that steps an optimizer all-reduces before each step."""
    stepping = False
    for path, _ in graph.reached(_real(member.path)):
        reading = _reading(path, members, by_path, decisions)
        if reading is None or not reading.steps:
            continue
        if reading.unreduced_steps():
            return f"{_relative(path, member.path)} steps the optimizer without an all-reduce"
        stepping = True
    return None if stepping else "no module it imports steps the optimizer"


def _reading(path: Path, members: list[Member], by_path: dict, decisions: Decisions) -> Reading | None:
    """What ``path`` will hold after the run (its migration, or the file as it is) says about
    steps and reductions; None where it cannot be read."""
    index = by_path.get(path)
    migrated = index is not None and index not in decisions.left and members[index].changed
    try:
        code = members[index].output if migrated else path.read_bytes()
        return Reading(ast.parse(code))
    except _UNREADABLE:
        return None


def _relative(path: Path, beside: Path) -> str:
    """``path`` as seen from ``beside``'s folder (``main.py``, ``util/misc.py``)."""
    return os.path.relpath(path, _real(beside).parent)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


class _Graph:
    """The project's import graph, each file's imports read once, when first asked."""

    def __init__(self, roots: list[Path]):
        self.roots = [_real(root) for root in roots]
        self._imports: dict[Path, set[Path]] = {}
        self._first_lines: dict[Path, str] = {}

    def reached(self, start: Path) -> list[tuple[Path, Path]]:
        """Every file ``start`` imports, directly or through another, with the file that
        imports it (first found), nearest first."""
        found: dict[Path, Path] = {}
        pending = [start]
        while pending:
            importer = pending.pop(0)
            for path in sorted(self.imports(importer)):
                if path != start and path not in found:
                    found[path] = importer
                    pending.append(path)
        return list(found.items())

    def imports(self, path: Path) -> set[Path]:
        """The files of the project that ``path``'s import statements name."""
        path = _real(path)
        if path not in self._imports:
            self._imports[path] = set()
            try:
                text = path.read_bytes()
                tree = ast.parse(text)
            except _UNREADABLE:
                return self._imports[path]
            self._first_lines[path] = text.decode("utf-8", errors="replace").splitlines()[0] if text else ""
            for node in ast.walk(tree):
                for module in _named_modules(node):
                    self._imports[path] |= self._resolve(path, module, node)
        return self._imports[path]

    def first_line(self, path: Path) -> str:
        return self._first_lines.get(path, "")

    def _resolve(self, importer: Path, module: str, node: ast.AST) -> set[Path]:
        """The files ``module`` (as ``node`` names it in ``importer``) may be."""
        level = getattr(node, "level", 0) or 0
        if level:
            bases = [importer.parents[level - 1]] if level <= len(importer.parents) else []
        else:
            bases = self._bases(importer)
        found = set()
        for base in bases:
            target = base.joinpath(*module.split("."))
            for candidate in (target.with_name(target.name + ".py"), target / "__init__.py"):
                if candidate != importer and candidate.is_file():
                    found.add(_real(candidate))
        return found

    def _bases(self, importer: Path) -> list[Path]:
        """Where an absolute import may resolve: the importer's folder, and those above it up to
        the run's root that holds it."""
        bases = [importer.parent]
        top = next((root for root in self.roots if importer.is_relative_to(root)), importer.parent)
        for folder in importer.parent.parents:
            if not folder.is_relative_to(top):
                break
            bases.append(folder)
        return bases


def _named_modules(node: ast.AST) -> list[str]:
    """The modules an import statement names: ``import a.b`` -> a.b; ``from a import b`` -> a
    and a.b (``b`` may be a module); ``from . import b`` -> b, relative to the package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    named = [f"{base}.{alias.name}" if base else alias.name for alias in node.names if alias.name != "*"]
    return [base, *named] if base else named
