"""Before ``accrewrite verify`` runs anything: can each side's interpreter import what it needs?
A missing torch_xla is said at once, not after the original has trained."""

from __future__ import annotations

import subprocess

from accrewrite.targets import all_targets

_TIMEOUT = 300  # seconds: importing torch_xla cold can take a minute


def needs(target: str | None) -> tuple[str, ...]:
    return ("torch",) if target is None else ("torch", all_targets()[target].package)


def problems(sides: list[tuple[str, str | None, str]]) -> list[str]:
    """What each (side name, target, interpreter) lacks, with the fix; empty when all is there."""
    found, checked = [], {}
    for name, target, python in sides:
        modules = needs(target)
        key = (python, modules)
        if key not in checked:
            checked[key] = _missing(python, modules)
        if checked[key]:
            found.append(f"{name}: {checked[key]}; install it there, or name an interpreter that has it "
                         f"with --python {name}=PATH")
    return found


def _missing(python: str, modules: tuple[str, ...]) -> str:
    code = "import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)"
    try:
        done = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=_TIMEOUT)
    except FileNotFoundError:
        return f"no interpreter at {python}"
    except PermissionError:
        return f"{python} cannot be run (permission denied)"
    except subprocess.TimeoutExpired:
        return f"{python} did not import {', '.join(modules)} within {_TIMEOUT} s"
    if done.returncode == 0:
        return ""
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return f"{python} cannot import {', '.join(modules)} ({last})"
