"""The command line's fixed choices and value types, kept apart from the modules that act on
them so that parsing the command line (and ``--version``) imports neither libcst nor the rules;
``accrun`` reads them too."""

import argparse
import math

FORMATS = ("concise", "full", "text", "json", "github", "gitlab", "sarif")  # migrate --output-format
ORIGINAL = "original"  # verify: the side that runs the script as it is


def positive(kind):
    """An argparse type: a finite number above 0 (nan and inf are refused)."""

    def parse(value: str):
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if not (0 < number < math.inf):
            raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {value}")
        return number

    parse.__name__ = kind.__name__
    return parse
