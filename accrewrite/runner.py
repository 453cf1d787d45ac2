"""Running a migration over many files: read, migrate, write, each file in a worker process.

Each file is handled on its own: one that cannot be read, decoded, parsed or written, or whose
worker crashed or timed out (``accrewrite.workers``), gets an error and the others still run.
Only regular files are read (a FIFO would block the run). Writes are atomic (a temporary file
beside the target, then a rename), keep the file's mode, and happen only when the output differs
from the input. A temporary left by a process killed mid-write names that process, and the next
run that writes in its directory removes it. Workers return plain records (no syntax trees), with
the diff already made, so the parent only prints.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from accrewrite import parsing
from accrewrite.atomic_file import is_temporary, remove_orphans, write_atomically
from accrewrite.engine import Options, migrate_source
from accrewrite.errors import FileError
from accrewrite.rule import Finding
from accrewrite.unified_diff import unified_diff
from accrewrite.workers import Lost, map_isolated

MODES = ("diff", "in-place", "check", "output-dir")


@dataclass(frozen=True)
class Job:
    """What to do with one file: where it came from and, for --output-dir, where it goes."""

    path: Path
    output: Path | None = None


@dataclass
class Outcome:
    """The result of one file, small enough to send between processes."""

    path: str
    changed: bool = False
    written: bool = False
    error: FileError | None = None
    fixes: list[Finding] = field(default_factory=list)
    diagnostics: list[Finding] = field(default_factory=list)
    withheld: list[Finding] = field(default_factory=list)
    diff: str = ""
    # The source lines that diagnostics point at, by number, for the full output format.
    lines: dict[int, str] = field(default_factory=dict)
    # False for a path that names no file (it does not exist, or a folder could not be walked):
    # an error, not a file, in the summary.
    file: bool = True


def _diff(path: str, before: bytes, after: bytes) -> str:
    def lines(data: bytes) -> list[str]:
        return data.decode("utf-8", errors="replace").splitlines(keepends=True)

    return "".join(unified_diff(lines(before), lines(after), f"a/{path}", f"b/{path}"))


def _read(path: Path, mode: str) -> bytes:
    """The file's bytes; OSError, or _Refused when it is not a regular file to read (and, for
    ``--in-place``, to write)."""
    if mode == "in-place" and _special(path):
        raise _Refused("cannot rewrite a special file in place; migrate the file it stands for, or use --diff")
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # a FIFO must not block the open
    with os.fdopen(descriptor, "rb") as handle:
        kind = stat.S_IFMT(os.fstat(descriptor).st_mode)
        if kind != stat.S_IFREG:
            raise _Refused(f"not a regular file ({_KINDS.get(kind, 'special file')}); accrewrite reads regular files only")
        return handle.read()


class _Refused(Exception):
    pass


_KINDS = MappingProxyType({stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"})


def _special(path: Path) -> bool:
    """Whether ``path`` is, or links to, a name under /dev or /proc (``/dev/stdin`` stands for
    whatever standard input was redirected from)."""
    name = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on a chain of links
        if name.startswith(("/dev/", "/proc/")):
            return True
        try:
            name = os.path.normpath(os.path.join(os.path.dirname(name), os.readlink(name)))
        except OSError:
            return False
    return False


_WRITABLE = "make it writable, or write migrated copies elsewhere with --output-dir"


def _write_error(exc: OSError, path: Path) -> FileError:
    where = f"cannot write {exc.filename or path}"
    if exc.filename and is_temporary(Path(exc.filename).name):  # the directory refused it
        where = f"cannot write in {Path(exc.filename).parent}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return FileError(f"{where}: {exc.strerror}; {_WRITABLE}")
    return FileError(f"{where}: {exc.strerror or exc}")


def migrate_text(display: str, source: bytes, options: Options, mode: str) -> tuple[Outcome, bytes]:
    """Migrate source named ``display`` in memory: its outcome (a diff in diff and check modes)
    and the migrated bytes."""
    result = migrate_source(source, display, options)
    for finding in (*result.fixes, *result.diagnostics, *result.withheld):
        finding.node = None  # syntax trees stay in this process
    outcome = Outcome(
        display, changed=result.changed, error=result.error, fixes=result.fixes,
        diagnostics=result.diagnostics, withheld=result.withheld,
    )
    if result.error is not None:
        return outcome, source
    if result.diagnostics:
        text = re.split(r"\r\n?|\n", source.decode("utf-8", errors="replace"))
        outcome.lines = {d.line: text[d.line - 1] for d in result.diagnostics if 0 < d.line <= len(text)}
    if result.changed and mode in ("diff", "check"):
        outcome.diff = _diff(display, source, result.output)
    return outcome, result.output


def process(job: Job, options: Options, mode: str) -> Outcome:
    """Migrate one file and do what ``mode`` says with the result."""
    display = str(job.path)
    try:
        source = _read(job.path, mode)
    except _Refused as exc:
        return Outcome(display, error=FileError(str(exc)))
    except OSError as exc:
        return Outcome(display, error=FileError(f"cannot read: {exc.strerror or exc}"))
    outcome, output = migrate_text(display, source, options, mode)
    if outcome.error is not None:
        return outcome
    try:
        if mode == "in-place" and outcome.changed:
            file_mode = stat.S_IMODE(job.path.stat().st_mode)
            if not file_mode & stat.S_IWUSR:
                outcome.error = FileError(f"cannot write: the file is read-only; {_WRITABLE}")
                return outcome
            write_atomically(job.path, lambda handle: handle.write(output), file_mode, sweep=False)
            outcome.written = True
        elif mode == "output-dir":
            job.output.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(job.output, lambda handle: handle.write(output),
                             stat.S_IMODE(job.path.stat().st_mode), sweep=False)
            outcome.written = True
    except OSError as exc:
        outcome.error = _write_error(exc, job.output if mode == "output-dir" else job.path)
    return outcome


def _process_star(arguments) -> Outcome:
    parsing.keep()  # a worker only migrates
    return process(*arguments)


def run(jobs: list[tuple[Job, Options]], mode: str, workers: int = 1, progress=None,
        timeout: float | None = None) -> list[Outcome]:
    """Process every job with its options in ``workers`` worker processes, calling
    ``progress()`` after each file, with at most ``timeout`` seconds a file. Results come back in
    the order of ``jobs``."""
    if mode in ("in-place", "output-dir"):
        for directory in {(job.output or job.path).parent for job, _ in jobs}:
            remove_orphans(directory)
    # Largest files first: with several workers, a large file started last would leave the
    # others idle while it runs.
    order = sorted(range(len(jobs)), key=lambda index: -_size(jobs[index][0].path)) if workers > 1 else range(len(jobs))
    tasks = [(jobs[index][0], jobs[index][1], mode) for index in order]
    results: list = [None] * len(jobs)
    for index, result in zip(order, map_isolated(_process_star, tasks, workers, timeout, progress)):
        results[index] = result
    return [
        Outcome(str(job.path), error=FileError(result.reason)) if isinstance(result, Lost) else result
        for (job, _), result in zip(jobs, results)
    ]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # reading it will say why
        return 0
