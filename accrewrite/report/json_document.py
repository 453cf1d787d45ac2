"""``--format json``: one document with every file's fixes, diagnostics (each with its help) and,
when previewing or checking, its diff. In a notebook, ``cell`` is the cell (1-based) that a
location's ``line`` counts in; null elsewhere."""

from __future__ import annotations

import json

from accrewrite.report.findings import Summary, counts, help_of
from accrewrite.runner import Outcome

JSON_VERSION = 2  # 2: columns count from 1, as in the other formats; end_location


def render(outcomes: list[Outcome], mode: str, target: str) -> str:
    summary = Summary.of(outcomes)
    document = {
        "version": JSON_VERSION,
        "target": target,
        "files": [
            {
                "path": o.path,
                "changed": o.changed,
                "written": o.written,
                "diff": o.diff,
                "error": None if o.error is None else {"message": o.error.reason, "line": o.error.line,
                                                       "col": o.error.col + 1, "cell": o.error.cell or None},
                "fixes": [{"code": f.code, "name": f.name, "line": f.line, "cell": f.cell or None, "message": f.message}
                          for f in o.fixes],
                "diagnostics": [
                    {"code": d.code, "line": d.line, "col": d.col + 1, "cell": d.cell or None,
                     "end_location": {"line": d.end_line, "col": d.end_col + 1},
                     "message": d.message, "help": help_of(d)}
                    for d in o.diagnostics
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


def statistics(outcomes: list[Outcome]) -> str:
    """``--statistics --format json``: a list of {code, name, kind, count}, as ruff's."""
    return json.dumps(
        [{"code": code, "name": name, "kind": kind, "count": count} for code, name, kind, count in counts(outcomes)],
        indent=2,
    )
