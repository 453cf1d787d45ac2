"""GitHub Actions workflow-command syntax (``::warning file=a.py,line=3::message``), shared by
the tests of ``--format github`` and of the action."""

import re

# Property values may not hold a raw `,` or `:` (they end the value), nor the message a raw CR
# or LF (they end the command); `%` must start one of the escapes GitHub's toolkit writes.
_PROPERTY = r"[A-Za-z]+=(?:[^,:%\r\n]|%25|%0D|%0A|%3A|%2C)*"
COMMAND = re.compile(rf"::(?P<level>error|warning|notice) (?P<properties>{_PROPERTY}(?:,{_PROPERTY})*)"
                     r"::(?P<message>(?:[^%\r\n]|%25|%0D|%0A)*)")


def unescape(value: str) -> str:
    for escaped, raw in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        value = value.replace(escaped, raw)
    return value


def parse(line: str) -> tuple[str, dict[str, str], str]:
    """(level, properties, message) of one annotation, unescaped; AssertionError if the line
    breaks the syntax."""
    match = COMMAND.fullmatch(line)
    assert match, f"not a workflow command: {line!r}"
    properties = dict(part.split("=", 1) for part in match["properties"].split(","))
    return match["level"], {key: unescape(value) for key, value in properties.items()}, unescape(match["message"])
