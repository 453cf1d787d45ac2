"""The text formats: ``concise`` (one line a finding) and ``full`` (with the source line and
the help), the diffs, ``--statistics``, ``--show-fixes`` and the summary table."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from accrewrite.plural import counted
from accrewrite.report.findings import Summary, counts, error_location, help_of, in_cell, repeats
from accrewrite.rule import Finding
from accrewrite.runner import Outcome

# Line numbers named when a finding repeats; more are counted.
SHOWN_REPEATS = 5

_DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))


def print_diff(diff: str, console: Console) -> None:
    """A unified diff, coloured line by line where the console has colours (never cropped to the
    terminal's width); elsewhere (a pipe, a file, a CI log) written as it is: rich's rendering,
    for nothing to colour, would cost more than the rest of the report."""
    if console.color_system is None:
        try:
            console.file.write(diff)
        except BrokenPipeError:
            console.on_broken_pipe()
        return
    text = Text()
    for line in diff.splitlines(keepends=True):
        style = next((style for prefix, style in _DIFF_STYLES if line.startswith(prefix)), "")
        text.append(line, style=style)
    console.print(text, soft_wrap=True, end="")


def _also(later: list[Finding]) -> str:
    if not later:
        return ""
    lines = ", ".join(str(d.line) for d in later[:SHOWN_REPEATS])
    more = f" and {len(later) - SHOWN_REPEATS} more" if len(later) > SHOWN_REPEATS else ""
    return f" [dim](also on line{'s' if len(later) > 1 else ''} {lines}{more})[/]"


def _location(outcome: Outcome, finding: Finding) -> str:
    return f"{escape(outcome.path)}:{in_cell(finding.cell)}{finding.line}:{finding.col + 1}:"


def _concise(outcome: Outcome, console: Console) -> None:
    for first, later in repeats(outcome.diagnostics):
        console.print(
            f"{_location(outcome, first)} [bold red]{first.code}[/] {escape(first.message)}{_also(later)}",
            highlight=False, soft_wrap=True,
        )


def _full(outcome: Outcome, console: Console) -> None:
    """As ruff's full format: the finding, its source line with a caret, then its help (once for
    a finding that repeats, message and help)."""
    told: dict[tuple[str, str, str], int] = {}
    for d in outcome.diagnostics:
        console.print(f"{_location(outcome, d)} [bold red]{d.code}[/] {escape(d.message)}",
                      highlight=False, soft_wrap=True)
        source = outcome.lines.get((d.cell, d.line))
        if source is not None:
            gutter = " " * len(str(d.line))
            console.print(f"{gutter} |\n{d.line} | {escape(source)}\n{gutter} | {' ' * d.col}[bold red]^[/]",
                          highlight=False, soft_wrap=True)
        key = (d.code, d.message, d.help)
        if key in told:
            console.print(f"  = help: as on line {told[key]}", highlight=False, soft_wrap=True)
        else:
            told[key] = d.line
            console.print(f"  = help: {escape(help_of(d))}", highlight=False, soft_wrap=True)
        console.print()


def render(outcomes: list[Outcome], mode: str, target: str, console: Console, full: bool = False,
           show_fixes: bool = False) -> None:
    for outcome in outcomes:
        if outcome.diff and mode == "diff":
            print_diff(outcome.diff, console)
        elif outcome.changed and mode == "check":
            console.print(f"Would migrate: [bold]{escape(outcome.path)}[/] ({counted(len(outcome.fixes), 'fix', 'fixes')})",
                          soft_wrap=True)
    for outcome in outcomes:
        (_full if full else _concise)(outcome, console)
        if outcome.error is not None:
            console.print(f"[bold red]{escape(error_location(outcome))}: error: {escape(outcome.error.reason)}[/]",
                          highlight=False, soft_wrap=True)
    if show_fixes:
        _show_fixes(outcomes, mode, console)
    _summary(outcomes, mode, target, console)


def _show_fixes(outcomes: list[Outcome], mode: str, console: Console) -> None:
    """The fixes per file and rule, as ruff's --show-fixes lists them."""
    fixed = [o for o in outcomes if o.changed and o.fixes]
    if not fixed:
        return
    total = sum(len(o.fixes) for o in fixed)
    verb = "Applied" if mode in ("in-place", "output-dir") else "Would apply"
    console.print(f"{verb} {counted(total, 'fix', 'fixes')} in {counted(len(fixed), 'file')}:", highlight=False)
    for outcome in fixed:
        console.print(f"- {escape(outcome.path)}:", highlight=False, soft_wrap=True)
        for (code, name), count in sorted(Counter((f.code, f.name) for f in outcome.fixes).items()):
            console.print(f"    {count} × {code} ({name})", highlight=False)


def _summary(outcomes: list[Outcome], mode: str, target: str, console: Console) -> None:
    summary = Summary.of(outcomes)
    table = Table(title=f"accrewrite migrate (target {target})", title_justify="left")
    for column in ("files", "changed", "fixes", "diagnostics", "errors"):
        table.add_column(column, justify="right")
    writes = mode in ("in-place", "output-dir")
    table.add_row(
        str(summary.files),
        f"{summary.changed}" + (f" ({summary.written} written)" if writes and summary.changed else ""),
        str(summary.fixes),
        str(summary.diagnostics),
        f"[red]{summary.errors}[/]" if summary.errors else "0",
    )
    console.print(table)
    if summary.withheld:
        console.print(f"{counted(summary.withheld, 'more fix is', 'more fixes are')} available with --unsafe-fixes "
                      "(see `accrewrite explain`).")


def statistics(outcomes: list[Outcome], console: Console) -> None:
    """Counts per rule, one line each, as ruff's --statistics: count, code, name, kind."""
    rows = [(str(count), code, name, kind) for code, name, kind, count in counts(outcomes)]
    errors = Summary.of(outcomes).errors
    if errors:
        rows.append((str(errors), "error", "files that could not be migrated", ""))
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(3)]
    for count, code, name, kind in rows:
        line = f"{count:>{widths[0]}}  {code:<{widths[1]}}  {name:<{widths[2]}}  {kind}"
        console.print(escape(line.rstrip()), highlight=False, soft_wrap=True)
