"""Migrating one file's source: pre-filter, check against the limits (``accrewrite.limits``),
parse (with what libcst misreads put as Python reads it, ``accrewrite.normalize``), analyse, run
the rules, print, verify.

Everything here works on bytes in and bytes out, so that encoding (coding cookie, BOM) and newline
style survive untouched: libcst decodes with the file's own declared encoding and prints back in
it. Nothing here touches the file system (see ``accrewrite.runner``).
"""

from __future__ import annotations

import ast
import re
import tokenize
from dataclasses import dataclass, field
from io import BytesIO

import libcst as cst

from accrewrite import limits, normalize, parsing, reduction, unbound
from accrewrite.analysis import analyze
from accrewrite.facts import Facts, Triggers
from accrewrite.errors import FileError, MigrationError
from accrewrite.guard import Guard
from accrewrite.imports import add_imports
from accrewrite.nodes import remembering_children
from accrewrite.positions import code_reusing, starts
from accrewrite.registry import Selection, all_rules, select, selected_exactly
from accrewrite.rule import Finding, Rule, RuleContext, excerpt
from accrewrite.targets import DEFAULT_TARGET, Target, get_target
from accrewrite.transform import BatchedTransformer, RuleBug, walked_types

SKIP_FILE = re.compile(rb"#\s*accrewrite:\s*skip-file")
# A file that never names torch, CUDA, a CUDA extension it imports (dcn_v2, ACC026), a Trainer
# (Hugging Face's, ACC017: a fine-tuning script need not import torch) or a framework that trains
# by itself (Lightning, Accelerate: ACC018, ACC019) cannot concern a training script migration.
_RELEVANT = re.compile(rb"torch|cuda|dcn_v2|Trainer|lightning|\baccelerate\b")


@dataclass(frozen=True)
class Options:
    target: str = DEFAULT_TARGET
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    guard: str | None = None
    parallel: str | None = None  # --parallel: a kind of base/parallel_kinds.py
    # Why DistributedDataParallel stays (the project's pass: the module that steps does not reduce).
    keep_ddp: str | None = None

    def selection(self) -> Selection:
        chosen = select(list(self.select), list(self.ignore), self.unsafe_fixes)
        if self.parallel is None:
            return chosen
        # The parallel rules run; where the target has accelerate(), in place of the rules they
        # replace (DDP unwrapping, gradient all-reduce: FSDP2 reduces); elsewhere they only say so.
        parallel = [rule for rule in all_rules().values() if rule.parallel]
        replaced = set()
        if get_target(self.target).has(*{c for rule in parallel for c in rule.concepts}):
            replaced = {code for rule in parallel for code in rule.supersedes}
        rules = [r for r in chosen.rules if r.code not in replaced and not r.parallel] + parallel
        return Selection(tuple(sorted(rules, key=lambda r: r.code)), chosen.withheld)

    def unavailable(self) -> list[type[Rule]]:
        """The rules selected by their exact code or name that the target cannot run (it lacks
        their concepts): they do not run, and the command line says so once."""
        target = get_target(self.target)
        return [rule for rule in self.selection().rules
                if not _runs_on(rule, target) and selected_exactly(rule, self.select)]


@dataclass
class FileResult:
    path: str
    source: bytes
    output: bytes
    fixes: list[Finding] = field(default_factory=list)
    diagnostics: list[Finding] = field(default_factory=list)
    withheld: list[Finding] = field(default_factory=list)
    error: FileError | None = None
    # A rule left the file as it is (``RuleContext.refuse``): its diagnostics say why.
    refused: bool = False
    # The output drops a DistributedDataParallel wrap and steps no optimizer itself: the
    # gradients are to be reduced where another module steps (``accrewrite.project``).
    drops_ddp_alone: bool = False

    @property
    def changed(self) -> bool:
        return self.error is None and self.output != self.source


def _decode(source: bytes) -> str:
    """The source as text, in its declared encoding, or a MigrationError saying where and why."""
    try:
        encoding, _ = tokenize.detect_encoding(BytesIO(source).readline)
    except SyntaxError as exc:
        raise MigrationError(FileError(f"cannot decode: {exc.msg}; fix the coding cookie", exc.lineno or 0)) from None
    try:
        return source.decode(encoding)
    except UnicodeDecodeError as exc:
        line = source.count(b"\n", 0, exc.start) + 1
        raise MigrationError(
            FileError(
                f"cannot decode as {encoding}: byte {source[exc.start]:#04x} is invalid; "
                f"declare the file's real encoding in a coding cookie or convert it to UTF-8",
                line,
            )
        ) from None


def _parse(source: bytes) -> cst.Module:
    try:
        return parsing.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise MigrationError(FileError(
            f"libcst cannot parse this line, though Python can ({exc.message.splitlines()[0]}); "
            "please report it with the file", exc.raw_line, exc.raw_column,
        )) from None


def _round_trips(printed: bytes, source: bytes) -> None:
    """libcst must print the file back byte for byte (``printed``: the parsed file printed), or a
    rewrite would change more than its rules did."""
    if printed == source:
        return
    before, after = source.splitlines(), printed.splitlines()
    line = next((n for n, (a, b) in enumerate(zip(before, after), start=1) if a != b), min(len(before), len(after)) + 1)
    raise MigrationError(FileError(
        "libcst does not print this line back as it reads it; the file was left unchanged; "
        "please report it with the file", line,
    ))


def _verify(original: ast.Module, output: bytes, path: str) -> ast.Module:
    """The rewrite must compile, as the original does (``original``, its syntax tree): anything
    else is a rule's bug, and the file is left as it was. (CPython's compiler may give up on
    nesting its parser took: RecursionError, MemoryError.) The rewrite's syntax tree, parsed once
    for the compiler and the net."""
    try:
        tree = _syntax(output, path)
        compile(tree, path, "exec", dont_inherit=True)
        return tree
    except (SyntaxError, RecursionError, MemoryError) as exc:
        limits.compiles(original, path)  # the user's own error first
        raise MigrationError(
            FileError(
                f"internal error: the migration produced code that does not compile "
                f"({getattr(exc, 'msg', None) or type(exc).__name__}); "
                "the file was left unchanged; please report it with the file",
                getattr(exc, "lineno", None) or 0,
            )
        ) from None


def _syntax(code: bytes, path: str) -> ast.Module:
    return compile(code, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)


@limits.on_deep_stack
def _checked(source: bytes, tree: ast.Module, output: bytes, path: str, options: Options,
             selection: Selection, fixes: list[Finding]) -> bool:
    """The source and its rewrite compile (``_verify``), the rewrite reads no name unbound that the
    source bound (``_no_name_left_unbound``), and drops no DDP wrap with a step left unreduced
    (``reduction``); ``tree`` is the source's syntax tree. Whether it drops a DDP wrap and
    steps no optimizer itself (``FileResult.drops_ddp_alone``)."""
    output_tree = _verify(tree, output, path)
    _no_name_left_unbound(source, tree, output, output_tree, path, options, selection, fixes)
    return reduction.no_step_left_unreduced(source, tree, output_tree, selection, fixes,
                                            lambda rest: _migrate(source, options, rest))


def _no_name_left_unbound(source: bytes, tree: ast.Module, output: bytes, output_tree: ast.Module, path: str,
                          options: Options, selection: Selection, fixes: list[Finding]) -> None:
    """The net (``accrewrite.unbound``): an output that reads a name unbound where the input
    (``tree``: its syntax tree) bound it, or on a path where the input's scope never does, is
    refused, naming the rule whose fixes do it: the one whose removal (the migration run again
    without it, only when the net trips) leaves the name bound."""
    # The guard's ``if enabled():`` blocks test one environment variable, the same each time.
    steady = frozenset({get_target(options.target).guard_function}) if options.guard else frozenset()
    after = unbound.reads(output_tree, steady)
    if not after:
        return
    before = unbound.reads_to_compare(tree, after, steady)
    new = unbound.excess(before, after)
    if not new:
        return
    kind, name = new[0]
    line, code = unbound.locate(new[0], after, _decode(source), _decode(output))

    def clears(rule) -> bool:
        rest = Selection(tuple(r for r in selection.rules if r is not rule), selection.withheld)
        again = _migrate(source, options, rest)
        rewritten = source if again is None else again[0]
        return (kind, name) not in unbound.excess(before, unbound.reads(_syntax(rewritten, path), steady))

    by_code = {rule.code: rule for rule in selection.rules}
    fixing = [by_code[code] for code in dict.fromkeys(fix.code for fix in fixes)]
    culprit = next(
        (f"{rule.code} {rule.name}" for rule in fixing if clears(rule)),
        f"rules {', '.join(rule.code for rule in fixing)} together",
    )
    written = f", where it writes `{excerpt(code, 60)}`" if code else ""
    path_of = " on a path that skips its binding" if kind.startswith(unbound.ON_A_PATH) else ""
    raise MigrationError(FileError(
        f"{unbound.REFUSAL} {name!r} unbound at line {line}{path_of}{written} ({culprit}); "
        "the file was left unchanged; please report it with the file", line,
    ))


def _written_for_this_target(module: cst.Module, facts: Facts, target: str) -> None:
    """A file that imports another target's modules (migrated to it, or written for it) is
    refused: migrating it again would leave it half in one target and half in the other, their
    spellings differing beyond the imports (the device, the step's end, AMP, fused modules)."""
    other = next((name for name in facts.target_imports if name != target), None)
    if other is None:
        return
    node = facts.target_imports[other]
    line = starts(module, [node])[node][0]
    raise MigrationError(FileError(
        f"the file is written for target {other!r}, not {target!r} (line {line}: "
        f"`{excerpt(module.code_for_node(node), 60)}`); migrate the original script with --target {target}, "
        f"or keep --target {other}", line,
    ))


def migrate_source(source: bytes, path: str = "<string>", options: Options = Options()) -> FileResult:
    """Migrate one file's bytes. Never raises for bad input: errors land in ``result.error``."""
    result = FileResult(path=path, source=source, output=source)
    try:
        _decode(source)
        if SKIP_FILE.search(source) or not _RELEVANT.search(source):
            return result
        tree = limits.check(source, path)
        selection = options.selection()
        migrated = _migrate(source, options, selection)
        if migrated is None or migrated[0] == source:
            limits.compiles(tree, path)  # a rewrite is compiled with its source in _checked
        if migrated is not None:
            output, ctx = migrated
            if output != source:
                checked = _checked(source, tree, output, path, options, selection, ctx.fixes)
                result.drops_ddp_alone = checked
            result.output = output
            result.fixes, result.diagnostics, result.withheld = ctx.fixes, ctx.diagnostics, ctx.withheld
            result.refused = bool(ctx.refusals)
    except MigrationError as exc:
        result.error = exc.error
    except Exception as bug:  # noqa: BLE001 - a rule's bug must not stop the other files
        detail = str(bug).splitlines()[0] if str(bug) else ""
        detail = detail if len(detail) <= 160 else detail[:157] + "..."  # a syntax tree's repr runs to pages
        result.error = FileError(
            f"internal error ({type(bug).__name__}: {detail}); the file was left unchanged; please report it with the file"
        )
    return result


def _runs_on(rule: type[Rule], target: Target) -> bool:
    """A rule runs where the target has its concepts; elsewhere it has nothing to write and says
    nothing. The parallel rules run wherever --parallel asks for them: ACC030 says what the
    target has instead."""
    return rule.parallel or target.has(*rule.concepts)


@limits.on_deep_stack
def _migrate(original: bytes, options: Options, selection: Selection) -> tuple[bytes, RuleContext] | None:
    """The migrated bytes and the rules' findings, or None when no rule applies."""
    with remembering_children():
        return _migrate_tree(original, options, selection)


def _migrate_tree(original: bytes, options: Options, selection: Selection) -> tuple[bytes, RuleContext] | None:
    source, restore = normalize.for_libcst(original)
    module = _parse(source)
    text = _decode(source)
    facts = analyze(module, Triggers.of(tuple(selection.rules)), walked_types(tuple(selection.rules)), text)
    _written_for_this_target(module, facts, options.target)
    # Names a function binds (``autocast = ...``) would shadow a target's import of that name.
    in_functions = frozenset().union(*(names for body, names in facts.file.local_names.items() if body is not module))
    target = get_target(options.target).clear_of(facts.file.imports, in_functions)
    running = frozenset(rule.code for rule in selection.rules if _runs_on(rule, target))
    ctx = RuleContext(module=module, facts=facts, target=target, source_text=text, parallel=options.parallel,
                      keep_ddp=options.keep_ddp, running=running)
    try:
        return _run_rules(ctx, options, selection, original, source, restore)
    finally:
        ctx.end()


def _run_rules(ctx: RuleContext, options: Options, selection: Selection, original: bytes, source: bytes,
               restore) -> tuple[bytes, RuleContext] | None:
    module, facts, target = ctx.module, ctx.facts, ctx.target
    runnable = [cls for cls in selection.rules if _runs_on(cls, target)]
    rules = [rule for rule in (cls(ctx) for cls in runnable) if rule.applies()]
    if facts.framework is not None:
        # The framework trains by itself: only the rules that report, and those that migrate it.
        rules = [rule for rule in rules if rule.diagnostic_only() or facts.framework in rule.manages]
    if not rules:
        return None
    guard = Guard(options.guard, target.guard_function) if options.guard else None
    migrated = BatchedTransformer(ctx, rules, selection.withheld, guard).rewrite(module)
    if ctx.insertions:
        raise RuleBug("a rule inserted next to a statement the walk had already left")
    if ctx.refusals:
        ctx.fixes, ctx.withheld, ctx.diagnostics = [], [], ctx.refusals
        ctx.resolve_lines()
        return original, ctx
    import_lines = [target.import_line(key) for key in ctx.imports]
    if guard is not None:
        migrated = guard.finish(migrated, facts, import_lines)
    elif import_lines:
        migrated = add_imports(migrated, facts, import_lines)
    if migrated is module:
        ctx.resolve_lines()
        return restore(source), ctx
    # The findings' lines come from a print of the parsed file: printed whole, it also shows
    # whether libcst prints the file back as it read it, and gives the statements that the
    # rewrite kept their print.
    printed = ctx.resolve_lines(printed=True)
    output = code_reusing(migrated, printed)
    if output != source:
        _round_trips(printed.text.encode(module.encoding), source)
    return restore(output), ctx
