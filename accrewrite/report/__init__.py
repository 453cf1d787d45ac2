"""Printing a run's outcomes in each output format, as ruff's ``--output-format`` does.

``concise`` (also ``text``) and ``full`` go through rich to the terminal (``text.py``); the
machine formats print one document each: ``json``, ``github`` (workflow commands), ``gitlab``
(Code Quality JSON) and ``sarif`` (2.1.0).
"""

from __future__ import annotations

from types import MappingProxyType

from rich.console import Console

from accrewrite.report import github, gitlab, json_document, sarif, text
from accrewrite.runner import Outcome

MACHINE = MappingProxyType({"json": json_document.render, "github": github.render, "gitlab": gitlab.render, "sarif": sarif.render})


def report(outcomes: list[Outcome], mode: str, target: str, output_format: str, console: Console,
           statistics: bool = False, show_fixes: bool = False) -> None:
    """Print ``outcomes`` in ``output_format``; ``statistics`` prints counts per rule instead of
    the findings (JSON with ``json``, text otherwise), ``show_fixes`` adds the fixes per file."""
    if statistics:
        if output_format == "json":
            print(json_document.statistics(outcomes), flush=True)
        else:
            text.statistics(outcomes, console)
        return
    if output_format in MACHINE:
        document = MACHINE[output_format](outcomes, mode, target)
        if document:  # no annotations: no output at all
            print(document, flush=True)
        return
    text.render(outcomes, mode, target, console, full=output_format == "full", show_fixes=show_fixes)
