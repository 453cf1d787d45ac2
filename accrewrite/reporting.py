"""Printing a run's outcomes: text (rich), json, github annotations, SARIF 2.1.0."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import PurePath
from urllib.parse import quote

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from accrewrite import __version__
from accrewrite.registry import all_rules
from accrewrite.runner import Outcome

FORMATS = ("text", "json", "github", "sarif")
JSON_VERSION = 1


@dataclass(frozen=True)
class Summary:
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
            files=len(outcomes),
            changed=sum(o.changed for o in outcomes),
            written=sum(o.written for o in outcomes),
            errors=sum(o.error is not None for o in outcomes),
            fixes=sum(len(o.fixes) for o in outcomes),
            diagnostics=sum(len(o.diagnostics) for o in outcomes),
            withheld=sum(len(o.withheld) for o in outcomes),
        )


def _error_line(outcome: Outcome) -> str:
    error = outcome.error
    where = f"{outcome.path}:{error.line}:{error.col + 1}" if error.line else outcome.path
    return f"{where}: error: {error.reason}"


_DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))


def coloured_diff(diff: str) -> Text:
    """A unified diff, coloured line by line (never cropped to the terminal's width)."""
    text = Text()
    for line in diff.splitlines(keepends=True):
        style = next((style for prefix, style in _DIFF_STYLES if line.startswith(prefix)), "")
        text.append(line, style=style)
    return text


def text(outcomes: list[Outcome], mode: str, target: str, console: Console) -> None:
    for outcome in outcomes:
        if outcome.diff and mode == "diff":
            console.print(coloured_diff(outcome.diff), soft_wrap=True, end="")
        elif outcome.changed and mode == "check":
            console.print(f"Would migrate: [bold]{escape(str(outcome.path))}[/] ({len(outcome.fixes)} fixes)", soft_wrap=True)
    for outcome in outcomes:
        for diagnostic in outcome.diagnostics:
            console.print(
                f"{escape(str(outcome.path))}:{diagnostic.line}:{diagnostic.col + 1}: "
                f"[bold yellow]{diagnostic.code}[/] {escape(diagnostic.message)}",
                highlight=False,
                soft_wrap=True,
            )
        if outcome.error is not None:
            console.print(f"[bold red]{escape(_error_line(outcome))}[/]", highlight=False, soft_wrap=True)
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
        console.print(f"{summary.withheld} more fixes are available with --unsafe-fixes (see `accrewrite explain`).")


def as_json(outcomes: list[Outcome], target: str) -> str:
    summary = Summary.of(outcomes)
    document = {
        "version": JSON_VERSION,
        "target": target,
        "files": [
            {
                "path": o.path,
                "changed": o.changed,
                "written": o.written,
                "error": None if o.error is None else {"message": o.error.reason, "line": o.error.line, "col": o.error.col},
                "fixes": [{"code": f.code, "name": f.name, "line": f.line, "message": f.message} for f in o.fixes],
                "diagnostics": [
                    {"code": d.code, "line": d.line, "col": d.col, "message": d.message} for d in o.diagnostics
                ],
            }
            for o in outcomes
        ],
        "summary": {
            "files": summary.files,
            "changed": summary.changed,
            "written": summary.written,
            "errors": summary.errors,
            "fixes": summary.fixes,
            "diagnostics": summary.diagnostics,
        },
    }
    return json.dumps(document, indent=2)


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def github(outcomes: list[Outcome], mode: str) -> str:
    """GitHub Actions workflow commands: one annotation per diagnostic, error and (when
    checking) per file that would change."""
    lines = []
    for o in outcomes:
        path = _escape_property(o.path)
        if o.error is not None:
            lines.append(f"::error file={path},line={o.error.line or 1},title=accrewrite::{_escape_data(o.error.reason)}")
        if o.changed and mode in ("check", "diff"):
            for fix in o.fixes:
                lines.append(
                    f"::{'error' if mode == 'check' else 'notice'} file={path},line={fix.line},"
                    f"title={fix.code} {fix.name}::{_escape_data('would migrate: ' + fix.message)}"
                )
        for d in o.diagnostics:
            lines.append(f"::warning file={path},line={d.line},col={d.col + 1},title={d.code}::{_escape_data(d.message)}")
    return "\n".join(lines)


def _uri(path: str) -> str:
    """A SARIF artifact location: a URI, so spaces, ``%``, ``#``, non-ASCII and undecodable
    bytes are percent-encoded (from the file name's own bytes)."""
    if PurePath(path).is_absolute():
        return PurePath(path).as_uri()
    return quote(os.fsencode(path.replace(os.sep, "/")), safe="/")


def sarif(outcomes: list[Outcome], mode: str) -> str:
    """A SARIF 2.1.0 log: diagnostics as warnings, pending fixes as notes (errors when
    checking), unreadable files as tool execution notifications."""
    rules = list(all_rules().values())
    index = {rule.code: position for position, rule in enumerate(rules)}
    results = []

    def result(code: str, level: str, message: str, path: str, line: int, col: int) -> dict:
        entry = {
            "ruleId": code,
            "level": level,
            "message": {"text": message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(path)},
                        "region": {"startLine": max(line, 1), "startColumn": col + 1},
                    }
                }
            ],
        }
        if code in index:
            entry["ruleIndex"] = index[code]
        return entry

    for o in outcomes:
        if o.changed and mode in ("check", "diff"):
            level = "error" if mode == "check" else "note"
            results += [result(f.code, level, f"would migrate: {f.message}", o.path, f.line, 0) for f in o.fixes]
        results += [result(d.code, "warning", d.message, o.path, d.line, d.col) for d in o.diagnostics]
    notifications = [
        {
            "level": "error",
            "message": {"text": o.error.reason},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(o.path)},
                        "region": {"startLine": max(o.error.line, 1)},
                    }
                }
            ],
        }
        for o in outcomes
        if o.error is not None
    ]
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "accrewrite",
                        "version": __version__,
                        "rules": [
                            {
                                "id": rule.code,
                                "name": rule.name,
                                "shortDescription": {"text": rule.summary},
                                "fullDescription": {"text": rule.documentation() or rule.summary},
                            }
                            for rule in rules
                        ],
                    }
                },
                "invocations": [
                    {"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}
                ],
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2)
