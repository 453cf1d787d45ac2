"""A project is one decision: what migrating one file means for the files it imports.

Files are migrated one by one (``accrewrite.runner``, in worker processes), but a script and
the modules it imports run together, and two migrations decide for more than their own file:

- A file a rule leaves as it is (``RuleContext.refuse``: Hogwild training where the device
  cannot share memory, ACC108; a legacy ``torch.cuda.FloatTensor``, ACC002) runs as it was, on
  the CPU or CUDA: the files that run with it must too. Migrated alone, ``mnist_hogwild``'s
  ``train.py`` would put each batch on the target's device while ``main.py`` keeps the model on
  the CPU; PyTorch-YOLOv3's ``train.py`` would hand its model, on the device, to an evaluator
  that feeds it CPU tensors. So each file of the project that a refused file imports, and each
  that imports it, directly or through another, is left as it is, and so on from each file
  left (the files that import one another are one decision), each with a diagnostic that names
  its neighbour and the refusal's rule. Files that only share a module the migration does not
  change (a ``config.py``) do not run each other, and stay apart. A refusal about what fails on
  the target only where it runs (ACC016's SyncBatchNorm built on XLA, which timm's
  ``layers/norm_act.py`` subclasses) holds no neighbour (``Rule.refusal_holds_neighbours``).
- A file that drops DistributedDataParallel and steps no optimizer itself (MAE's and DeiT's
  ``main.py``, whose loss scaler steps in ``util/misc.py``) relies on the modules it imports
  that do step: each must all-reduce the gradients in its migrated form (or, out of this run,
  as it is on disk). Where one does not, or none steps, the file is migrated again keeping DDP
  (``Options.keep_ddp``, which ACC005 reports).

The project's modules are the files of the run, and, for a run given one file, the scripts in
its folder that import it and the modules it imports (migrated only to learn whether a rule
leaves them as they are). Imports are read from each file's import statements (``ast``),
resolved as Python would from the importer's folder, the folders above it within the run's
roots (for one file: its folder, or the folder holding its outermost package), and its package
for a relative import; only files that exist count. Nothing here runs unless a file was refused
or drops DDP without a step of its own, so a run without either pays nothing more.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from accrewrite.notebook import python_of
from accrewrite.reduction import Reading
from accrewrite.registry import all_rules
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


def lone_root(path: Path) -> Path:
    """Where the imports of a run given the one file ``path`` resolve: its folder, or the folder
    that holds its outermost package (``pytorchyolo/train.py``'s ``from pytorchyolo.test import``)."""
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return folder


def related(path: Path) -> list[Path]:
    """The files that run with ``path`` in a run given it alone: the scripts in its folder that
    import it, and the modules it imports."""
    folder = path.parent
    word = re.compile(rf"\b{re.escape(path.stem)}\b")
    graph, found = _Graph([lone_root(path)]), []
    try:
        siblings = sorted(folder.glob("*.py"))
    except OSError:
        siblings = []
    for sibling in siblings:
        try:
            text = sibling.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if _real(sibling) != _real(path) and word.search(text) and _real(path) in graph.imports(sibling):
            found.append(sibling)
    imported = [module for module, _ in graph.reached(_real(path))]
    return found + [module for module in imported if module not in {_real(f) for f in found}]


def decide(members: list[Member], roots: list[Path], outside: list[Member] = ()) -> Decisions:
    """The project's decisions about ``members`` (the run's files, in order); ``outside`` are
    files migrated only to learn whether they are refused (those that run with a lone file)."""
    graph = _Graph(roots)
    by_path = {_real(member.path): index for index, member in enumerate(members)}
    decisions = Decisions()
    _leave_together(members, list(outside), by_path, graph, decisions)
    for index, member in enumerate(members):
        if member.drops_ddp_alone and index not in decisions.left:
            why = _unreduced_elsewhere(member, members, by_path, graph, decisions)
            if why is not None:
                decisions.keep_ddp[index] = why
    return decisions


def _leave_together(members: list[Member], outside: list[Member], by_path: dict, graph: _Graph,
                    decisions: Decisions) -> None:
    """Leave as it is each changed file that a file left as it is imports or is imported by,
    directly or through files the migration does not change, and so on from each file left."""
    everyone = {_real(member.path): member for member in [*outside, *members]}
    pending = [(path, member.refusal, path) for path, member in everyone.items() if _holds_neighbours(member.refusal)]
    if not pending:
        return
    left = {path for path, _, _ in pending}
    while pending:
        path, rule, origin = pending.pop(0)
        for found, neighbour, imports in [*((p, n, False) for p, n in graph.reached(path)),
                                          *((p, n, True) for p, n in graph.reached_by(path, list(everyone)))]:
            member = everyone.get(found)
            if member is None or found in left or not member.changed or member.refusal is not None:
                continue
            left.add(found)
            pending.append((found, rule, origin))
            index = by_path.get(found)
            if index is not None:
                decisions.left[index] = _left(found, neighbour, origin, imports, rule, graph)


def _holds_neighbours(refusal: Finding | None) -> bool:
    rule = all_rules().get(refusal.code) if refusal is not None else None
    return rule is not None and rule.refusal_holds_neighbours


def _left(path: Path, neighbour: Path, origin: Path, imports: bool, rule: Finding, graph: _Graph) -> Left:
    """The diagnostic of ``path``, left as it is with ``neighbour``, which imports it (or which
    it imports), where ``rule`` refused ``origin``."""
    name, refused, code = _relative(neighbour, path), _relative(origin, path), rule.code
    if imports:
        message = f"left as it is: it imports {name}, which is left as it is ({code})"
        runs = f"This file runs {name} in its processes"
    else:
        message = f"left as it is: {name}, which imports it, is left as it is ({code})"
        runs = f"{name} runs this module in its processes"
    why = f"{code} leaves {name} as it is" if neighbour == origin else \
        f"{name} is left as it is with {refused}, which {code} leaves as it is"
    line = graph.first_line(path)
    return Left(Finding(
        code, rule.name, message, None, line=1, end_line=1, end_col=len(line),
        help=f"{runs}, and {why}: migrated alone, this file would put its model and tensors on the target's "
             f"device while {name} keeps its own where they were. Change {refused} as its {code} finding says, "
             f"then migrate them together.",
    ), line)


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
        return Reading(ast.parse(python_of(path, code)))
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
        self._raw: dict[Path, bytes] = {}
        self._texts: dict[Path, bytes] = {}
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
                text = self._text(path)
                tree = ast.parse(text)
            except _UNREADABLE:
                return self._imports[path]
            self._first_lines[path] = text.decode("utf-8", errors="replace").splitlines()[0] if text else ""
            for node in ast.walk(tree):
                for module in _named_modules(node):
                    self._imports[path] |= self._resolve(path, module, node)
        return self._imports[path]

    def reached_by(self, start: Path, among: list[Path]) -> list[tuple[Path, Path]]:
        """Every file of ``among`` that imports ``start``, directly or through another, with the
        file it imports on the way (first found), nearest first."""
        found: dict[Path, Path] = {}
        pending = [start]
        while pending:
            imported = pending.pop(0)
            for path in self._importers(imported, among):
                if path != start and path not in found:
                    found[path] = imported
                    pending.append(path)
        return list(found.items())

    def _importers(self, path: Path, among: list[Path]) -> list[Path]:
        """The files of ``among`` whose imports name ``path``: only those with an import line
        that names its module (its package's, for an ``__init__.py``) are parsed."""
        module = (path.parent.name if path.name == "__init__.py" else path.stem).encode()
        name = re.escape(module)
        word = re.compile(rb"^[ \t]*(?:from|import)[ \t][^\n]*\b" + name + rb"\b|^[ \t]*from[ \t][^\n(]*\([^)]*\b"
                          + name + rb"\b", re.MULTILINE)
        # A file whose bytes lack the name cannot import it: a notebook is read only where they
        # have it (its JSON spells an ASCII name as the script does).
        spelled = module.isascii()
        return sorted(other for other in among
                      if other != path and (not spelled or module in self._bytes(other))
                      and word.search(self._text(other)) and path in self.imports(other))

    def _bytes(self, path: Path) -> bytes:
        if path not in self._raw:
            try:
                self._raw[path] = path.read_bytes()
            except OSError:
                self._raw[path] = b""
        return self._raw[path]

    def _text(self, path: Path) -> bytes:
        if path not in self._texts:
            self._texts[path] = python_of(path, self._bytes(path))
        return self._texts[path]

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
