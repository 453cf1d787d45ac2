"""libcst's parser, without checking each node it builds.

libcst checks a node's fields as the node is built (``CSTNode.__post_init__``), which catches a
hand-built node that would not print as valid Python. A node its parser builds from source that
parsed needs no such check, and the checks are about a tenth of a parse (libcst's own comment
there says the validation would better be left out of parsing). ``parse_module`` skips them for
the nodes built on the calling thread while it parses: nodes built meanwhile on other threads are
checked as ever, and libcst's method is back in place once no thread parses. Nodes that the rules
build are checked as ever too.
"""

from __future__ import annotations

import threading

import libcst as cst

_lock = threading.Lock()
_parsing: set[int] = set()  # the threads parsing now
_checking = None  # libcst's ``__post_init__``, while ours stands in for it


def _post_init(node: cst.CSTNode) -> None:
    if threading.get_ident() not in _parsing:
        node._validate()


def parse_module(source: bytes) -> cst.Module:
    """``libcst.parse_module(source)``, its nodes unchecked."""
    global _checking
    thread = threading.get_ident()
    with _lock:
        if not _parsing:
            _checking = cst.CSTNode.__dict__["__post_init__"]
            cst.CSTNode.__post_init__ = _post_init
        _parsing.add(thread)
    try:
        return cst.parse_module(source)
    finally:
        with _lock:
            _parsing.discard(thread)
            if not _parsing:
                cst.CSTNode.__post_init__ = _checking
