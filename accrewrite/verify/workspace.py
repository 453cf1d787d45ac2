"""What the sides of ``accrewrite verify`` see of the user's files, and how they are kept from
writing them.

The project (``--root``, else the git repository holding the working directory, else the working
directory) is surveyed once: its folders and files, symbolic links followed (a linked data folder
is walked as a folder), and each one's size and time. Nothing the sides only read is copied. Each
side gets a *view*: the project's folders made anew, its Python files copied (migrated on a
migrated side, under the script's folder), every other file a link to the user's file, read where
it is (through the project's own links). A side runs in its view of the working directory, so
that ``../data`` resolves as it does for the user. What a side writes goes to its view: a new file
lands in the view's folder, a rename or a delete moves or removes a link, and a write that would
follow a link, or names a path of the user's tree, is redirected into the view in the side's
processes first (``redirect``), the link made a copy of its file (copy-on-write). Where the system
permits it, the side also sees the user's top folders through an overlay of its own
(``overlay``), which takes the writes no redirection sees. After each side the user's files and
folders are stat-ed again: a write that reached them is named. The workspace never surveys
itself.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from accrewrite.engine import Options, migrate_source
from accrewrite.notebook import Notebook, is_notebook
from accrewrite.project import Decisions, decide, member, needs_deciding
from accrewrite.verify import overlay, redirect

WORKSPACE_PREFIX = "accrewrite-verify-"
# Not in a view: version control and caches. (Unlike migrate's discovery, `build` or `env` folders
# are: a script may import from them.) Virtual environments are known by pyvenv.cfg.
_SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                      ".tox", ".nox", "node_modules"})
_SHOWN = 3  # of the user's files a side wrote, the ones named


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
    name: str  # its folder in each view


class Workspace:
    def __init__(self, root: Path, cwd: Path, script: Path, project: Path, unsafe_fixes: bool = False):
        self.root = root
        self.cwd = cwd
        self.script = script
        self.unsafe_fixes = unsafe_fixes
        self.trees = [_Tree(project, "project")]
        if not script.parent.is_relative_to(project):
            self.trees.append(_Tree(script.parent, "script"))
        self._folders: list[tuple[Path, Path]] = []  # (the user's folder, its place in a view)
        self._files: list[tuple[Path, Path]] = []  # (the user's file, its place in a view)
        self._real: dict[str, Path] = {}  # the real path of a folder of the user's -> its place in a view
        self._states: dict[Path, tuple] = {}  # the user's file or folder -> (mode, size, mtime) when last seen
        self._overlaid: list[str] = []  # the user's top folders each side sees through an overlay of its own

    # The user's files ----------------------------------------------------------------------------

    def survey(self) -> str:
        """Find the project's folders and files and note their sizes and times; a line saying
        what the sides read."""
        size = 0
        for tree in self.trees:
            for source, relative, found in self._walk(tree.source):
                place = Path(tree.name, relative)
                self._states[source] = _state(found)
                if stat.S_ISDIR(found.st_mode):
                    self._folders.append((source, place))
                    self._real[os.path.realpath(source)] = place
                else:
                    self._files.append((source, place))
                    size += found.st_size
        self._overlaid = self._overlaid_folders()
        layers = " and an overlay of your folders" if self._overlaid else ""
        return (f"workspace: {len(self._files)} files ({_mib(size)}) of {self.trees[0].source} read where they "
                f"are; each side writes into its own view{layers} in {self.root}")

    def _overlaid_folders(self) -> list[str]:
        """The user's top folders that each side sees through an overlay of its own; none where the
        system forbids it, or where the workspace is inside one (the side's records would be
        hidden in its layer)."""
        folders = overlay.tops(list(self._real))
        root = os.path.realpath(self.root)
        if any(Path(root).is_relative_to(folder) for folder in folders):
            return []
        if not all(map(overlay.mountable, [*folders, root])):
            return []
        return folders if overlay.permitted(self.root / "overlay-check", folders) else []

    def _walk(self, top: Path):
        """(path, path relative to top, its stat) of every folder and regular file under top,
        links followed once, each folder before what it holds."""
        seen = set()
        for directory, subdirs, files in os.walk(top, followlinks=True):
            here = Path(directory)
            real = here.resolve()
            if real in seen or real.is_relative_to(self.root.resolve()):
                subdirs[:] = []
                continue
            seen.add(real)
            yield here, here.relative_to(top), here.stat()
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

    def written(self) -> list[Path]:
        """The user's files and folders whose size or time changed since they were last seen: a
        write verify did not redirect (C code, a process without Python)."""
        changed = []
        for path, state in self._states.items():
            now = _state(_stat(path))
            if now != state:
                changed.append(path)
                self._states[path] = now
        return changed

    # A side's view ------------------------------------------------------------------------------

    def view(self, name: str, target: str | None, errors: list[str]) -> tuple[Path, Path]:
        """The side's (working directory, script path): its view of the project, with the
        script's folder migrated to ``target`` (None: the original). Migration errors go to
        ``errors``; such a file is copied unmigrated."""
        options = Options(target=target, unsafe_fixes=self.unsafe_fixes) if target else None
        home = self.root / name
        migrated: dict[Path, Path] = {}  # the user's file -> its copy in the view
        for _, place in self._folders:
            (home / place).mkdir(parents=True, exist_ok=True)  # an empty one too: a script may write into it
        for source, place in self._files:
            made = home / place
            if not source.name.endswith(".py") and source != self.script:
                made.symlink_to(source)
                continue
            shutil.copy2(source, made)  # a real file: Python resolves a script's links
            if options and source.parent.is_relative_to(self.script.parent):
                migrated[source] = made  # its migration is written below
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

    def redirection(self, name: str) -> dict[str, str]:
        """The environment that has the side ``name``'s processes write into its view (``redirect``)."""
        folders = self.root / f"{name}.folders.json"
        home = self.root / name
        folders.write_text(json.dumps({"workspace": str(self.root),
                                       "folders": {real: str(home / place) for real, place in self._real.items()}}))
        return {redirect.FOLDERS: str(folders)}

    def isolated(self, name: str, argv: list[str]) -> list[str]:
        """The command that runs ``argv`` as the side ``name``, over an overlay of the user's
        folders where the system permits it (``overlay``)."""
        if not self._overlaid:
            return argv
        layers = self.root / f"{name}.layers"
        return overlay.command([(Path(folder), layers / str(index), Path(folder))
                                for index, folder in enumerate(self._overlaid)], argv)

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
        original = _original_line(_lines(users), migrated, number)
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


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _state(found: os.stat_result | None) -> tuple:
    if found is None:
        return ()
    return found.st_mode, found.st_size, found.st_mtime_ns


def written_line(side: str, paths: list[Path]) -> str:
    """What verify says of the user's files a side wrote where it could not redirect the write."""
    named = ", ".join(str(path) for path in paths[:_SHOWN])
    more = f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else ""
    return (f"{side} wrote your files: {named}{more}; a write from C code (an extension's own files) or a "
            f"process without Python is not redirected where the system forbids an overlay: restore them from "
            f"version control or a backup")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
