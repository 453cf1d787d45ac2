"""``--format sarif``: a SARIF 2.1.0 log. Diagnostics are warnings, pending fixes notes (errors
when checking), unreadable files tool execution notifications. Each rule carries its
documentation as ``help`` (Markdown); each diagnostic its own help in ``properties.help``."""

from __future__ import annotations

import json
import os
from pathlib import PurePath
from urllib.parse import quote

from accrewrite import __version__
from accrewrite.registry import all_rules
from accrewrite.report.findings import file_line, help_of, said_where
from accrewrite.runner import Outcome

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _uri(path: str) -> str:
    """A SARIF artifact location: a URI, so spaces, ``%``, ``#``, non-ASCII and undecodable
    bytes are percent-encoded (from the file name's own bytes)."""
    if PurePath(path).is_absolute():
        return PurePath(path).as_uri()
    return quote(os.fsencode(path.replace(os.sep, "/")), safe="/")


def _location(path: str, line: int, col: int | None = None) -> dict:
    region = {"startLine": max(line, 1)}
    if col is not None:
        region["startColumn"] = col + 1
    return {"physicalLocation": {"artifactLocation": {"uri": _uri(path)}, "region": region}}


def render(outcomes: list[Outcome], mode: str, target: str) -> str:
    rules = list(all_rules().values())
    index = {rule.code: position for position, rule in enumerate(rules)}
    results = []

    def result(o: Outcome, finding, level: str, message: str, col: int | None, help: str = "") -> dict:
        # In a notebook the region is the line of the file's JSON; the cell goes in properties.
        entry = {"ruleId": finding.code, "level": level, "message": {"text": said_where(finding, message)},
                 "locations": [_location(o.path, file_line(o, finding), None if finding.cell else col)]}
        if finding.code in index:
            entry["ruleIndex"] = index[finding.code]
        properties = {"help": help} if help else {}
        if finding.cell:
            properties.update(cell=finding.cell, line=finding.line)
        if properties:
            entry["properties"] = properties
        return entry

    for o in outcomes:
        if o.changed and mode in ("check", "diff"):
            level = "error" if mode == "check" else "note"
            results += [result(o, f, level, f"would migrate: {f.message}", 0) for f in o.fixes]
        results += [result(o, d, "warning", d.message, d.col, help_of(d)) for d in o.diagnostics]
    notifications = [
        {"level": "error", "message": {"text": o.error.reason}, "locations": [_location(o.path, o.error.line)]}
        for o in outcomes
        if o.error is not None
    ]
    driver_rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.documentation() or rule.summary},
            "help": {"text": rule.documentation() or rule.summary, "markdown": rule.documentation() or rule.summary},
        }
        for rule in rules
    ]
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "accrewrite", "version": __version__, "rules": driver_rules}},
                "invocations": [{"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}],
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2)
