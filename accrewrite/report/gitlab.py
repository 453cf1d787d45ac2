"""``--format gitlab``: a GitLab Code Quality report (a JSON list of issues), as ruff writes it.

Paths are relative to ``CI_PROJECT_DIR`` when it is set (GitLab resolves them from the
repository root). In a notebook an issue is on the line of the file's JSON that holds its line
of code, and its description names the cell. A fingerprint hashes the path, code, message and the occurrence's rank among
equal ones, so it stays put when lines move and differs between repeats.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter

from accrewrite.report.findings import file_line, help_of, said_where
from accrewrite.runner import Outcome


def _path(path: str) -> str:
    root = os.environ.get("CI_PROJECT_DIR")
    if root and os.path.abspath(path).startswith(os.path.abspath(root) + os.sep):
        return os.path.relpath(path, root)
    return path


def render(outcomes: list[Outcome], mode: str, target: str) -> str:
    issues = []
    seen: Counter = Counter()

    def issue(check: str, description: str, severity: str, path: str, line: int, content: str = "") -> None:
        key = (path, check, description)
        seen[key] += 1
        fingerprint = hashlib.sha256(repr((*key, seen[key])).encode("utf-8", "surrogateescape")).hexdigest()
        entry = {
            "description": description,
            "check_name": check,
            "fingerprint": fingerprint,
            "severity": severity,
            "location": {"path": _path(path), "lines": {"begin": max(line, 1)}},
        }
        if content:
            entry["content"] = {"body": content}
        issues.append(entry)

    for o in outcomes:
        if o.error is not None:
            issue("error", o.error.reason, "blocker", o.path, o.error.line)
        if o.changed and mode in ("check", "diff"):
            for f in o.fixes:
                issue(f.code, f"{f.code} {said_where(f, 'would migrate: ' + f.message)}", "major", o.path,
                      file_line(o, f))
        for d in o.diagnostics:
            issue(d.code, f"{d.code} {said_where(d, d.message)}", "minor", o.path, file_line(o, d), help_of(d))
    return json.dumps(issues, indent=2)
