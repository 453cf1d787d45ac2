"""What a rule is, and the per-file context it works through.

A rule is a class in ``rules/`` (one per module). It reads like its documentation: the class
docstring says what it does and why, ``examples`` show before/after code that the test suite runs,
and its ``visit_<Node>``/``leave_<Node>`` methods are those of a libcst transformer. All the
selected rules of a file run in one batched walk (``accrewrite.transform``); each reaches the
file's facts, the target's spellings and the report through ``self.ctx``.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import ClassVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from accrewrite import snippets
from accrewrite.concepts import Definition
from accrewrite.facts import Facts
from accrewrite.positions import Printed, code, starts, starts_and_code
from accrewrite.targets import Concept, Target, all_targets


@dataclass(frozen=True)
class Example:
    """A before/after pair in a rule's documentation; the test suite migrates ``before`` with
    only this rule selected (and the rules of ``with_rules``, whose work the rule's relies on)
    and expects ``after`` exactly, and the diagnostics listed in ``diagnostics`` as
    ``"CODE:LINE"`` (lines of ``before``), in order. A diagnostic rule's example changes
    nothing: it leaves out ``after``, which then equals ``before``. ``parallel`` is the
    ``--parallel`` kind it is migrated with, which runs every parallel rule (their findings are
    listed with ``with_rules``)."""

    before: str
    after: str | None = None
    target: str = "runtime"
    diagnostics: tuple[str, ...] = ()
    with_rules: tuple[str, ...] = ()
    parallel: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "before", textwrap.dedent(self.before).lstrip("\n"))
        after = self.before if self.after is None else textwrap.dedent(self.after).lstrip("\n")
        object.__setattr__(self, "after", after)


class Rule:
    """Base class of every rule. Subclasses set the class attributes below."""

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    # An unsafe fix may change numerics; it applies only with --unsafe-fixes or when selected
    # by its exact code or name.
    safe: ClassVar[bool] = True
    # An opt-in rule runs only when selected by its exact code or name.
    opt_in: ClassVar[bool] = False
    # A parallel rule runs with ``migrate --parallel`` (``RuleContext.parallel``), in place of
    # the rules it ``supersedes`` (their codes) where the target has its concepts.
    parallel: ClassVar[bool] = False
    supersedes: ClassVar[tuple[str, ...]] = ()
    # Whether a file the rule leaves as it is (``RuleContext.refuse``) holds the files it runs
    # with as they are too (``accrewrite.project``): it keeps its tensors where they were, which
    # migrated neighbours would not match. False where what it cannot migrate fails on the
    # target only where it runs, whatever its neighbours (a SyncBatchNorm built on XLA).
    refusal_holds_neighbours: ClassVar[bool] = True
    # Concepts the rule needs from a target profile: a target without them does not support
    # the rule, which does not run there (selected by its exact code, the command line says so
    # once per run).
    concepts: ClassVar[tuple[str, ...]] = ()
    # The concepts that only this rule asks for (a fused kernel's spelling), defined beside it
    # in place of the catalogue (``accrewrite.concepts``); ``concepts`` may name them.
    defines: ClassVar[tuple[Definition, ...]] = ()
    # The frameworks that manage their own training (``Facts.framework``) whose files the rule
    # migrates: the engine leaves such a file to the diagnostics and to the rules that manage it.
    manages: ClassVar[frozenset[str]] = frozenset()
    examples: ClassVar[tuple[Example, ...]] = ()
    # Words (names, attribute names, text in string literals) of which every statement the rule
    # changes, reports on or looks at mentions one: the rule is called only in those statements
    # (and in those that hold one), whatever the other rules' words. None: in every statement.
    triggers: ClassVar[frozenset[str] | None] = None
    # Node types that make a statement concern the rule whatever its words (an ``if`` for a rule
    # about control flow).
    trigger_nodes: ClassVar[tuple[type[cst.CSTNode], ...]] = ()
    # The frameworks that train by themselves (``Facts.framework``) that the rule migrates: in
    # their files only diagnostics and these rules run.
    manages: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, ctx: "RuleContext") -> None:
        self.ctx = ctx

    def applies(self) -> bool:
        """A cheap gate on ``self.ctx.facts``: False skips the rule for this file."""
        return True

    @classmethod
    def supported_targets(cls) -> list[str]:
        return [name for name, target in all_targets().items() if target.has(*cls.concepts)]

    @classmethod
    def diagnostic_only(cls) -> bool:
        """A rule that only reports: each of its examples changes nothing and lists findings."""
        return bool(cls.examples) and all(e.after == e.before and e.diagnostics for e in cls.examples)

    @classmethod
    def documentation(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")


@dataclass
class Finding:
    """A fix or diagnostic, attached to the original node until lines are resolved."""

    code: str
    name: str
    message: str
    node: cst.CSTNode
    line: int = 0
    col: int = 0  # 0-based, as libcst counts; the reports add 1
    end_line: int = 0  # where the node ends: diagnostics only
    end_col: int = 0
    # A diagnostic's why and what to do: its message states one fact, short enough for a line.
    help: str = ""
    cell: int = 0  # in a notebook, the cell (1-based) that ``line`` counts in; 0 elsewhere


def _end(module: cst.Module, finding: Finding) -> tuple[int, int]:
    """Where a finding's node ends (line 1-based, column 0-based, exclusive), from its code: a
    statement's code starts after its leading comment lines, and its body is indented from
    the statement's own column."""
    rows = code(module, finding.node).split("\n")[len(getattr(finding.node, "leading_lines", ())):]
    rows = "\n".join(rows).rstrip().split("\n")
    if len(rows) == 1:
        return finding.line, finding.col + len(rows[0])
    indent = finding.col if isinstance(finding.node, cst.BaseStatement) else 0
    return finding.line + len(rows) - 1, indent + len(rows[-1])


def excerpt(code: str, width: int = 40) -> str:
    """Source code quoted in a message: on one line, cut to ``width`` characters."""
    code = " ".join(code.split())
    return code if len(code) <= width else code[: width - 3] + "..."


# A libcst visitor, not a walk: comments lie in the whitespace, which ``nodes.children`` leaves out.
class _Comments(cst.CSTVisitor):
    """The comments of a module (a string that reads "# noqa" is not one)."""

    def __init__(self) -> None:
        self.found: list[cst.Comment] = []

    def visit_Comment(self, node: cst.Comment) -> None:
        self.found.append(node)


_NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.IGNORECASE)


def _codes(match: re.Match) -> list[str]:
    return re.split(r"[\s,]+", match.group("codes").upper())


@dataclass
class RuleContext:
    """Everything a rule reaches while a file is migrated."""

    module: cst.Module
    facts: Facts
    target: Target
    source_text: str
    parallel: str | None = None  # migrate --parallel: a kind of base/parallel_kinds.py
    # Why DistributedDataParallel stays, where the project's pass says so (``Options.keep_ddp``).
    keep_ddp: str | None = None
    # The codes of the rules that run on the file (selected, and the target has their concepts).
    running: frozenset[str] = frozenset()
    # What the rules' shared tools (``accrewrite.toolbox``) work out once for the file.
    shared: dict = field(default_factory=dict)
    # Kept by the batched transformer as it walks: enclosing functions, statements and
    # training loops, innermost last.
    scopes: list[cst.FunctionDef] = field(default_factory=list)
    open_statements: list[cst.CSTNode] = field(default_factory=list)
    loops: list = field(default_factory=list)
    fixes: list[Finding] = field(default_factory=list)
    diagnostics: list[Finding] = field(default_factory=list)
    # Import keys (target profile) that committed fixes need.
    imports: list[str] = field(default_factory=list)
    # Fixes a rule made but may not apply here (unsafe without permission): offered, not done.
    withheld: list[Finding] = field(default_factory=list)
    # Why the file cannot run on the target once migrated (``refuse``): it is left as it is.
    refusals: list[Finding] = field(default_factory=list)
    _rule: Rule | None = None
    _pending_fixes: list[Finding] = field(default_factory=list)
    _pending_imports: list[str] = field(default_factory=list)
    _pending_insertions: list[tuple[cst.CSTNode, str, list]] = field(default_factory=list)
    # Committed insertions: original statement -> (statements before it, statements after it).
    insertions: dict[cst.CSTNode, tuple[list, list]] = field(default_factory=dict)
    _positions: dict | None = None
    _noqa: dict[int, set[str]] | None = None
    _noqa_codes: frozenset[str] | None = None
    _parser_config: cst.PartialParserConfig | None = None

    # What rules call -------------------------------------------------------------------------

    @property
    def scope(self) -> cst.FunctionDef | None:
        """The innermost function being walked (None at module level)."""
        return self.scopes[-1] if self.scopes else None

    @property
    def statement(self) -> cst.CSTNode | None:
        """The innermost statement being walked (original node), for ``insert_before/after``."""
        return self.open_statements[-1] if self.open_statements else None

    @property
    def loop(self):
        """The innermost training loop (``facts.TrainingLoop``) being walked, else None."""
        return self.loops[-1] if self.loops else None

    @property
    def in_training(self) -> bool:
        """Inside a training loop or a function that a training loop calls for its step."""
        return bool(self.loops) or any(scope in self.facts.step_functions for scope in self.scopes)

    def insert_before(self, statement: cst.CSTNode, new: list[cst.BaseStatement]) -> None:
        """Add statements before a statement (an original node) that the walk has not left
        yet: one that encloses the current node (``self.statement``), or one still ahead, such
        as a later statement of a block being visited. Recorded as part of the current fix."""
        self._pending_insertions.append((statement, "before", list(new)))

    def insert_after(self, statement: cst.CSTNode, new: list[cst.BaseStatement]) -> None:
        """Add statements after a statement; see ``insert_before``."""
        self._pending_insertions.append((statement, "after", list(new)))

    def code(self, node: cst.CSTNode) -> str:
        """Source code of ``node`` (as the module would print it)."""
        return code(self.module, node)

    def concept(self, name: str) -> Concept:
        """The target's spelling of a concept; raises ConceptMissing where the target lacks it."""
        return self.target.concept(name)

    def expr(self, concept: str, **values: str) -> cst.BaseExpression:
        """The target's expression for ``concept``, its imports noted for this fix."""
        spelled = self.concept(concept)
        self._pending_imports.extend(spelled.imports)
        return snippets.expression(spelled.render_expr(**values), self._config())

    def statements(self, concept: str, **values: str) -> list[cst.BaseStatement]:
        """The target's statements for ``concept``, its imports noted for this fix."""
        spelled = self.concept(concept)
        self._pending_imports.extend(spelled.imports)
        config = self._config()
        return [snippets.statement(line, config) for line in spelled.render_stmts(**values)]

    def _config(self) -> cst.PartialParserConfig:
        # libcst works the module's configuration out again on each read
        if self._parser_config is None:
            self._parser_config = self.module.config_for_parsing
        return self._parser_config

    def fix(self, node: cst.CSTNode, message: str) -> None:
        """Record that the current rule changed ``node`` (an original node)."""
        rule = self._rule
        self._pending_fixes.append(Finding(rule.code, rule.name, message, node))

    def diagnose(self, node: cst.CSTNode, message: str, help: str = "") -> None:
        """Report something that needs a human at ``node`` (an original node): ``message`` is
        one fact (about 90 characters at most), ``help`` why it matters and what to do. The
        finding carries the current rule's code, so --select/--ignore/noqa act on what it shows."""
        rule = self._rule
        self.diagnostics.append(Finding(rule.code, rule.name, message, node, help=help))

    def refuse(self, node: cst.CSTNode, message: str, help: str = "") -> None:
        """Report that the file cannot be migrated to this target (``message`` says what stops
        it): no fix of the file is made, and this is its only finding. A ``# noqa`` for the
        rule on ``node``'s lines lets the migration go ahead."""
        rule = self._rule
        if not self.suppressed(rule.code, node):
            self.refusals.append(Finding(rule.code, rule.name, message, node, help=help))

    # What the batched transformer calls ----------------------------------------------------

    def end(self) -> None:
        """The file is done: let go of what refers back to this context and its facts (the last
        rule run, the data-flow analysis), so that the file's syntax tree is freed now, not
        when Python's cycle collector has walked it."""
        self._rule = None
        self.facts.forget_values()

    def begin(self, rule: Rule) -> None:
        self._rule = rule
        self._pending_fixes = []
        self._pending_imports = []
        self._pending_insertions = []

    @property
    def pending(self) -> bool:
        """Whether the current rule call recorded a fix."""
        return bool(self._pending_fixes)

    @property
    def pending_insertions(self) -> bool:
        return bool(self._pending_insertions)

    def commit(self) -> int:
        """Keep what the current rule call recorded; returns how many fixes."""
        self.fixes.extend(self._pending_fixes)
        self.imports.extend(key for key in self._pending_imports if key not in self.imports)
        for statement, where, new in self._pending_insertions:
            before, after = self.insertions.setdefault(statement, ([], []))
            placed = before if where == "before" else after
            # Rules that need the same line at the same place (an import) get it once.
            present = {self.code(line) for line in placed}
            placed.extend(line for line in new if self.code(line) not in present)
        return len(self._pending_fixes)

    def withhold(self) -> None:
        self.withheld.extend(self._pending_fixes)

    def suppressed(self, code: str, node: cst.CSTNode) -> bool:
        """Whether a ``# noqa: CODE`` comment on one of ``node``'s lines covers ``code``."""
        if self._noqa_codes is None:
            # Every code any "# noqa:" of the text names, strings included: a superset, found
            # without a walk, which spares most files and codes the comments' positions.
            self._noqa_codes = frozenset(
                code for match in _NOQA.finditer(self.source_text) for code in _codes(match)
            )
        if code not in self._noqa_codes:
            return False
        if self._noqa is None:
            self._noqa = {}
            # Comments only, as ruff reads them: "# noqa: X" inside a string suppresses nothing.
            comments = _Comments()
            self.module.visit(comments)
            for comment in comments.found:
                match = _NOQA.search(comment.value)
                if match:
                    self._noqa.setdefault(self.position(comment).start.line, set()).update(_codes(match))
        if not self._noqa:
            return False  # the codes were named in strings only: no node needs placing
        where = self.position(node)
        return any(code in self._noqa.get(line, ()) for line in range(where.start.line, where.end.line + 1))

    def position(self, node: cst.CSTNode):
        """The original node's code range, for noqa checks. Computed for every node at once,
        and only in a file that has a noqa comment for some code."""
        if self._positions is None:
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._positions = wrapper.resolve(PositionProvider)
        return self._positions[node]

    def resolve_lines(self, printed: bool = False) -> Printed | None:
        """Give every finding its line and column; drop diagnostics suppressed by noqa. With
        ``printed``, the module's whole print, from the same printing (else None)."""
        findings = (*self.fixes, *self.diagnostics, *self.withheld)
        nodes = (finding.node for finding in findings)
        found, whole = starts_and_code(self.module, nodes) if printed else (starts(self.module, nodes), None)
        for finding in findings:
            finding.line, finding.col = found[finding.node]
        self.diagnostics = [d for d in self.diagnostics if not self.suppressed(d.code, d.node)]
        for diagnostic in self.diagnostics:
            diagnostic.end_line, diagnostic.end_col = _end(self.module, diagnostic)
        self.fixes.sort(key=lambda f: (f.line, f.col))
        self.diagnostics.sort(key=lambda d: (d.line, d.col))
        return whole
