"""Which files a run covers.

Directories are walked for ``*.py`` files and Jupyter notebooks (``*.ipynb``), skipping version control, virtual environments,
caches and build output, and anything matching an ``--exclude`` glob. A symlink is followed only
when it stays inside the tree being walked, and a directory is never entered twice (a symlink
loop ends). Files named on the command line are always taken, unless excluded; a file reached by
two names is taken once. What cannot be walked (a missing path, a directory that cannot be read)
is a problem of that path, and the rest is still found.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "env", ".env", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist", "site-packages",
        "node_modules", ".eggs", ".ipynb_checkpoints",
    }
)


@dataclass
class Found:
    files: list[Path] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (path, why it was not walked)


def real(path: Path) -> Path:
    """``path`` with its symlinks resolved; never raises (a symlink loop stays unresolved)."""
    return Path(os.path.realpath(path))


def _is_virtualenv(directory: Path) -> bool:
    try:
        return (directory / "pyvenv.cfg").is_file()
    except OSError:  # unreadable: the walk reports it when it tries to list it
        return False


def excluded(path: Path, root: Path, excludes: tuple[str, ...]) -> bool:
    """Whether a glob matches ``path`` (relative to the walk's root), its name, or one of its
    directories."""
    if not excludes:
        return False
    text = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
    return any(
        fnmatch.fnmatch(text, pattern) or fnmatch.fnmatch(path.name, pattern)
        or fnmatch.fnmatch(text, f"*/{pattern}") or fnmatch.fnmatch(text, f"{pattern}/*")
        or fnmatch.fnmatch(text, f"*/{pattern}/*")
        for pattern in excludes
    )


def discover(paths: list[str], excludes: tuple[str, ...] = ()) -> Found:
    """The Python files and notebooks under ``paths``, each once, in a stable order, and the paths that could
    not be walked."""
    found = Found()
    seen: set[Path] = set()

    def take(file: Path) -> None:
        key = real(file)
        if key not in seen:
            seen.add(key)
            found.files.append(file)

    for raw in paths:
        path = Path(raw)
        if not os.path.lexists(path):
            found.problems.append((raw, "no such file or directory"))
        elif path.is_dir():
            for file in _walk(path, excludes, found.problems):
                take(file)
        elif not excluded(path, Path.cwd(), excludes):
            take(path)
    return found


def _walk(root: Path, excludes: tuple[str, ...], problems: list[tuple[str, str]]):
    real_root = real(root)
    seen: set[Path] = set()

    def unreadable(error: OSError) -> None:
        problems.append((error.filename or str(root), f"cannot read the directory: {error.strerror}"))

    for directory, subdirs, files in os.walk(root, followlinks=True, onerror=unreadable):
        here = Path(directory)
        resolved = real(here)
        if resolved in seen or not resolved.is_relative_to(real_root):
            subdirs[:] = []
            continue
        seen.add(resolved)
        subdirs[:] = sorted(
            name for name in subdirs
            if name not in SKIPPED_DIRS
            and not name.endswith(".egg-info")
            and not _is_virtualenv(here / name)
            and not excluded(here / name, root, excludes)
        )
        for name in sorted(files):
            file = here / name
            if not name.endswith((".py", ".ipynb")) or excluded(file, root, excludes):
                continue
            if file.is_symlink() and not real(file).is_relative_to(real_root):
                continue
            yield file
