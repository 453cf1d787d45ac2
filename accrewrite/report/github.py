"""``--format github``: GitHub Actions workflow commands (``::warning file=...::message``), one
annotation per diagnostic, per file error and, when checking, per fix that would be made. In a
notebook an annotation sits on the line of the file's JSON that holds its line of code, and its
message names the cell and the line in it."""

from __future__ import annotations

from accrewrite.report.findings import file_line, said_where
from accrewrite.runner import Outcome


def escape_data(value: str) -> str:
    """A command's message: ``%``, CR and LF percent-encoded (GitHub's toolkit escapeData)."""
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    """A property value (file, title): also ``:`` and ``,``, which end a value (escapeProperty)."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, **properties) -> str:
    listed = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items())
    return f"::{level} {listed}::{escape_data(message)}"


def render(outcomes: list[Outcome], mode: str, target: str) -> str:
    lines = []
    for o in outcomes:
        if o.error is not None:
            lines.append(command("error", o.error.reason, file=o.path, line=o.error.line or 1, title="accrewrite"))
        if o.changed and mode in ("check", "diff"):
            level = "error" if mode == "check" else "notice"
            lines += [command(level, said_where(f, f"would migrate: {f.message}"), file=o.path, line=file_line(o, f),
                              title=f"{f.code} {f.name}") for f in o.fixes]
        lines += [command("warning", said_where(d, d.message), file=o.path, line=file_line(o, d),
                          **({} if d.cell else {"col": d.col + 1}), title=d.code)
                  for d in o.diagnostics]
    return "\n".join(lines)
