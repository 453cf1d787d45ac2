"""``accrewrite verify``: run a training script and its migration side by side and compare them.

Each side runs in a scratch copy of the working directory (``Workspace``): the script's own
directory holds migrated copies of its Python files on a migrated side, and the user's files are
never written. Small files are copied, so a checkpoint one side writes is not read by the other;
files over ``COPY_LIMIT`` (datasets) are linked, not copied. The script runs unedited under
``accrewrite.probe``, which records each optimizer step's loss and a parameter checksum per rank;
``--nproc`` runs it under accrun (torchrun). On a torch_xla side the probe draws the device's
random numbers on the CPU, as the original draws them. Where a step differs by more than
``--rtol``, up to ``NUDGES`` reruns of the first side with its parameters nudged by
``NUDGE_SIZE`` measure how far such differences alone move the training; within
``FLOOR_MARGIN`` times their drift, the step matches.

Exit codes: 0 every step within ``--rtol``; 1 a step diverges (the first one is named), or a
torch_xla side trained on the CPU or recompiled every step; 2 a side could not run (its error and
what to do are printed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from accrewrite.discovery import SKIPPED_DIRS
from accrewrite.engine import Options, migrate_source
from accrewrite.probe import HOST_RANDOM, NUDGE, NUDGE_SIZE

ORIGINAL = "original"
# A step within this many times the drift of the nudged reruns matches: the other side's kernels
# differ in every operation of every step, not once, as a rerun's nudge does.
FLOOR_MARGIN = 10
# Nudged reruns, each with its own random nudge, until their drift accounts for a difference: one
# nudge may flip no ReLU where another kernel's rounding flips several.
NUDGES = 3
COPY_LIMIT = 8 * 1024 * 1024  # bytes: larger files are linked into a workspace, not copied
_TAIL = 25  # lines of a failed side's output to show


@dataclass
class Side:
    """One run: the original script, or its migration to ``target``."""

    name: str
    target: str | None = None
    nudge: int = 0  # a floor run's seed: its parameters nudged before their first use
    records: list[list[dict]] = field(default_factory=list)  # per rank
    returncode: int | None = None
    output: str = ""
    migration_errors: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return min((len(rank) for rank in self.records), default=0)


class VerifyError(Exception):
    """A side could not run; the message says why and what to do."""


def _migrated(path: Path, options: Options, errors: list[str]) -> bytes:
    source = path.read_bytes()
    result = migrate_source(source, str(path), options)
    if result.error is not None:
        errors.append(f"{path}:{result.error.line}: {result.error.reason}")
        return source
    return result.output


class Workspace:
    """A scratch copy of the working directory for one side, with the script's directory
    migrated on a migrated side."""

    def __init__(self, root: Path, cwd: Path, script: Path, unsafe_fixes: bool):
        self.root = root
        self.cwd = cwd
        self.script = script
        self.unsafe_fixes = unsafe_fixes

    def build(self, side: Side, options: Options | None) -> tuple[Path, Path]:
        """The side's (working directory, script path). The copy sits two folders deep, and the
        siblings of the working directory and of its parent are linked beside them, so that
        ``../data`` (PyTorch's examples) and ``../../data`` (tutorials that keep one data folder
        for the whole repository) are found."""
        home = self.root / side.name / (self.cwd.parent.name or "parent") / (self.cwd.name or "root")
        home.parent.mkdir(parents=True)
        _link_siblings(self.cwd, home)
        _link_siblings(self.cwd.parent, home.parent)
        script_dir = self.script.parent
        if script_dir.is_relative_to(self.cwd):
            _mirror(self.cwd, home, script_dir if options else None, options, side.migration_errors)
            return home, home / self.script.relative_to(self.cwd)
        script_home = self.root / f"{side.name}.script"
        _mirror(self.cwd, home, None, None, side.migration_errors)
        _mirror(script_dir, script_home, script_dir if options else None, options, side.migration_errors)
        return home, script_home / self.script.name


def _link_siblings(folder: Path, copy: Path) -> None:
    """Link the entries beside ``folder`` beside its ``copy``."""
    if folder.parent == folder:
        return
    for sibling in folder.parent.iterdir():
        if sibling.name != folder.name and not os.path.lexists(copy.parent / sibling.name):
            (copy.parent / sibling.name).symlink_to(sibling)


def _mirror(source: Path, target: Path, migrate_under: Path | None, options: Options | None, errors: list[str]):
    """Copy ``source`` to ``target``: directories made, files copied (linked above COPY_LIMIT),
    Python files under ``migrate_under`` migrated."""
    for directory, subdirs, files in os.walk(source):
        here = Path(directory)
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS and not (here / d / "pyvenv.cfg").exists()]
        made = target / here.relative_to(source)
        made.mkdir(parents=True, exist_ok=True)
        for name in files:
            file = here / name
            copy = made / name
            if migrate_under is not None and name.endswith(".py") and file.is_relative_to(migrate_under):
                copy.write_bytes(_migrated(file, options, errors))
                shutil.copymode(file, copy)
            elif file.is_file() and file.stat().st_size <= COPY_LIMIT:
                shutil.copy2(file, copy)
            elif file.exists():
                copy.symlink_to(file.resolve())


def _command(script: Path, args: list[str], records: Path, steps: int, nproc: int, python: str) -> list[str]:
    probe = [str(Path(__file__).with_name("probe.py")), str(records), str(steps), str(script), *args]
    if nproc <= 1:
        return [python, *probe]
    return [python, "-m", "accrewrite.launcher", "--standalone", f"--nproc_per_node={nproc}", *probe]


def _python_for(side: Side) -> str:
    """torch_xla sides run in ACCREWRITE_XLA_PYTHON where it is set (torch_xla pins its own torch)."""
    if side.target == "torch_xla":
        return os.environ.get("ACCREWRITE_XLA_PYTHON", sys.executable)
    return sys.executable


def run_side(side: Side, workspace: Workspace, args: list[str], steps: int, nproc: int, timeout: float,
             progress) -> None:
    options = Options(target=side.target, unsafe_fixes=workspace.unsafe_fixes) if side.target else None
    cwd, script = workspace.build(side, options)
    records = workspace.root / f"{side.name}.records"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", NUDGE: str(side.nudge)}
    if side.target == "torch_xla":
        env.setdefault("PJRT_DEVICE", "CPU")
        env[HOST_RANDOM] = "1"  # the XLA device draws what the CPU draws: dropout and noise compare
    log = workspace.root / f"{side.name}.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            _command(script, args, records, steps, nproc, _python_for(side)),
            cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None:
                if time.monotonic() > deadline:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    side.returncode = None
                    break
                progress(side, _read_records(records, nproc))
                time.sleep(0.2)
            else:
                side.returncode = process.returncode
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    side.output = log.read_text(errors="replace")
    side.records = _read_records(records, nproc)
    progress(side, side.records, finished=True)


def _read_records(folder: Path, nproc: int) -> list[list[dict]]:
    ranks = []
    for rank in range(max(nproc, 1)):
        path = folder / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        ranks.append([json.loads(line) for line in lines if line.endswith("}")])
    return ranks


# Comparing ---------------------------------------------------------------------------------------


def deviation(a: float | None, b: float | None) -> float:
    """Relative difference, against the larger magnitude (0 when both are 0)."""
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def _checksum_deviation(a: dict, b: dict) -> float:
    """How far two sides' parameter changes differ, relative to the changes themselves: a
    projection on random signs varies like the change's norm, and can pass near zero."""
    scale = max(a.get("change", 0.0), b.get("change", 0.0))
    difference = abs(a["checksum"] - b["checksum"])
    return difference / scale if scale else (0.0 if difference == 0 else float("inf"))


@dataclass
class Verdict:
    code: int
    message: str
    rows: list[tuple] = field(default_factory=list)


def _deviations(first: Side, second: Side) -> list[list[tuple[float, float]]]:
    """Per rank, per step: (loss deviation, checksum deviation)."""
    steps = min(first.steps, second.steps)
    return [[(deviation(a[step]["loss"], b[step]["loss"]), _checksum_deviation(a[step], b[step])) for step in range(steps)]
            for a, b in zip(first.records, second.records)]


def compare(first: Side, second: Side, rtol: float, floors: tuple[Side, ...] = ()) -> Verdict:
    """Step by step, rank by rank: the losses and checksums within ``rtol``, or with ``floors``
    (``first`` rerun nudged) within ``FLOOR_MARGIN`` times their largest drift from ``first``."""
    found = _deviations(first, second)
    drift = None  # per rank, per step: the largest drift of any floor
    for floor in floors:
        more = _deviations(first, floor)
        drift = more if drift is None else [[tuple(map(max, a, b)) for a, b in zip(*ranks)] for ranks in zip(drift, more)]
    reruns = "a rerun" if len(floors) == 1 else f"{len(floors)} reruns"
    rows = []
    worst = (0.0, 0, 0)
    diverged = None
    widened = None  # the step where the floor allowed most beyond rtol
    for rank, steps in enumerate(found):
        for step, (loss_dev, sum_dev) in enumerate(steps):
            drifted = drift[rank][step] if drift and step < len(drift[rank]) else (0.0, 0.0)
            allowed = [max(rtol, FLOOR_MARGIN * r) for r in drifted]
            if rank == 0:
                rows.append((step + 1, first.records[0][step]["loss"], second.records[0][step]["loss"], loss_dev,
                             sum_dev, max(drifted) if drift else None))
            dev = max(loss_dev, sum_dev)
            worst = max(worst, (dev, step + 1, rank))
            over = [what for what, d, limit in (("loss", loss_dev, allowed[0]), ("parameter checksum", sum_dev, allowed[1]))
                    if d > limit]
            if over and diverged is None:
                diverged = (step + 1, rank, over[0], loss_dev if over[0] == "loss" else sum_dev, max(drifted))
            elif dev > rtol and (widened is None or dev > widened[0]):
                widened = (dev, step + 1, max(drifted))
    if diverged is not None:
        step, rank, what, dev, drifted = diverged
        where = f" on rank {rank}" if len(first.records) > 1 else ""
        floor_note = f"; {reruns} nudged by {NUDGE_SIZE:.0e} drift at most {drifted:.2%} there" if drift else ""
        return Verdict(1, f"diverge: the {what} differs by {dev:.2%} at step {step}{where} (tolerance {rtol:.0%}"
                          f"{floor_note})", rows)
    if first.steps != second.steps:
        return Verdict(1, f"diverge: {first.name} made {first.steps} steps, {second.name} {second.steps}", rows)
    steps = min(first.steps, second.steps)
    if widened is not None:
        dev, step, drifted = widened
        return Verdict(0, f"match: {steps} steps within {rtol:.0%} or within {FLOOR_MARGIN}x the drift of {reruns} "
                          f"nudged by {NUDGE_SIZE:.0e} (step {step}: {dev:.2%}, nudged {drifted:.2%})", rows)
    dev, step, _ = worst
    return Verdict(0, f"match: {steps} steps within {rtol:.0%} (largest deviation {dev:.2%}, step {step})", rows)


def check_xla(side: Side) -> tuple[str, str | None] | None:
    """What a torch_xla side ran on the XLA device, and why it failed although its numbers may
    match: no XLA execution (it trained on the CPU), or a compilation in every step of the
    second half (recompiling per step)."""
    steps = side.records[0] if side.records else []
    counts = [step.get("xla") for step in steps]
    if not counts or any(c is None for c in counts):
        return None
    last = counts[-1]
    settled = next((i + 1 for i, c in enumerate(counts) if c["compiles"] == last["compiles"]), len(counts))
    summary = (f"{side.name}: {last['executions']} XLA graph executions, {last['compiles']} compilations "
               f"(the last in step {settled} of {len(counts)})")
    if last["executions"] == 0:
        return summary, f"{side.name} ran no XLA graph: it trained on the CPU, not on the XLA device"
    half = counts[len(counts) // 2:]
    if len(half) >= 3 and all(later["compiles"] > earlier["compiles"] for earlier, later in zip(half, half[1:])):
        return summary, f"{side.name} compiles a new graph every step ({last['compiles']} in {len(counts)} steps)"
    return summary, None


# Reporting ---------------------------------------------------------------------------------------


def _cannot_run(side: Side, steps: int, timeout: float) -> str:
    tail = "\n".join(side.output.rstrip().splitlines()[-_TAIL:])
    if side.returncode is None:
        reason = f"it did not make {steps} steps in {timeout:.0f} s (--timeout)"
    elif side.steps == 0:
        reason = f"it exited with status {side.returncode} before its first optimizer step"
    else:
        return ""
    hint = "check that the script runs here with these arguments (after `--`)"
    if side.name == ORIGINAL and any(word in tail for word in ("CUDA", "cuda", "NVIDIA", "accelerator device")):
        hint = ("the original needs CUDA, which this machine lacks: compare two migrations instead, e.g. "
                "`--compare runtime,torch_xla`")
    elif "No module named" in tail:
        hint = "install the missing module for the interpreter that ran it"
        if side.target == "torch_xla":
            hint += " (torch_xla sides run in $ACCREWRITE_XLA_PYTHON when it is set)"
    return f"{side.name} cannot run: {reason}; {hint}.\n{tail}"


def _table(first: Side, second: Side, verdict: Verdict) -> Table:
    table = Table(title="rank 0" if len(first.records) > 1 else None)
    floor = any(row[5] is not None for row in verdict.rows)
    columns = ("step", f"{first.name} loss", f"{second.name} loss", "deviation", "checksum deviation")
    for column in (*columns, *(["nudged drift"] if floor else [])):
        table.add_column(column, justify="right")
    for step, a, b, dev, sum_dev, drifted in verdict.rows:
        cells = [str(step), _number(a), _number(b), f"{dev:.3%}", f"{sum_dev:.3%}"]
        table.add_row(*cells, *([f"{drifted:.3%}"] if floor else []))
    return table


def _number(value) -> str:
    return "-" if value is None else f"{value:.6g}"


def verify(script: str, args: list[str], sides: list[Side], steps: int, nproc: int, rtol: float,
           unsafe_fixes: bool, timeout: float, keep: bool, out: Console, err: Console) -> int:
    path = Path(script).resolve()
    if not path.is_file():
        err.print(f"[bold red]error:[/] {script}: no such file", highlight=False)
        return 2
    root = Path(tempfile.mkdtemp(prefix="accrewrite-verify-"))
    workspace = Workspace(root, Path.cwd().resolve(), path, unsafe_fixes)
    progress = _Progress(err, steps)
    try:
        for side in sides:
            run_side(side, workspace, args, steps, nproc, timeout, progress)
            problem = _cannot_run(side, steps, timeout)
            if problem:
                progress.done()
                for error in side.migration_errors:
                    err.print(f"migration error: {error}", highlight=False)
                err.print(f"[bold red]error:[/] {problem}", highlight=False)
                return 2
        progress.done()
        first, second = sides
        verdict = compare(first, second, rtol)
        floors = []
        while verdict.code == 1 and first.steps == second.steps and len(floors) < NUDGES:
            floor = _nudged_floor(first, len(floors) + 1, workspace, args, steps, nproc, timeout, progress)
            if floor is None:
                break
            floors.append(floor)
            verdict = compare(first, second, rtol, tuple(floors))
        out.print(_table(first, second, verdict))
        checked = [found for found in (check_xla(side) for side in sides if side.target == "torch_xla") if found]
        for summary, _ in checked:
            out.print(summary, highlight=False)
        problems = [problem for _, problem in checked if problem]
        if verdict.code == 0 and problems:
            verdict = Verdict(1, "; ".join(problems), verdict.rows)

        colour = "green" if verdict.code == 0 else "red"
        out.print(f"[bold {colour}]{verdict.message}[/]", highlight=False)
        return verdict.code
    finally:
        if keep:
            err.print(f"workspaces, records and logs kept in {root}", highlight=False)
        else:
            shutil.rmtree(root, ignore_errors=True)


def _nudged_floor(first: Side, seed: int, workspace: Workspace, args: list[str], steps: int, nproc: int,
                  timeout: float, progress) -> Side | None:
    """``first`` rerun with its parameters nudged before their first use (``NUDGE_SIZE``): how far
    kernel-level differences alone move this training (ReLUs that flip and BatchNorm over small
    batches magnify them from step to step). None where the rerun cannot run."""
    floor = Side(f"{first.name}-nudged-{seed}", first.target, nudge=seed)
    run_side(floor, workspace, args, steps, nproc, timeout, progress)
    progress.done()
    return floor if floor.steps == first.steps else None


class _Progress:
    """Which side runs and how many of its steps are recorded: a live line on a terminal, a line
    per side when it ends."""

    def __init__(self, console: Console, steps: int):
        self.console = console
        self.steps = steps
        self.status = None

    def __call__(self, side: Side, records: list[list[dict]], finished: bool = False) -> None:
        text = f"{side.name}: {min((len(rank) for rank in records), default=0)}/{self.steps} steps"
        if finished:
            self.done()
            self.console.print(text, highlight=False)
        elif self.status is None and self.console.is_terminal:
            self.status = self.console.status(text)
            self.status.start()
        elif self.status is not None:
            self.status.update(text)

    def done(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
