"""Running a migration over many files: read and migrate each file in a worker process, settle
what the project's files decide for each other (``accrewrite.project``), then write.

Each file is handled on its own: one that cannot be read, decoded, parsed or written, or whose
worker crashed or timed out (``accrewrite.workers``), gets an error and the others still run.
Only regular files are read (a FIFO would block the run). Workers return plain records (no
syntax trees), with the diff already made and the migrated bytes, so the parent only settles,
writes and prints. Nothing is written before the project's decision: a file that a refused
script imports is left as it is, one that drops DistributedDataParallel where the module that
steps does not reduce is migrated again keeping it. Writes are atomic (a temporary file beside
the target, then a rename), keep the file's mode, and happen only when the output differs from
the input. A temporary left by a process killed mid-write names that process, and the next run
that writes in its directory removes it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from accrewrite import parsing, project
from accrewrite.base.atomic_file import is_temporary, remove_orphans, write_atomically
from accrewrite.engine import Options, migrate_source
from accrewrite.errors import FileError, MigrationError
from accrewrite.notebook import Notebook, is_notebook
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
    # The source lines that diagnostics point at, by (cell, line), for the full output format.
    lines: dict[tuple[int, int], str] = field(default_factory=dict)
    # In a notebook: where each finding's (cell, line) is written in the file, for the formats
    # that point into the file (GitHub, GitLab, SARIF).
    file_lines: dict[tuple[int, int], int] = field(default_factory=dict)
    # False for a path that names no file (it does not exist, or a folder could not be walked):
    # an error, not a file, in the summary.
    file: bool = True
    # What the project's decision reads of the migration, its migrated bytes among it (written
    # once the decision is made); None once written, and where the file could not be migrated.
    member: project.Member | None = None


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
    if is_notebook(display):
        return _migrate_notebook(display, source, options, mode)
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
        outcome.lines = {(0, d.line): text[d.line - 1] for d in result.diagnostics if 0 < d.line <= len(text)}
    if result.changed and mode in ("diff", "check"):
        outcome.diff = _diff(display, source, result.output)
    outcome.member = project.member(Path(display), result)
    return outcome, result.output


def _migrate_notebook(display: str, data: bytes, options: Options, mode: str) -> tuple[Outcome, bytes]:
    """Migrate a notebook's code cells as one script (``accrewrite.notebook``): findings and
    errors point at a cell and a line in it, the diff is per cell, and the migrated bytes are
    the notebook with the changed cells' sources replaced."""
    try:
        book = Notebook.read(data)
        result = migrate_source(book.script(), display, options)
        _place_in_cells(book, result)
        changed = book.migrated_sources(result.output) if result.changed else {}
        for cell in book.cells:
            if cell.writes is not None:
                _add_written_module(cell, migrate_source(cell.written()[1], f"{display}:cell {cell.number}", options),
                                    result, changed)
        output = book.with_sources(changed) if changed and result.error is None else data
    except MigrationError as exc:
        return Outcome(display, error=exc.error), data
    outcome = Outcome(display, changed=bool(changed) and result.error is None, error=result.error, fixes=result.fixes,
                      diagnostics=result.diagnostics, withheld=result.withheld)
    if result.error is not None:
        return outcome, data
    sources = {cell.number: cell.source.splitlines() for cell in book.cells}
    for finding in (*result.fixes, *result.diagnostics, *result.withheld):
        finding.node = None  # syntax trees stay in this process
        key = (finding.cell, finding.line)
        outcome.file_lines[key] = book.file_line(*key)
        if 0 < finding.line <= len(sources.get(finding.cell, ())):
            outcome.lines[key] = sources[finding.cell][finding.line - 1]
    if changed and mode in ("diff", "check"):
        outcome.diff = "".join(_diff(f"{display}:cell {number}", _ended(book.sources[number - 1]), _ended(source))
                               for number, source in sorted(changed.items()))
    # The project reads the script's migration; the file written is the notebook.
    outcome.member = replace(project.member(Path(display), result), changed=outcome.changed,
                             output=output if outcome.changed else None)
    return outcome, output


def _place_in_cells(book: Notebook, result) -> None:
    """Findings and the error of ``result`` (lines of the notebook's script) as lines of cells,
    and so is a line a message names."""

    def cells_named(message: str) -> str:
        return re.sub(r"\bline (\d+)\b", lambda match: "cell {}, line {}".format(*book.position(int(match[1]))),
                      message)

    for finding in (*result.fixes, *result.diagnostics, *result.withheld):
        cell, line = book.position(finding.line)
        if finding.end_line:
            finding.end_line += line - finding.line
        finding.cell, finding.line, finding.message = cell, line, cells_named(finding.message)
    if result.error is not None:
        result.error.reason = cells_named(result.error.reason)
        if result.error.line:
            result.error.cell, result.error.line = book.position(result.error.line)


def _add_written_module(cell, written, result, changed: dict[int, str]) -> None:
    """A ``%%writefile`` cell's module, migrated on its own (``written``), joins the notebook's
    ``result``: its findings and error on the cell's lines, its output in ``changed``."""
    for finding in (*written.fixes, *written.diagnostics, *written.withheld):
        finding.cell, finding.line = cell.number, finding.line + 1  # below the magic's line
        finding.end_line += 1 if finding.end_line else 0
    result.fixes += written.fixes
    result.diagnostics += written.diagnostics
    result.withheld += written.withheld
    if written.error is not None and result.error is None:
        result.error = written.error
        result.error.cell, result.error.line = cell.number, written.error.line + 1 if written.error.line else 0
    elif written.changed:
        changed[cell.number] = cell.written()[0] + written.output.decode()


def _ended(text: str) -> bytes:
    """A cell's source with a final line end, so that a diff shows its last line as a line."""
    return (text if text.endswith("\n") or not text else text + "\n").encode()


def process(job: Job, options: Options, mode: str) -> Outcome:
    """Migrate one file on its own and do what ``mode`` says with the result (``run`` makes
    the project's decision in between)."""
    outcome = _migrated_job(job, options, mode)
    _write(job, outcome, mode)
    return outcome


def _migrated_job(job: Job, options: Options, mode: str) -> Outcome:
    """Migrate one file, writing nothing: the migrated bytes of a changed file come back with
    it, for the project's decision to read and the parent to write once it is made."""
    display = str(job.path)
    try:
        source = _read(job.path, mode)
    except _Refused as exc:
        return Outcome(display, error=FileError(str(exc)))
    except OSError as exc:
        return Outcome(display, error=FileError(f"cannot read: {exc.strerror or exc}"))
    return migrate_text(display, source, options, mode)[0]


def _write(job: Job, outcome: Outcome, mode: str) -> None:
    """Write a file's migration where ``mode`` says: in place where it changed, a copy of it
    (or of the file, unchanged) under --output-dir."""
    member, outcome.member = outcome.member, None
    writes = outcome.changed if mode == "in-place" else mode == "output-dir"
    if outcome.error is not None or not writes:
        return
    try:
        output = member.output if outcome.changed else _read(job.path, mode)
        if mode == "in-place":
            file_mode = stat.S_IMODE(job.path.stat().st_mode)
            if not file_mode & stat.S_IWUSR:
                outcome.error = FileError(f"cannot write: the file is read-only; {_WRITABLE}")
                return
            write_atomically(job.path, lambda handle: handle.write(output), file_mode, sweep=False)
        else:
            job.output.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(job.output, lambda handle: handle.write(output),
                             stat.S_IMODE(job.path.stat().st_mode), sweep=False)
        outcome.written = True
    except _Refused as exc:
        outcome.error = FileError(str(exc))
    except OSError as exc:
        outcome.error = _write_error(exc, job.output if mode == "output-dir" else job.path)


def _process_star(arguments) -> Outcome:
    parsing.keep()  # a worker only migrates
    return _migrated_job(*arguments)


def run(jobs: list[tuple[Job, Options]], mode: str, workers: int = 1, progress=None,
        timeout: float | None = None, roots: tuple[Path, ...] = (), lone: bool = False) -> list[Outcome]:
    """Process every job with its options in ``workers`` worker processes, calling
    ``progress()`` after each file, with at most ``timeout`` seconds a file; settle the
    project's decisions (the run's folders ``roots``; ``lone``: the run was given one file),
    then write. Results come back in the order of ``jobs``."""
    if mode in ("in-place", "output-dir"):
        for directory in {(job.output or job.path).parent for job, _ in jobs}:
            remove_orphans(directory)
    outcomes = _migrated(jobs, mode, workers, timeout, progress)
    _settle(jobs, outcomes, mode, workers, timeout, roots, lone)
    for (job, _), outcome in zip(jobs, outcomes):
        _write(job, outcome, mode)
    return outcomes


def _migrated(jobs: list[tuple[Job, Options]], mode: str, workers: int, timeout: float | None,
              progress=None) -> list[Outcome]:
    """Every job migrated in worker processes, nothing written, in the order of ``jobs``."""
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


def _settle(jobs: list[tuple[Job, Options]], outcomes: list[Outcome], mode: str, workers: int,
            timeout: float | None, roots: tuple[Path, ...], lone: bool) -> None:
    """The project's decisions, applied to ``outcomes``: files left as they are, files migrated
    again keeping DistributedDataParallel. Only where a file was refused, drops DDP without a
    step of its own, or (a lone file's run) runs with the scripts beside it that import it or
    the modules it imports."""
    members = [o.member or project.Member(job.path) for (job, _), o in zip(jobs, outcomes)]
    outside = []
    if lone and outcomes[0].changed:
        related = [(Job(path), jobs[0][1]) for path in project.related(jobs[0][0].path)]
        outside = [o.member for o in _migrated(related, "check", workers, timeout) if o.member is not None]
        roots = (project.lone_root(jobs[0][0].path),)
    if not project.needs_deciding(members + outside):
        return
    decisions = project.decide(members, list(roots), outside)
    for index, left in decisions.left.items():
        outcomes[index] = _left(outcomes[index], left)
    again = sorted(decisions.keep_ddp)
    kept = [(jobs[index][0], replace(jobs[index][1], keep_ddp=decisions.keep_ddp[index])) for index in again]
    for index, outcome in zip(again, _migrated(kept, mode, workers, timeout)):
        outcomes[index] = outcome


def _left(outcome: Outcome, left: project.Left) -> Outcome:
    """A file the project leaves as it is: its one finding (--output-dir copies it as it is)."""
    return Outcome(outcome.path, diagnostics=[left.finding], lines={(0, 1): left.first_line})


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # reading it will say why
        return 0
