"""``accrewrite verify``: run a training script and its migration side by side and compare them.

Before anything runs, each side's interpreter is asked to import what its side needs
(``preflight``). Each side runs in a view of the project of its own (``workspace``): it reads the
user's files where they are, and what it writes is redirected into its view. Each side runs the
script, to its end unless ``--steps`` says otherwise, with the probe in every Python process it
starts (``sides``, ``probe``); a notebook runs as its code cells in order, its IPython lines (magics,
shell escapes) skipped with a note. The first side is then rerun with its parameters nudged, to measure the
noise that each step's tolerance is made of (``verdict``).

Exit codes: 0 every step of every rank within its tolerance, and both sides ended well; 1 the
second side failed, went non-finite or differs beyond a tolerance (the first such step is named),
or a side whose target counts its graphs (torch_xla's) trained on the CPU or compiled in every
step after warm-up (``graphs``); 2 the first side (the original)
cannot run, or verify cannot set up (its error and what to do are printed); 129, 130, 143
stopped by SIGHUP, SIGINT, SIGTERM, after ending every process of the sides and removing the
workspace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rich.console import Console

from accrewrite.choices import ORIGINAL
from accrewrite.errors import MigrationError
from accrewrite.notebook import is_notebook
from accrewrite.verify import html_report, preflight, report, sides, verdict
from accrewrite.verify.sides import Side
from accrewrite.verify.workspace import Workspace, WorkspaceError, project_root, skipped_in_notebook, written_line

# Nudged reruns, each with its own random nudge, until their drift accounts for a difference: one
# nudge may flip no ReLU where another kernel's rounding flips several.
NUDGES = 3

__all__ = ["ORIGINAL", "Side", "verify"]


class Stopped(BaseException):
    """verify received SIGTERM or SIGHUP."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stoppable():
    """SIGTERM and SIGHUP raise ``Stopped`` (SIGINT raises KeyboardInterrupt) while verify runs,
    so that the sides are ended and the workspace removed; the handlers are put back after."""

    def stop(signum, frame):
        raise Stopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass(frozen=True)
class Run:
    """One verify: its workspace and options, and how it runs a side."""

    workspace: Workspace
    args: list[str]
    steps: int | None
    nproc: int
    timeout: float
    progress: report.Progress
    ran: list[Side] = field(default_factory=list)  # every side run, in order

    def run(self, side: Side) -> Side:
        self.ran.append(side)
        root = self.workspace.root
        cwd, script = self.workspace.view(side.name, side.target, side.migration_errors)
        records = root / "records" / side.name
        env = {**sides.environment(side, records, self.steps, self.nproc), **self.workspace.redirection(side.name)}
        argv = self.workspace.isolated(side.name, sides.command(side.python, script, self.args, self.nproc))
        try:
            sides.run(side, argv, cwd, env, records, root / f"{side.name}.log", self.timeout, self.progress)
        finally:
            written = self.workspace.written()
            if written:
                self.progress.console.print(written_line(side.name, written), highlight=False, soft_wrap=True)
        return side


def verify(script: str, args: list[str], pair: list[Side], steps: int | None, nproc: int, rtol: float | None,
           unsafe_fixes: bool, timeout: float, keep: bool, root: str | None, out: Console, err: Console,
           events: TextIO | None = None, html: str | None = None) -> int:
    """``events``: where ``--format json`` writes its events; ``html``: where ``--report`` writes
    the report."""
    progress = report.Progress(err, steps, events)
    if html is not None and not Path(html).resolve().parent.is_dir():  # said before anything runs
        ending = report.error(err, f"--report {html}: no folder {Path(html).resolve().parent} to write it in")
    else:
        ending = _verify(script, args, pair, steps, nproc, rtol, unsafe_fixes, timeout, keep, root, out, err,
                         progress)
        if html is not None:
            ending = _write_report(Path(html), ending, script, err)
    progress.result(ending)
    return ending.code


def _write_report(path: Path, ending: report.Ending, script: str, err: Console) -> report.Ending:
    try:
        html_report.write(path, ending, script)
    except OSError as exc:
        return report.error(err, f"cannot write the report {path}: {exc}")
    err.print(f"report: {path}", highlight=False, soft_wrap=True)
    return ending


def _verify(script: str, args: list[str], pair: list[Side], steps: int | None, nproc: int, rtol: float | None,
            unsafe_fixes: bool, timeout: float, keep: bool, root: str | None, out: Console, err: Console,
            progress: report.Progress) -> report.Ending:
    path = Path(script).resolve()
    if not path.is_file():
        return report.error(err, f"{script}: no such file")
    if is_notebook(path.name):
        try:
            skipped = skipped_in_notebook(path)
        except MigrationError as exc:
            return report.error(err, f"{script}: {exc.error.reason}")
        err.print(report.notebook_note(skipped), highlight=False, soft_wrap=True)
    missing = preflight.problems([(side.name, side.target, side.python) for side in pair])
    if missing:
        return report.error(err, "\n".join(missing))
    cwd = Path.cwd().resolve()
    try:
        project = project_root(cwd, Path(root) if root else None)
    except WorkspaceError as exc:
        return report.error(err, str(exc))
    try:
        folder = Path(tempfile.mkdtemp(prefix="accrewrite-verify-"))
    except OSError as exc:
        return report.error(err, f"cannot make the workspace: {exc}; set TMPDIR to a writable folder")
    try:
        with _stoppable():
            try:
                workspace = Workspace(folder, cwd, path, project, unsafe_fixes)
                err.print(workspace.survey(), highlight=False, soft_wrap=True)
            except (WorkspaceError, OSError) as exc:
                return report.error(err, f"cannot make the workspace: {exc}")
            run = Run(workspace, args, steps, nproc, timeout, progress)
            try:
                ending = _compare(run, pair, rtol, out, err)
            except OSError as exc:  # the workspace's disk filled, say, while a side's view was made
                return report.error(err, f"verify could not go on in {folder}: {exc}")
            return dataclasses.replace(ending, sides=run.ran, name=workspace.users_line)
    except Stopped as stopped:
        progress.done()
        words = f"stopped by {signal.Signals(stopped.signum).name}: the sides' processes are ended"
        err.print(words, highlight=False)
        return report.Ending(128 + stopped.signum, words)
    finally:
        progress.done()
        if keep:
            err.print(f"workspace, records and logs kept in {folder}", highlight=False)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _compare(run: Run, pair: list[Side], rtol: float | None, out: Console, err: Console) -> report.Ending:
    first, second = pair
    run.run(first)
    if first.failed:
        return report.cannot_run(err, first, run.steps, run.timeout)
    run.run(second)
    if second.failed:
        return report.failed(out, err, first, second, run.timeout)
    broken = verdict.not_finite(first) or verdict.not_finite(second)
    if broken:
        return report.non_finite(out, first, second)
    if first.records.keys() != second.records.keys() or first.steps != second.steps:
        return report.different_runs(out, first, second)
    floors: list[Side] = []
    failures: list[Side] = []
    for seed in range(1, NUDGES + 1):
        floor = run.run(Side(f"{first.name}-nudged-{seed}", first.target, first.python, nudge=seed))
        if floor.returncode != 0:
            failures.append(floor)
            break
        floors.append(floor)
        if verdict.compare(first, second, tuple(floors), rtol).over is None:
            break
    comparison = verdict.compare(first, second, tuple(floors), rtol)
    return report.conclude(out, err, first, second, comparison, floors, failures, rtol, run.steps,
                           run.workspace.users_line)
