"""libcst's parser, without checking each node it builds.

libcst checks a node's fields as the node is built (``CSTNode.__post_init__``), which catches a
hand-built node that would not print as valid Python. A node its parser builds from source that
parsed needs no such check, and the checks are about a tenth of a parse (libcst's own comment
there suggests leaving them out of parsing). ``parse_module`` skips them for the nodes built on
the calling thread while it parses: a stand-in for libcst's method checks every other node, and
libcst's method is back in place once no thread parses (in a worker, which only migrates, the
stand-in stays: see ``keep``). Nodes that the rules build are checked as ever; a libcst whose
nodes check themselves elsewhere parses as it does.
"""

from __future__ import annotations

import threading

import libcst as cst

_lock = threading.Lock()
_parsing: set[int] = set()  # the threads parsing now
_checking = None  # libcst's ``__post_init__``, while the stand-in is in its place
_kept = False


def _post_init(node: cst.CSTNode) -> None:
    if threading.get_ident() not in _parsing:
        _checking(node)


def _stand_in() -> None:
    """Put the stand-in in libcst's method's place, unless it is there (under ``_lock``)."""
    global _checking
    found = cst.CSTNode.__dict__.get("__post_init__")
    if found is not None and found is not _post_init:
        _checking = found
        cst.CSTNode.__post_init__ = _post_init


def keep() -> None:
    """Leave the stand-in in place from now on, in a process that does nothing but migrate (a
    worker): putting a method of libcst's base class back changes every node class, and Python
    then learns its lookups on them again, each file."""
    global _kept
    with _lock:
        _stand_in()
        _kept = True


def parse_module(source: bytes) -> cst.Module:
    """``libcst.parse_module(source)``, its nodes unchecked."""
    thread = threading.get_ident()
    with _lock:
        _stand_in()
        _parsing.add(thread)
    try:
        return cst.parse_module(source)
    finally:
        with _lock:
            _parsing.discard(thread)
            if not _parsing and not _kept and cst.CSTNode.__dict__.get("__post_init__") is _post_init:
                cst.CSTNode.__post_init__ = _checking
