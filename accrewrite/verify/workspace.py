"""What the sides of ``accrewrite verify`` see of the user's files, and how they are kept from
writing them.

The project (``--root``, else the git repository holding the working directory, else the working
directory) is copied once into a *snapshot* (cloned where the filesystem can, so it costs no
space there). Symbolic links are followed, so a linked data folder is copied as a folder.
Each side gets a *view*: the project's folders made anew, its Python files copied (migrated on
a migrated side, under the script's folder), every other file a link into the snapshot. A side
runs in its view of the working directory, so that ``../data`` resolves as it does for the user.
The sides share the snapshot; after each side, whatever it wrote into it is put back as copied.
No side is given a path of the user's, and the workspace never copies itself.
"""

from __future__ import annotations

import difflib
import errno
import os
import shutil
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from accrewrite.engine import Options, migrate_source
from accrewrite.notebook import Notebook, is_notebook
from accrewrite.project import Decisions, decide, member, needs_deciding

WORKSPACE_PREFIX = "accrewrite-verify-"
# Not copied: version control and caches. (Unlike migrate's discovery, `build` or `env` folders
# are copied: a script may import from them.) Virtual environments are known by pyvenv.cfg.
_SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                      ".tox", ".nox", "node_modules"})
_FREE_MARGIN = 0.9  # of the free space a snapshot may take
_FICLONE = 0x40049409  # Linux's ioctl to share a file's blocks copy-on-write (btrfs, XFS)


class WorkspaceError(Exception):
    """The workspace cannot be made; the message says why and what to do."""


def project_root(cwd: Path, given: Path | None) -> Path:
    if given is not None:
        root = given.resolve()
        if not root.is_dir():
            raise WorkspaceError(f"--root {given}: no such directory")
        if not cwd.is_relative_to(root):
            raise WorkspaceError(f"--root {given} does not hold the working directory {cwd}")
        return root
    return next((folder for folder in (cwd, *cwd.parents) if (folder / ".git").exists()), cwd)


@dataclass(frozen=True)
class _Tree:
    source: Path  # the user's folder
    name: str  # its folder in the snapshot and in each view


class Workspace:
    def __init__(self, root: Path, cwd: Path, script: Path, project: Path, unsafe_fixes: bool = False):
        self.root = root
        self.cwd = cwd
        self.script = script
        self.unsafe_fixes = unsafe_fixes
        self.trees = [_Tree(project, "project")]
        if not script.parent.is_relative_to(project):
            self.trees.append(_Tree(script.parent, "script"))
        self.snapshot = root / "snapshot"
        self._manifest: dict[Path, tuple] = {}  # snapshot path -> (mode, size, mtime) as copied
        self._sources: dict[Path, Path] = {}  # snapshot file -> the user's file

    # The snapshot ------------------------------------------------------------------------------

    def copy(self) -> str:
        """Copy the project into the snapshot; a line saying what was copied."""
        folders, files, size = [], [], 0
        for tree in self.trees:
            for source, relative, found in self._walk(tree.source):
                (files if found else folders).append((source, self.snapshot / tree.name / relative))
                size += found.st_size if found else 0
        free = shutil.disk_usage(self.root).free
        if size > _FREE_MARGIN * free:
            raise WorkspaceError(
                f"verify copies {self.trees[0].source} ({_mib(size)}) into {self.root.parent}, which has "
                f"{_mib(free)} free: set TMPDIR to a larger disk, or --root to a smaller folder")
        for _, copy in folders:
            copy.mkdir(parents=True, exist_ok=True)  # an empty one too: a script may write into it
        for source, copy in files:
            _clone(source, copy)
            self._sources[copy] = source
        self._record()
        return f"workspace: {len(files)} files ({_mib(size)}) of {self.trees[0].source} copied into {self.root}"

    def _walk(self, top: Path):
        """(path, path relative to top, its stat for a file or None for a folder) of every folder
        and regular file under top, links followed once, each folder before what it holds."""
        seen = set()
        for directory, subdirs, files in os.walk(top, followlinks=True):
            here = Path(directory)
            real = here.resolve()
            if real in seen or real.is_relative_to(self.root.resolve()):
                subdirs[:] = []
                continue
            seen.add(real)
            yield here, here.relative_to(top), None
            subdirs[:] = [d for d in subdirs if d not in _SKIPPED and not d.startswith(WORKSPACE_PREFIX)
                          and not (here / d / "pyvenv.cfg").exists()]
            for name in files:
                path = here / name
                try:
                    found = path.stat()
                except FileNotFoundError:  # a dangling link, or a file gone since the listing
                    continue
                if stat.S_ISREG(found.st_mode):
                    yield path, path.relative_to(top), found

    def _record(self) -> None:
        self._manifest = {}
        for directory, subdirs, files in os.walk(self.snapshot):
            for name in (*subdirs, *files):
                path = Path(directory) / name
                self._manifest[path] = _state(path)

    def restore(self) -> list[Path]:
        """Put back what a side changed in the snapshot; the paths it had changed."""
        changed = []
        for directory, subdirs, files in os.walk(self.snapshot, topdown=False):
            for name in (*files, *subdirs):
                path = Path(directory) / name
                if path not in self._manifest:
                    changed.append(path)
                    _remove(path)
        for path, state in self._manifest.items():
            if _state(path) != state:
                changed.append(path)
                if stat.S_ISDIR(state[0]):
                    if not path.is_dir() or path.is_symlink():
                        _remove(path)
                    path.mkdir(parents=True, exist_ok=True)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    _remove(path)
                    _clone(self._sources[path], path)
        if changed:
            self._record()
        return changed

    # A side's view ------------------------------------------------------------------------------

    def view(self, name: str, target: str | None, errors: list[str]) -> tuple[Path, Path]:
        """The side's (working directory, script path): its view of the project, with the
        script's folder migrated to ``target`` (None: the original). Migration errors go to
        ``errors``; such a file is copied unmigrated."""
        options = Options(target=target, unsafe_fixes=self.unsafe_fixes) if target else None
        home = self.root / name
        migrated: dict[Path, Path] = {}  # the user's file -> its copy in the view
        for tree in self.trees:
            copy, view = self.snapshot / tree.name, home / tree.name
            for directory, subdirs, files in os.walk(copy):
                here = Path(directory)
                made = view / here.relative_to(copy)
                made.mkdir(parents=True, exist_ok=True)
                for file in files:
                    source = here / file
                    if not file.endswith(".py") and self._sources[source] != self.script:
                        (made / file).symlink_to(source)
                        continue
                    shutil.copy2(source, made / file)  # a real file: Python resolves a script's links
                    if options and self._sources[source].parent.is_relative_to(self.script.parent):
                        migrated[self._sources[source]] = made / file  # its migration is written below
        if migrated:
            for path, output in _migrated(list(migrated), options, self.script.parent, errors).items():
                migrated[path].write_bytes(output)
        project = self.trees[0]
        cwd = home / project.name / self.cwd.relative_to(project.source)
        cwd.mkdir(parents=True, exist_ok=True)
        if self.script.is_relative_to(project.source):
            script = home / project.name / self.script.relative_to(project.source)
        else:
            script = home / self.trees[1].name / self.script.name
        return cwd, _runnable(script) if is_notebook(script.name) else script


    def users_line(self, site: str) -> str:
        """A line a side ran (``path:line``, in its view) as the user knows it: ``train.py:12``
        where the side's copy holds the user's line unchanged, relative to the working directory
        where it is inside; else the migrated line and what it says. A path outside the views as
        it is."""
        path, _, line = site.rpartition(":")
        try:
            _, tree, *rest = Path(path).relative_to(self.root).parts
            number = int(line)
        except ValueError:
            return site
        source = next((t.source for t in self.trees if t.name == tree), None)
        if source is None or not rest:
            return site
        users = source.joinpath(*rest)
        name = str(users.relative_to(self.cwd)) if users.is_relative_to(self.cwd) else str(users)
        migrated = _lines(Path(path))
        original = _original_line(_lines(self.snapshot.joinpath(tree, *rest)), migrated, number)
        if original is not None:
            return f"{name}:{original}"
        said = migrated[number - 1].strip() if 0 < number <= len(migrated) else ""
        return f"line {number} of the migrated {name}" + (f" (`{said}`)" if said else "")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _original_line(original: list[str], migrated: list[str], number: int) -> int | None:
    """The line of ``original`` that line ``number`` of ``migrated`` copies unchanged; None where
    the migration wrote it."""
    for tag, first, _, start, end in difflib.SequenceMatcher(None, original, migrated, autojunk=False).get_opcodes():
        if tag == "equal" and start < number <= end:
            return first + number - start
    return None


def _runnable(notebook: Path) -> Path:
    """The notebook's code cells as a script beside it (``<name>.ipynb.py``), for the side to run."""
    code, _ = Notebook.read(notebook.read_bytes()).runnable()
    script = notebook.with_name(notebook.name + ".py")
    script.write_bytes(code)
    return script


def skipped_in_notebook(script: Path) -> list[str]:
    """The IPython lines (magics, shell escapes) a side does not run of the notebook ``script``."""
    return Notebook.read(script.read_bytes()).runnable()[1]


def _migrated(paths: list[Path], options: Options, root: Path, errors: list[str]) -> dict[Path, bytes]:
    """Each file's migrated bytes, as ``accrewrite migrate`` over the folder ``root`` gives them
    (the project's decision made: ``accrewrite.project``); a notebook's code cells are migrated
    as one script. A file whose migration fails is kept as it is, its error in ``errors``."""
    sources = {path: path.read_bytes() for path in paths}
    books = {path: Notebook.read(sources[path]) for path in paths if is_notebook(path.name)}
    code = {path: books[path].script() if path in books else sources[path] for path in paths}
    results = [migrate_source(code[path], str(path), options) for path in paths]
    members = [member(path, result) for path, result in zip(paths, results)]
    decisions = decide(members, [root]) if needs_deciding(members) else Decisions()
    for index, why in decisions.keep_ddp.items():
        results[index] = migrate_source(code[paths[index]], str(paths[index]), replace(options, keep_ddp=why))
    outputs = {}
    for index, (path, result) in enumerate(zip(paths, results)):
        if result.error is not None:
            errors.append(f"{path}:{result.error.line}: {result.error.reason}")
        if result.error is not None or index in decisions.left or not result.changed:
            outputs[path] = sources[path]
        else:
            outputs[path] = books[path].migrated(result.output) if path in books else result.output
    return outputs


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _state(path: Path) -> tuple:
    try:
        found = path.lstat()
    except FileNotFoundError:
        return ()
    if stat.S_ISDIR(found.st_mode):
        return (found.st_mode,)
    return found.st_mode, found.st_size, found.st_mtime_ns


def _clone(source: Path, copy: Path) -> None:
    """Copy a file with its times, sharing its blocks where the filesystem can."""
    if sys.platform == "linux":
        try:
            import fcntl

            with open(source, "rb") as reading, open(copy, "wb") as writing:
                fcntl.ioctl(writing.fileno(), _FICLONE, reading.fileno())
            shutil.copystat(source, copy)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EBADF):
                raise
    shutil.copy2(source, copy)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
