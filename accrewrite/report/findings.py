"""What the output formats share: counts, the help of a finding, repeats within a file."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from accrewrite.registry import all_rules
from accrewrite.rule import Finding
from accrewrite.runner import Outcome


@dataclass(frozen=True)
class Summary:
    """A run's totals: the summary table's row, the JSON document's ``summary``."""

    files: int
    changed: int
    written: int
    errors: int
    fixes: int
    diagnostics: int
    withheld: int

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> "Summary":
        return cls(
            files=sum(o.file for o in outcomes),
            changed=sum(o.changed for o in outcomes),
            written=sum(o.written for o in outcomes),
            errors=sum(o.error is not None for o in outcomes),
            fixes=sum(len(o.fixes) for o in outcomes),
            diagnostics=sum(len(o.diagnostics) for o in outcomes),
            withheld=sum(len(o.withheld) for o in outcomes),
        )


def help_of(finding: Finding) -> str:
    """Why a finding matters and what to do: its own help, else its rule's summary."""
    if finding.help:
        return finding.help
    rule = all_rules().get(finding.code)
    return f"{rule.summary}." if rule is not None else ""


def error_location(outcome: Outcome) -> str:
    error = outcome.error
    return f"{outcome.path}:{in_cell(error.cell)}{error.line}:{error.col + 1}" if error.line else outcome.path


def in_cell(cell: int) -> str:
    """A location's cell, as ruff writes a notebook's locations (``nb.ipynb:cell 3:2:8``)."""
    return f"cell {cell}:" if cell else ""


def file_line(outcome: Outcome, finding: Finding) -> int:
    """The line of the file a finding is on: in a notebook, the line of its JSON."""
    return outcome.file_lines.get((finding.cell, finding.line), finding.line)


def said_where(finding: Finding, message: str) -> str:
    """A message for the formats that point into the file: in a notebook, it names the cell."""
    return f"cell {finding.cell}, line {finding.line}: {message}" if finding.cell else message


def repeats(diagnostics: list[Finding]) -> list[tuple[Finding, list[Finding]]]:
    """Each distinct (code, message) of one file's diagnostics once, in order, with its later
    occurrences: a finding on many lines is told once."""
    groups: dict[tuple[str, str], tuple[Finding, list[Finding]]] = {}
    for diagnostic in diagnostics:
        key = (diagnostic.code, diagnostic.message)
        if key in groups:
            groups[key][1].append(diagnostic)
        else:
            groups[key] = (diagnostic, [])
    return list(groups.values())


def counts(outcomes: list[Outcome]) -> list[tuple[str, str, str, int]]:
    """(code, name, kind, count) per rule over every fix and diagnostic, most frequent first."""
    found: Counter = Counter()
    for outcome in outcomes:
        found.update((f.code, "fix") for f in outcome.fixes)
        found.update((d.code, "diagnostic") for d in outcome.diagnostics)
    rules = all_rules()
    return [(code, rules[code].name if code in rules else "", kind, count)
            for (code, kind), count in sorted(found.items(), key=lambda item: (-item[1], item[0]))]
