"""Before ``accrewrite verify`` runs anything: can each side's interpreter import what it needs?
A missing target package is said at once, not after the original has trained. The answer comes
back in a file named to the interpreter, never on its output, which a ``sitecustomize``, an
``atexit`` hook or a target's debugging settings may print on at start and at exit."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

from accrewrite.targets import all_targets

_TIMEOUT = 300  # seconds: importing a target's package (torch_xla) cold can take a minute
_IMPORT = """\
import importlib, json, sys
failed = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
with open(sys.argv[1], "w", encoding="utf-8") as answer:
    json.dump(failed, answer)
"""


def needs(target: str | None) -> tuple[str, ...]:
    """torch, and the target's own package where it has one."""
    package = all_targets()[target].package if target is not None else ""
    return ("torch", package) if package else ("torch",)


def problems(sides: list[tuple[str, str | None, str]]) -> list[str]:
    """What each (side name, target, interpreter) lacks, with the fix; empty when all is there.
    One process per interpreter imports what all its sides need."""
    wanted: dict[str, list[str]] = {}
    for _, target, python in sides:
        wanted.setdefault(python, [])
        wanted[python] += [module for module in needs(target) if module not in wanted[python]]
    failed = {python: failed_imports(python, modules) for python, modules in wanted.items()}
    found = []
    for name, target, python in sides:
        trouble = failed[python]
        if isinstance(trouble, str):
            found.append(f"{name}: {trouble}")
            continue
        lacking = [module for module in needs(target) if module in trouble]
        if lacking:
            found.append(f"{name}: {python} cannot import {', '.join(lacking)} ({trouble[lacking[0]]}); install it "
                         f"there, or name an interpreter that has it with --python {name}=PATH")
    return found


def failed_imports(python: str, modules: list[str]) -> dict[str, str] | str:
    """The modules that failed to import, with why; or, as a string, why the interpreter itself
    could not be asked."""
    try:
        handle, answer = tempfile.mkstemp(prefix="accrewrite-preflight-", suffix=".json")
    except OSError as exc:
        return f"cannot make a file for {python}'s answer: {exc}; set TMPDIR to a writable folder"
    os.close(handle)
    try:
        return _ask(python, modules, answer)
    finally:
        os.unlink(answer)


def _ask(python: str, modules: list[str], answer: str) -> dict[str, str] | str:
    try:
        done = subprocess.run([python, "-c", _IMPORT, answer, *modules], capture_output=True, text=True,
                              timeout=_TIMEOUT)
    except (FileNotFoundError, NotADirectoryError):
        return f"no interpreter at {python}"
    except PermissionError:
        return f"{python} cannot be run (permission denied)"
    except subprocess.TimeoutExpired:
        return f"{python} did not import {', '.join(modules)} within {_TIMEOUT} s"
    try:
        with open(answer, encoding="utf-8") as written:
            return json.load(written)
    except ValueError:  # empty: the interpreter ended before it answered
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"{python} could not be asked what it imports ({last})"
