"""Which files a run covers.

Directories are walked for ``*.py`` files, skipping version control, virtual environments,
caches and build output, and anything matching an ``--exclude`` glob. A symlink is followed only
when it stays inside the tree being walked, and a directory is never entered twice (a symlink
loop ends). Files named on the command line are always taken, unless excluded.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "env", ".env", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist", "site-packages",
        "node_modules", ".eggs", ".ipynb_checkpoints",
    }
)


def _is_virtualenv(directory: Path) -> bool:
    return (directory / "pyvenv.cfg").is_file()


def _excluded(path: Path, root: Path, excludes: tuple[str, ...]) -> bool:
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


def discover(paths: list[str], excludes: tuple[str, ...] = ()) -> list[Path]:
    """The Python files under ``paths``, each once, in a stable order. A path that does not
    exist raises FileNotFoundError."""
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists() and not path.is_symlink():
            raise FileNotFoundError(f"{raw}: no such file or directory")
        if path.is_dir():
            for file in _walk(path, excludes):
                found.setdefault(file)
        elif not _excluded(path, Path.cwd(), excludes):
            found.setdefault(path)
    return list(found)


def _walk(root: Path, excludes: tuple[str, ...]):
    real_root = root.resolve()
    seen: set[Path] = set()
    for directory, subdirs, files in os.walk(root, followlinks=True):
        here = Path(directory)
        real = here.resolve()
        if real in seen or not real.is_relative_to(real_root):
            subdirs[:] = []
            continue
        seen.add(real)
        subdirs[:] = sorted(
            name for name in subdirs
            if name not in SKIPPED_DIRS
            and not name.endswith(".egg-info")
            and not _is_virtualenv(here / name)
            and not _excluded(here / name, root, excludes)
        )
        for name in sorted(files):
            file = here / name
            if not name.endswith(".py") or _excluded(file, root, excludes):
                continue
            if file.is_symlink() and not file.resolve().is_relative_to(real_root):
                continue
            yield file
