"""``[tool.accrewrite]`` in the nearest pyproject.toml.

Each file has its own, as in ruff: the first pyproject.toml with a ``[tool.accrewrite]`` table
found walking up from the file's folder (standard input: from --stdin-filename, or the working
directory). So one call over two projects migrates each with its own settings. Command-line
flags override it. Keys: target, guard, select, ignore, unsafe-fixes, exclude (globs, relative to
the pyproject.toml's folder), parallel.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from accrewrite.base.parallel_kinds import PARALLEL_KINDS, unknown_kind  # the runtime's table too; torch-free
from accrewrite.discovery import excluded, real
from accrewrite.targets import all_targets, unknown_target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_LISTS = ("select", "ignore", "exclude")
_KEYS = MappingProxyType({"target": str, "guard": str, "unsafe-fixes": bool, "parallel": str, **{key: list for key in _LISTS}})


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class FileConfig:
    path: Path | None = None
    values: dict | None = None

    def get(self, key: str, default=None):
        return (self.values or {}).get(key, default)

    def excludes(self, path: Path) -> bool:
        patterns = tuple(self.get("exclude", []))
        return bool(patterns) and excluded(Path(os.path.abspath(path)), self.path.parent, patterns)


class Configs:
    """The configuration of each file, looked up once per folder."""

    def __init__(self) -> None:
        self._by_folder: dict[Path, FileConfig] = {}

    def of(self, path: Path) -> FileConfig:
        folder = real(path) if _is_a(path, Path.is_dir) else real(path).parent
        if folder not in self._by_folder:
            self._by_folder[folder] = find_config(folder)
        return self._by_folder[folder]


def find_config(start: Path) -> FileConfig:
    start = real(start)
    for directory in [start, *start.parents] if _is_a(start, Path.is_dir) else list(start.parents):
        candidate = directory / "pyproject.toml"
        if not _is_a(candidate, Path.is_file):
            continue
        try:
            data = tomllib.loads(candidate.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
            raise ConfigError(f"{candidate}: cannot read: {exc}") from None
        table = data.get("tool", {}).get("accrewrite")
        if table is not None:
            return FileConfig(candidate, _validate(candidate, table))
    return FileConfig()


def _is_a(path: Path, test) -> bool:
    try:
        return test(path)
    except OSError:  # a directory we may not look into holds no configuration of ours
        return False


def _validate(path: Path, table: dict) -> dict:
    for key, value in table.items():
        if key not in _KEYS:
            raise ConfigError(f"{path}: [tool.accrewrite] has unknown key {key!r}; known: {', '.join(_KEYS)}")
        expected = _KEYS[key]
        if not isinstance(value, expected) or (expected is list and not all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: [tool.accrewrite] {key} must be a {expected.__name__}"
                              + (" of strings" if expected is list else ""))
    if "target" in table and table["target"] not in all_targets():
        raise ConfigError(f"{path}: [tool.accrewrite] target: {unknown_target(table['target'])}")
    if table.get("parallel", PARALLEL_KINDS[0]) not in PARALLEL_KINDS:
        raise ConfigError(f"{path}: [tool.accrewrite] parallel {unknown_kind(table['parallel'])}")
    return table
