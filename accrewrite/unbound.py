"""The net under every migration: a name that the output reads before binding it, where the input
bound it, is a rule's bug, and the file is refused.

Two checks read both sides (an ``ast`` each), and what they find is compared per (kind, name): a
name the input already reads unbound in the same way is not blamed on the migration, however
often the output reads it. (Counting the reads would blame every read of an ``exec``-bound name a
rule writes, and a file that already fails on the name: an input that reads ``model`` before
``model = DDP(model)`` binds it, whose unwrapping leaves ``model`` unbound further down.)

- pyflakes' undefined-name messages (kind: the message's): at module level and in class bodies,
  a name read above the statement that first binds it, or no longer bound at all (module level
  is read in source order: a loop rewritten to read ``device`` above ``device = ...``); in a
  function, a local read before the function assigns it (``UndefinedLocal`` where an enclosing
  scope binds the name too) and a name that no scope binds any more (a removed import or
  assignment). A name the input reads unbound anywhere is not the migration's.
- Definite assignment (``accrewrite.definite``; kind: the scope): a read of a scope's own name
  on a path that skips every binding of it, which pyflakes does not follow (any binding in a
  scope counts for it, whatever the path): a device bound only in a resume branch, only in a
  loop's body or a ``try`` body, or only below the read. Compared per scope, so that a script's
  own read of a rank-0-only ``writer`` does not hide a new read of ``loc`` in that function; a
  name pyflakes finds the input reading unbound is the input's in any scope. Each check reads
  the input only where the output has findings of its kind that may be new.

What neither does: a function reading a module-level name that is bound after the call that runs
it (functions are read at the end of the module); names of a file with a star import (pyflakes
says "may be undefined" there, and any name may be bound); attributes, values and types.
"""

from __future__ import annotations

import ast
import difflib
import re

from pyflakes import checker, messages

from accrewrite import definite

# Where a reason starts so, the net refused the file (benchmarks count such refusals apart).
REFUSAL = "internal error: the migration leaves"

_KINDS = (messages.UndefinedName, messages.UndefinedLocal)


Read = tuple[str, str, int]  # kind (pyflakes' message, or ON_A_PATH and the scope), name, line
# The kind of a read definite assignment finds starts so.
ON_A_PATH = "unbound on a path in "


def reads(tree: ast.Module, steady: frozenset[str] = frozenset()) -> list[Read]:
    """Each read of an unbound name, by pyflakes and by definite assignment. ``steady``: the
    functions whose call a test may repeat with the same answer (the guard's)."""
    return _flakes(tree) + _on_a_path(tree, steady)


def reads_to_compare(tree: ast.Module, after: list[Read], steady: frozenset[str] = frozenset()) -> list[Read]:
    """The input's reads that ``after``'s (the output's) are compared with: definite
    assignment's where ``after`` has some, and pyflakes' where some of ``after`` are new
    without them (pyflakes' own, or a read on a path that a name the input reads unbound may
    cover)."""
    flow = any(kind.startswith(ON_A_PATH) for kind, _, _ in after)
    before = _on_a_path(tree, steady) if flow else []
    return _flakes(tree) + before if excess(before, after) else before


def _on_a_path(tree: ast.Module, steady: frozenset[str]) -> list[Read]:
    return [(ON_A_PATH + scope, name, line) for scope, name, line in definite.unbound_on_a_path(tree, steady)]


def _flakes(tree: ast.Module) -> list[Read]:
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
    order of their first read. A name that pyflakes finds ``before`` reading unbound is the
    input's in every scope: a fragment's ``xm``, read on one path of the output where a guarded
    import binds it on the other."""
    known = {(kind, name) for kind, name, _ in before}
    unbound = {name for kind, name, _ in before if not kind.startswith(ON_A_PATH)}
    return list(dict.fromkeys(
        (kind, name) for kind, name, _ in after
        if (kind, name) not in known and not (kind.startswith(ON_A_PATH) and name in unbound)
    ))


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
