"""What ``accrewrite verify`` prints: progress, the step table, the verdict, and for a side that
failed, how it ended and the end of its output. Each function that ends a verify returns its
``Ending``: the exit code and the verdict in words."""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

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
VERDICTS = {MATCH: "match", DIVERGE: "diverge", CANNOT_RUN: "cannot run"}
_TAIL = 25  # lines of a failed side's output to show
_READ_EVERY = 1.0  # seconds between two reads of a running side's records


@dataclass
class Ending:
    """How a verify ended: its exit code and verdict in words; where it got that far, every side
    that ran (in order), the comparison of the two, and the user's name of a line a side ran."""

    code: int
    words: str
    comparison: Comparison | None = None
    sides: list[Side] = field(default_factory=list)
    name: Callable[[str], str] = str

    @property
    def verdict(self) -> str:
        return VERDICTS.get(self.code, "stopped")


def error(err: Console, message: str) -> Ending:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return Ending(CANNOT_RUN, f"error: {message}")


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


def cannot_run(err: Console, side: Side, steps: int | None, timeout: float) -> Ending:
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
    ending = error(err, f"{side.name} cannot run: {reason}; {hint}.")
    _tail(err, side)
    return ending


def failed(out: Console, err: Console, first: Side, second: Side, timeout: float) -> Ending:
    """The second side failed where the first did not."""
    if second.collisions:
        how = f"cannot be compared: {_collided(second)}"
    elif second.returncode == 0:
        how = "made no optimizer step"
    else:
        how = f"{_ended(second, timeout)} after {_made(second)}"
    _tail(err, second)
    return _diverge(out, f"diverge: {second.name} {how}, where {first.name} made {_made(first)} and exited "
                         f"with status 0")


def _diverge(out: Console, words: str, comparison: Comparison | None = None) -> Ending:
    out.print(f"[bold red]{words}[/]", highlight=False, soft_wrap=True)
    return Ending(DIVERGE, words, comparison)


def non_finite(out: Console, first: Side, second: Side) -> Ending:
    where = {side.name: not_finite(side) for side in (first, second)}
    step, rank, what = min(value for value in where.values() if value)
    names = [name for name, value in where.items() if value and value[0] == step]
    whose = " and ".join(names)
    on = f" on rank {rank}" if len(first.records) > 1 else ""
    verb = "are" if what == "parameters" or len(names) > 1 else "is"
    return _diverge(out, f"diverge: the {what} of {whose} {verb} not finite (NaN or inf) at step {step}{on}")


def different_runs(out: Console, first: Side, second: Side) -> Ending:
    if first.records.keys() != second.records.keys():
        text = (f"{first.name} recorded ranks {_ranks(first)}, {second.name} ranks {_ranks(second)}")
    else:
        text = f"{first.name} made {_made(first)}, {second.name} {_made(second)} (both exited with status 0)"
    return _diverge(out, f"diverge: {text}")


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
            failures: list[Side], rtol: float | None, steps: int | None, name: Callable[[str], str] = str) -> Ending:
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
    if message.startswith("diverge"):
        return _diverge(out, message, comparison)
    out.print(f"[bold green]{message}[/]", highlight=False, soft_wrap=True)
    return Ending(MATCH, message, comparison)


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
    """Which side runs, how far it is and how fast: a live line on a terminal (step N of M where
    --steps says M, steps per second, time elapsed), nothing on a pipe, and a line per side when
    it ends. With ``events`` (``--format json``), the same as one JSON object per line (``start``,
    ``progress``, ``end``), and the verdict last (``result``)."""

    def __init__(self, console: Console, steps: int | None, events: TextIO | None = None):
        self.console = console
        self.steps = steps
        self.events = events
        self.status = None
        self.began = 0.0  # when the side running started (time.monotonic)
        self.read = -math.inf  # when its records were last read
        self.made = 0

    def started(self, side: Side) -> None:
        self.began, self.read, self.made = time.monotonic(), -math.inf, 0
        self._emit(event="start", side=side.name, of=self.steps)

    def running(self, side: Side, folder: Path) -> None:
        now = time.monotonic()
        if not (self.console.is_terminal or self.events) or now - self.read < _READ_EVERY:
            return
        self.read = now
        records = read_records(folder)[0]
        made, rate = _made_and_rate(records)
        if self.console.is_terminal:
            self._show(self._live(side, made, rate, now - self.began))
        if made != self.made:
            self.made = made
            self._emit(event="progress", side=side.name, step=made, of=self.steps, rate=rate,
                       elapsed=round(now - self.began, 1))

    def _live(self, side: Side, made: int, rate: float | None, elapsed: float) -> str:
        text = f"{side.name}: step {made} of {self.steps}" if self.steps else f"{side.name}: step {made}"
        if rate:
            text += f", {rate:.3g} steps/s"
        text += f", {_duration(elapsed)} elapsed"
        if rate and self.steps and made < self.steps:
            text += f", about {_duration((self.steps - made) / rate)} left"
        return text

    def _show(self, text: str) -> None:
        if self.status is None:
            self.status = self.console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def finished(self, side: Side) -> None:
        self.done()
        elapsed = time.monotonic() - self.began
        made, rate = _made_and_rate(side.records)
        text = f"{side.name}: {counted(made, 'step')} in {_duration(elapsed)}"
        self.console.print(text + (f", {rate:.3g} steps/s" if rate else ""), highlight=False)
        self._emit(event="end", side=side.name, steps=made, exit=side.returncode, rate=rate,
                   elapsed=round(elapsed, 1))

    def result(self, ending: Ending) -> None:
        """The verdict, and per step of rank 0 each side's loss, deviations and tolerances."""
        comparison = ending.comparison
        rows = [{"step": row.step, "loss": [_finite(row.first), _finite(row.second)],
                 **{f"{metric}_deviation": _finite(row.deviations[m]) for m, metric in enumerate(METRICS)},
                 **{f"{metric}_tolerance": row.tolerances[m] for m, metric in enumerate(METRICS)}}
                for row in (comparison.rows if comparison else ())]
        self._emit(event="result", exit=ending.code, verdict=ending.verdict, message=ending.words,
                   sides=[side.name for side in ending.sides[:2]], steps=rows)

    def _emit(self, **event) -> None:
        if self.events is not None:
            self.events.write(json.dumps(event) + "\n")
            self.events.flush()

    def done(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def _made_and_rate(records: dict[int, list[dict]]) -> tuple[int, float | None]:
    """The steps every rank has made, and rank 0's steps per second between its first and last
    step (None before its second)."""
    made = min((len(steps) for steps in records.values()), default=0)
    steps = records[min(records)] if records else []
    span = steps[-1]["time"] - steps[0]["time"] if len(steps) > 1 else 0.0
    return made, round((len(steps) - 1) / span, 3) if span > 0 else None


def _duration(seconds: float) -> str:
    """``4.2 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _finite(value: float | None) -> float | str | None:
    """A number as JSON has it: NaN and infinities, which JSON lacks, as their names."""
    return value if value is None or math.isfinite(value) else str(value)
