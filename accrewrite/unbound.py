"""The net under every migration: a name that the output reads before binding it, where the input
bound it, is a rule's bug, and the file is refused.

pyflakes reads both sides (an ``ast`` each), and its undefined-name messages are compared per
(message kind, name): a name the input already reads unbound somewhere (a star import's, one
that ``exec`` binds, a plain undefined one) is not blamed on the migration, however often the
output reads it. (Counting the reads would blame every read of an ``exec``-bound name a rule
writes, and a file that already fails on the name: an input that reads ``model`` before
``model = DDP(model)`` binds it, whose unwrapping leaves ``model`` unbound further down.)

What it catches, as pyflakes resolves names: at module level and in class bodies, a name read
above the statement that first binds it, or no longer bound at all (module level is read in
source order: a loop rewritten to read ``device`` above ``device = ...``); in a function, a local
read before the function assigns it (``UndefinedLocal`` where an enclosing scope binds the name
too) and a name that no scope binds any more (a removed import or assignment).

What it does not: a name the input already reads unbound anywhere; a name bound in only one
branch of an ``if``/``try`` or only in a loop's body (any binding in a scope counts, whatever
the path to it); a function reading a module-level name that is bound after the call that runs
it (functions are read at the end of the module); names of a file with a star import (pyflakes
says "may be undefined" there); attributes, values and types.
"""

from __future__ import annotations

import ast
import difflib
import re

from pyflakes import checker, messages

# Where a reason starts so, the net refused the file (benchmarks count such refusals apart).
REFUSAL = "internal error: the migration leaves"

_KINDS = (messages.UndefinedName, messages.UndefinedLocal)


Read = tuple[str, str, int]  # pyflakes message kind, name, line


def reads(tree: ast.Module) -> list[Read]:
    """Each read of an unbound name."""
    flakes = checker.Checker(tree, withDoctest=False)
    found = [(type(m).__name__, m.message_args[0], m.lineno) for m in flakes.messages if isinstance(m, _KINDS)]
    # The checker and its scopes refer to each other and hold the syntax tree: cleared, they are
    # freed now, rather than by the cycle collector walking them all later.
    getattr(flakes, "_nodeHandlers", {}).clear()
    for scope in flakes.deadScopes:
        scope.clear()
    return found


def excess(before: list[Read], after: list[Read]) -> list[tuple[str, str]]:
    """The (kind, name) pairs that ``after`` reads unbound and ``before`` never does, in the
    order of their first read."""
    known = {(kind, name) for kind, name, _ in before}
    return list(dict.fromkeys((kind, name) for kind, name, _ in after if (kind, name) not in known))


def locate(key: tuple[str, str], after: list[Read], source: str, output: str) -> tuple[int, str | None]:
    """Where the migration made ``key``'s first unbound read: a line of ``source``, and the
    output's code there when the migration wrote that line (None when the line is the source's
    own: a binding above it went)."""
    index = next(line for kind, name, line in after if (kind, name) == key) - 1
    new_lines = _lines(output)
    blocks = difflib.SequenceMatcher(None, _lines(source), new_lines, autojunk=False).get_opcodes()
    tag, i1, i2, j1, _ = next(block for block in blocks if block[3] <= index < block[4])
    if tag == "equal":
        return i1 + index - j1 + 1, None
    # A rewritten line sits against the source line it replaced, an inserted one against the
    # line it was inserted before.
    return i1 + min(index - j1, max(i2 - i1 - 1, 0)) + 1, new_lines[index].strip()


def _lines(text: str) -> list[str]:
    # Python's line breaks only, as pyflakes counts lines: str.splitlines also breaks at form
    # feeds and U+2028.
    return re.split(r"\r\n?|\n", text)
