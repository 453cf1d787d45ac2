"""How large and how deeply nested a file the engine takes, and the stack that depth needs.

Python's own parser reads the file first: it is fast, names a syntax error's place precisely,
and refuses what CPython refuses (``(((...)))`` past 200 levels, say). What it accepts is then
measured, and a file past a limit is refused with what to do before libcst sees it: libcst's
parse time grows faster than linearly with size, and its native parser overflows its stack on
deep expressions.

| limit | value | beyond it |
|---|---|---|
| file size | 1 MiB | "file too large" error; the file is left as it is |
| expression and block nesting | 2,000 levels | "nested too deeply" error; the file is left as it is |

Within the limits, libcst's recursive parser, visitors and code generator run on a thread with a
large stack and a raised recursion limit (a 1,000-long attribute chain or a 2,000-term sum needs
both), restored after each call; the thread is kept while calls keep coming.
"""

from __future__ import annotations

import ast
import functools
import os
import queue
import sys
import threading

from accrewrite.errors import FileError, MigrationError

MAX_BYTES = 1 << 20
MAX_DEPTH = 2000
_STACK_BYTES = 512 << 20  # reserved, not touched: the pages that a deep tree uses are all it costs
_RECURSION_LIMIT = 200_000
_VERSION = f"Python {sys.version_info.major}.{sys.version_info.minor}"


def check(source: bytes, path: str) -> ast.Module:
    """``source``'s syntax tree, as Python reads it; MigrationError when Python rejects it or it
    is past a limit."""
    if len(source) > MAX_BYTES:
        raise MigrationError(FileError(
            f"file too large ({len(source):,} bytes; the limit is {MAX_BYTES:,}): "
            "split it into modules, or migrate it by hand"
        ))
    try:
        tree = compile(source, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    except (RecursionError, MemoryError):  # CPython's parser gives up on the nesting
        raise MigrationError(FileError(
            f"nested too deeply for {_VERSION} to parse: split the deepest expression"
        )) from None
    depth, line = _depth(tree)
    if depth > MAX_DEPTH:
        raise MigrationError(FileError(
            f"nested too deeply ({depth:,} levels; the limit is {MAX_DEPTH:,}): "
            "split the expression, e.g. a long sum into partial sums", line,
        ))
    return tree


def compiles(tree: ast.Module, path: str) -> None:
    """MigrationError where Python's compiler rejects what its parser read (``tree``): a
    duplicate argument, ``return`` outside a function, ``nonlocal`` at the top level."""
    try:
        compile(tree, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    except (RecursionError, MemoryError):
        raise MigrationError(FileError(
            f"nested too deeply for {_VERSION} to compile: split the deepest expression"
        )) from None


def _syntax_error(exc: SyntaxError) -> MigrationError:
    return MigrationError(FileError(
        f"syntax error ({_VERSION}): {exc.msg}; fix it, the file must parse as Python",
        exc.lineno or 0, max((exc.offset or 1) - 1, 0),
    ))


# A node on one line nests at most about one level per byte of its text ("-", ".b", "f(*"), and
# a few leaves that spell none (``Load``, an operator): twice that and these leaves bound it.
_LEVELS_PER_BYTE, _LEAF_LEVELS = 2, 4


def _depth(tree: ast.AST, depth: int = 1, line: int = 0, bounded: bool = True) -> tuple[int, int]:
    """The deepest nesting of ``tree`` and the line where it is, when it is past MAX_DEPTH; else
    a nesting within the limit. A subtree on one line, too short to reach past the limit, is not
    entered: most statements of a file are. (Without recursion: that is what is being measured.
    Children are pushed in ``ast.iter_child_nodes`` order, read from each class's fields.)"""
    deepest, where = 0, 0
    stack = [(tree, depth, line)]
    pop, push, node_type = stack.pop, stack.append, ast.AST
    while stack:
        node, depth, line = pop()
        line = getattr(node, "lineno", line)
        if depth > deepest:
            deepest, where = depth, line
        if bounded:
            if getattr(node, "end_lineno", None) == line and (
                    depth + _LEVELS_PER_BYTE * (node.end_col_offset - node.col_offset) + _LEAF_LEVELS <= MAX_DEPTH):
                continue
            if type(node) is ast.JoinedStr:  # before 3.12 the places inside an f-string are approximate
                inner, inner_line = _depth(node, depth, line, bounded=False)
                if inner > deepest:
                    deepest, where = inner, inner_line
                continue
        depth += 1
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, node_type):
                push((value, depth, line))
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, node_type):
                        push((item, depth, line))
    return deepest, where


def on_deep_stack(function):
    """``function``, made to run on a thread whose stack and recursion limit fit MAX_DEPTH (a
    decorator: its callers call it directly)."""

    @functools.wraps(function)
    def on_the_thread(*args):
        return _call_on_the_thread(function, args)

    return on_the_thread


def _call_on_the_thread(function, args: tuple):
    """``function(*args)`` on the deep-stack thread. The thread is kept while calls keep coming
    (it ends after ``_IDLE_SECONDS`` without one): libcst's native parser sets itself up anew on
    each thread it runs on, half a millisecond a file."""
    global _inbox
    if threading.current_thread().name == _THREAD_NAME:
        return function(*args)  # already there (a call made from one): waiting for itself would hang
    outcome: list = []
    done = threading.Event()
    with _lock:
        if _inbox is None:
            _inbox = queue.SimpleQueue()
            previous_stack = threading.stack_size(_STACK_BYTES)
            try:
                threading.Thread(target=_serve, args=(_inbox,), name=_THREAD_NAME, daemon=True).start()
            finally:
                threading.stack_size(previous_stack)
        _inbox.put((function, args, outcome, done))
    done.wait()
    ok, value = outcome.pop()
    if not ok:
        try:
            raise value
        finally:
            value = None  # its traceback holds this frame: a cycle that would keep the trees
    return value


_IDLE_SECONDS = 2.0
_THREAD_NAME = "accrewrite-deep-stack"
_lock = threading.Lock()
_inbox: queue.SimpleQueue | None = None  # the deep-stack thread's calls, while it runs


def _forget_the_thread() -> None:
    """In a forked child the thread does not exist: the next call starts one."""
    global _inbox, _lock
    _inbox, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_the_thread)


def _serve(inbox: queue.SimpleQueue) -> None:
    global _inbox
    while True:
        try:
            function, args, outcome, done = inbox.get(timeout=_IDLE_SECONDS)
        except queue.Empty:
            with _lock:
                if inbox.empty():  # no call came in meanwhile
                    _inbox = None
                    return
            continue
        previous_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(previous_limit, _RECURSION_LIMIT))
        try:
            outcome.append((True, function(*args)))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            outcome.append((False, exc))
        finally:
            sys.setrecursionlimit(previous_limit)
            done.set()
            # Held until the next call, the last one's trees would outlive it, cycles and all.
            function = args = outcome = done = None
