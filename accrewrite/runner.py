"""Running a migration over many files: read, migrate, write, in one process or a pool.

Each file is handled on its own: one that cannot be read, decoded, parsed or written gets an
error and the others still run. Writes are atomic (a temporary file beside the target, then a
rename), keep the file's mode, and happen only when the output differs from the input. Workers
return plain records (no syntax trees), with the diff already made, so the parent only prints.
"""

from __future__ import annotations

import difflib
import os
import stat
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from accrewrite.engine import FileError, Options, migrate_source
from accrewrite.rule import Finding

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


def _diff(path: str, before: bytes, after: bytes) -> str:
    def lines(data: bytes) -> list[str]:
        return data.decode("utf-8", errors="replace").splitlines(keepends=True)

    return "".join(difflib.unified_diff(lines(before), lines(after), f"a/{path}", f"b/{path}"))


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never a
    half-written one."""
    path = path.resolve()  # write through a symlink, keep the link
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def process(job: Job, options: Options, mode: str) -> Outcome:
    """Migrate one file and do what ``mode`` says with the result."""
    display = str(job.path)
    try:
        source = job.path.read_bytes()
    except OSError as exc:
        return Outcome(display, error=FileError(f"cannot read: {exc.strerror or exc}"))
    result = migrate_source(source, display, options)
    for finding in (*result.fixes, *result.diagnostics, *result.withheld):
        finding.node = None  # syntax trees stay in this process
    outcome = Outcome(
        display, changed=result.changed, error=result.error, fixes=result.fixes,
        diagnostics=result.diagnostics, withheld=result.withheld,
    )
    if result.error is not None:
        return outcome
    if result.changed and mode in ("diff", "check"):
        outcome.diff = _diff(display, source, result.output)
    try:
        if mode == "in-place" and result.changed:
            file_mode = stat.S_IMODE(job.path.stat().st_mode)
            if not file_mode & stat.S_IWUSR:
                outcome.error = FileError("cannot write: the file is read-only; make it writable or use --output-dir")
                return outcome
            write_atomic(job.path, result.output, file_mode)
            outcome.written = True
        elif mode == "output-dir":
            job.output.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(job.output, result.output, stat.S_IMODE(job.path.stat().st_mode))
            outcome.written = True
    except OSError as exc:
        outcome.error = FileError(f"cannot write: {exc.strerror or exc}")
    return outcome


def _process_star(arguments) -> Outcome:
    return process(*arguments)


def run(jobs: list[Job], options: Options, mode: str, workers: int = 1, progress=None) -> list[Outcome]:
    """Process every job, in ``workers`` processes, calling ``progress()`` after each file.
    Results come back in the order of ``jobs``."""
    tasks = [(job, options, mode) for job in jobs]
    if workers <= 1 or len(tasks) <= 1:
        outcomes = []
        for task in tasks:
            outcomes.append(_process_star(task))
            if progress:
                progress()
        return outcomes
    chunk = max(1, min(32, len(tasks) // (workers * 4)))
    outcomes = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for outcome in pool.map(_process_star, tasks, chunksize=chunk):
            outcomes.append(outcome)
            if progress:
                progress()
    return outcomes
