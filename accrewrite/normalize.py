"""Lines that libcst's parser misreads, rewritten to equivalent Python before parsing and put
back after the migration.

- A form feed in a line's indentation: Python resets the indentation's column there, libcst
  takes it as part of the indentation (and loses it, or rejects the file). Everything up to the
  last form feed is dropped, which leaves the same indentation.
- Newlines that are lone carriage returns: libcst drops the last one, so they are read as line
  feeds and written back as they were.
- Lines of spaces or tabs at the end of the file: libcst drops the empty lines before them, so
  they are set aside and put back after the migrated text.
- A line that holds only a backslash continuation: Python joins it to the next line, whose
  indentation is then the backslash line's; libcst rejects ``\\`` before ``else:``. It becomes an
  empty line, and the next line takes the backslash line's indentation.

Lines keep their number, so positions in diagnostics hold. After the migration, each line the
rules left as it was gets its original text back, and a rewritten line keeps its form feeds
where the rewrite kept the line count.
"""

from __future__ import annotations

import difflib
import re
import tokenize
from io import BytesIO

_INDENT = re.compile(rb"[ \t\f]*")
_BACKSLASH_LINE = re.compile(rb"[ \t\f]*\\\r?\n?\Z")
_MAYBE = re.compile(rb"^[ \t]*\f|^[ \t\f]*\\\r?$", re.MULTILINE)


def for_libcst(source: bytes):
    """``(text libcst reads as Python reads source, restore)``; ``restore(output)`` puts the
    original lines back into the migrated text."""
    tail = _blank_tail(source)
    if tail:
        readable, restore = for_libcst(source[:-len(tail)])
        return readable, lambda output: restore(output) + tail
    if b"\r" in source and b"\n" not in source:  # classic Mac newlines: libcst drops the last one
        readable, restore = for_libcst(source.replace(b"\r", b"\n"))
        return readable, lambda output: restore(output).replace(b"\n", b"\r")
    if not _MAYBE.search(source):
        return source, _unchanged
    original = source.splitlines(keepends=True)
    inside = _string_rows(source)
    if inside is None:  # tokenize cannot read it: leave it to the parser's error
        return source, _unchanged
    lines = list(original)
    indent_of_next = None
    mid_statement = False  # the line before ended in a backslash: this one is no line's start
    for number, line in enumerate(original):
        if number + 1 in inside or mid_statement:
            indent_of_next = None
            mid_statement = line.rstrip(b"\r\n").endswith(b"\\")
            continue
        indent = _INDENT.match(line).group()
        body = line[len(indent):]
        if indent_of_next is not None:  # this line continues a backslash line
            indent = indent_of_next
        indent = indent[indent.rfind(b"\f") + 1:]
        if _BACKSLASH_LINE.match(line):
            lines[number] = line[len(line.rstrip(b"\r\n")):] or b"\n"
            indent_of_next = indent
        else:
            lines[number] = indent + body
            indent_of_next = None
            mid_statement = line.rstrip(b"\r\n").endswith(b"\\")
    normalized = b"".join(lines)
    if normalized == source:
        return source, _unchanged
    return normalized, lambda output: _restore(original, lines, output)


def _blank_tail(source: bytes) -> bytes:
    """The lines after the last line of code when one of them holds spaces or tabs, else b""."""
    code = source.rstrip(b" \t\f\r\n")
    end = source.find(b"\n", len(code))
    if end == -1 or code.endswith(b"\\"):
        return b""
    tail = source[end + 1:]
    return tail if tail.strip(b"\r\n") else b""


def _unchanged(output: bytes) -> bytes:
    return output


def _string_rows(source: bytes) -> set[int] | None:
    """Rows (1-based) that begin inside a string literal, or None when tokenize fails."""
    rows: set[int] = set()
    try:
        for token in tokenize.tokenize(BytesIO(source).readline):
            if token.end[0] > token.start[0] and token.type != tokenize.NL:
                rows.update(range(token.start[0] + 1, token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    return rows


def _restore(original: list[bytes], normalized: list[bytes], output: bytes) -> bytes:
    migrated = output.splitlines(keepends=True)
    restored: list[bytes] = []
    matcher = difflib.SequenceMatcher(None, normalized, migrated, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            restored += original[i1:i2]
        elif tag == "replace" and i2 - i1 == j2 - j1:
            restored += [_with_form_feeds(o, n, m) for o, n, m in zip(original[i1:i2], normalized[i1:i2], migrated[j1:j2])]
        else:
            restored += migrated[j1:j2]
    return b"".join(restored)


def _with_form_feeds(original: bytes, normalized: bytes, migrated: bytes) -> bytes:
    """``migrated`` with the form feeds ``original`` had before its indentation."""
    dropped = len(original) - len(normalized)
    prefix = original[:dropped]
    if dropped <= 0 or not prefix.endswith(b"\f") or original[dropped:] != normalized:
        return migrated
    return prefix + migrated
