"""What ``accrewrite verify`` prints: progress, the step table, the verdict, and for a side that
failed, how it ended and the end of its output. Each function that ends a verify returns its
exit code."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accrewrite.plural import counted
from accrewrite.targets import all_targets
from accrewrite.verify import graphs
from accrewrite.verify.probe import NUDGE_SIZE
from accrewrite.verify.sides import Side, read_records
from accrewrite.verify.verdict import CHAOTIC, FLOOR_MARGIN, METRICS, ROUNDING, Comparison, not_finite

MATCH, DIVERGE, CANNOT_RUN = 0, 1, 2
_TAIL = 25  # lines of a failed side's output to show


def error(err: Console, message: str) -> int:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return CANNOT_RUN


def notebook_note(skipped: list[str]) -> str:
    """What verify runs of a notebook."""
    said = "its code cells run in order as one script"
    if not skipped:
        return f"notebook: {said}"
    shown = ", ".join(f"`{line}`" for line in skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return f"notebook: {said}; {counted(len(skipped), 'IPython line')} not run: {escape(shown)}"


def _ended(side: Side, timeout: float) -> str:
    if side.returncode is None:
        return f"was still running after {timeout:g} s (--timeout)"
    if side.returncode < 0:
        try:
            return f"was killed by {signal.Signals(-side.returncode).name}"
        except ValueError:
            return f"was killed by signal {-side.returncode}"
    return f"exited with status {side.returncode}"


def _made(side: Side) -> str:
    return counted(side.steps, "step")


def _tail(err: Console, side: Side) -> None:
    for problem in side.migration_errors:
        err.print(f"migration error: {problem}", highlight=False, soft_wrap=True)
    lines = side.output.rstrip().splitlines()[-_TAIL:]
    if lines:
        err.print(f"--- the end of {side.name}'s output ---", highlight=False)
        err.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)  # tracebacks unwrapped


def _collided(side: Side) -> str:
    rank, pids = next(iter(side.collisions.items()))
    return (f"{len(pids)} of its processes recorded steps as rank {rank} at the same time (pids "
            f"{', '.join(map(str, pids))}): "
            "verify tells processes apart by their torch.distributed rank, so processes that train without "
            "init_process_group cannot be compared step by step")


def cannot_run(err: Console, side: Side, steps: int | None, timeout: float) -> int:
    """The first side failed: nothing to compare against."""
    if side.collisions:
        reason = _collided(side)
    elif side.returncode == 0:
        reason = "it made no optimizer step (verify records optimizer.step() and what backward() is called on)"
    else:
        reason = f"it {_ended(side, timeout)} after {_made(side)}"
    hint = "check that the script runs here with these arguments (after `--`)"
    text = side.output
    if side.target is None and any(word in text for word in ("CUDA", "cuda", "NVIDIA", "accelerator device")):
        hint = ("the original needs CUDA, which this machine lacks: compare two migrations instead, e.g. "
                "`--compare runtime,torch_xla`")
    elif "No such file or directory" in text:
        hint = ("the sides see a copy of the project named on the workspace line; a file outside it is not there: "
                "name a folder that holds it with --root")
    elif "No module named" in text:
        hint = f"install the missing module for {side.python}, or name another interpreter with --python"
    elif side.returncode is None and steps is None:
        hint = "shorten the run with the script's own arguments (after `--`), or compare its first steps (--steps N)"
    error(err, f"{side.name} cannot run: {reason}; {hint}.")
    _tail(err, side)
    return CANNOT_RUN


def failed(out: Console, err: Console, first: Side, second: Side, timeout: float) -> int:
    """The second side failed where the first did not."""
    if second.collisions:
        how = f"cannot be compared: {_collided(second)}"
    elif second.returncode == 0:
        how = "made no optimizer step"
    else:
        how = f"{_ended(second, timeout)} after {_made(second)}"
    _tail(err, second)
    out.print(f"[bold red]diverge: {second.name} {how}, where {first.name} made {_made(first)} and exited "
              f"with status 0[/]", highlight=False, soft_wrap=True)
    return DIVERGE


def non_finite(out: Console, first: Side, second: Side) -> int:
    where = {side.name: not_finite(side) for side in (first, second)}
    step, rank, what = min(value for value in where.values() if value)
    names = [name for name, value in where.items() if value and value[0] == step]
    whose = " and ".join(names)
    on = f" on rank {rank}" if len(first.records) > 1 else ""
    verb = "are" if what == "parameters" or len(names) > 1 else "is"
    out.print(f"[bold red]diverge: the {what} of {whose} {verb} not finite (NaN or inf) at step {step}{on}[/]",
              highlight=False, soft_wrap=True)
    return DIVERGE


def different_runs(out: Console, first: Side, second: Side) -> int:
    if first.records.keys() != second.records.keys():
        text = (f"{first.name} recorded ranks {_ranks(first)}, {second.name} ranks {_ranks(second)}")
    else:
        text = f"{first.name} made {_made(first)}, {second.name} {_made(second)} (both exited with status 0)"
    out.print(f"[bold red]diverge: {text}[/]", highlight=False, soft_wrap=True)
    return DIVERGE


def _ranks(side: Side) -> str:
    return ", ".join(map(str, side.records)) or "none"


def _noise(floors: list[Side], failures: list[Side], rtol: float | None) -> str:
    if floors:
        reruns = "a rerun" if len(floors) == 1 else f"{len(floors)} reruns"
        text = f"{FLOOR_MARGIN}x the drift of {reruns} nudged by {NUDGE_SIZE:.0e}, at least {ROUNDING:.2%}"
    else:
        text = f"{ROUNDING:.2%}: {failures[0].name}, the rerun that measures the noise, failed (see --keep)"
    return text + (f", at most --rtol {rtol:g}" if rtol is not None else "")


def conclude(out: Console, err: Console, first: Side, second: Side, comparison: Comparison, floors: list[Side],
            failures: list[Side], rtol: float | None, steps: int | None, name: Callable[[str], str] = str) -> int:
    """The verdict; ``name`` gives the user's name of a line a side ran (``path:line``, for its
    profile)."""
    out.print(_table(first, second, comparison), soft_wrap=True)
    problems = []
    for side in (first, second):
        needs = all_targets()[side.target].verify if side.target is not None else None
        if needs is not None and needs.metrics:
            summary, problem = check_graphs(side, needs.device, name)
            out.print(summary, highlight=False, soft_wrap=True)
            problems += [problem] if problem else []
    noise = _noise(floors, failures, rtol)
    if comparison.over is not None:
        step, rank, metric, found, allowed = comparison.over
        on = f" on rank {rank}" if len(first.records) > 1 else ""
        what = "loss" if metric == "loss" else "parameter checksum"
        message = (f"diverge: the {what} differs by {found:.3%} at step {step}{on}, beyond its tolerance "
                   f"{allowed:.3%} ({noise})")
    elif problems:
        message = "diverge: " + "; ".join(problems)
    else:
        found, step, allowed = comparison.largest
        scope = (f"stopped after {steps} steps as asked (--steps): the rest of the script was not run"
                 if first.stopped or second.stopped else "both ran to the script's end")
        message = (f"match: {_made(first)} within their tolerances ({noise}); largest deviation {found:.3%} "
                   f"(step {step}, tolerance {allowed:.3%}); {scope}")
        if comparison.chaotic_from is not None:
            message += (f"; from step {comparison.chaotic_from} a rerun nudged by {NUDGE_SIZE:.0e} drifts over "
                        f"{CHAOTIC:.0%}: the training is chaotic there, and those steps tell little")
    code = DIVERGE if message.startswith("diverge") else MATCH
    colour = "green" if code == MATCH else "red"
    out.print(f"[bold {colour}]{message}[/]", highlight=False, soft_wrap=True)
    return code


def _table(first: Side, second: Side, comparison: Comparison) -> Table:
    table = Table(title=f"rank {min(first.records)}" if len(first.records) > 1 else None)
    columns = ("step", f"{first.name} loss", f"{second.name} loss", *(
        f"{metric} {kind}" for metric in METRICS for kind in ("dev", "tol")))
    for column in columns:
        table.add_column(column, justify="right")
    for row in comparison.rows:
        cells = [f"{value:.3%}" for pair in zip(row.deviations, row.tolerances) for value in pair]
        table.add_row(str(row.step), _number(row.first), _number(row.second), *cells)
    return table


def _number(value) -> str:
    return "-" if value is None else f"{value:.6g}"


def check_graphs(side: Side, device: str, name: Callable[[str], str] = str) -> tuple[str, str | None]:
    """The profile of a side whose target counts its graphs (``[verify.executions]``), rank 0's,
    and why it fails although its numbers may match (``graphs.problem``)."""
    found = graphs.profile(side.records[min(side.records)], name)
    return graphs.describe(side.name, device, found), graphs.problem(side.name, device, found)


class Progress:
    """Which side runs and how many of its steps are recorded: a live line on a terminal, a line
    per side when it ends."""

    def __init__(self, console: Console, steps: int | None):
        self.console = console
        self.steps = steps
        self.status = None

    def _text(self, side: Side, records: dict[int, list[dict]]) -> str:
        made = min((len(steps) for steps in records.values()), default=0)
        return f"{side.name}: {made}/{self.steps} steps" if self.steps else f"{side.name}: {made} steps"

    def running(self, side: Side, folder: Path) -> None:
        if not self.console.is_terminal:
            return
        text = self._text(side, read_records(folder)[0])
        if self.status is None:
            self.status = self.console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def finished(self, side: Side) -> None:
        self.done()
        self.console.print(self._text(side, side.records), highlight=False)

    def done(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
