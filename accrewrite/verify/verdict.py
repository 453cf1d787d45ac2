"""Comparing two sides of ``accrewrite verify``, step by step and rank by rank, against the noise
that the training itself shows.

The noise is measured, not assumed: the first side is rerun with its parameters nudged by one
part in a million (``probe.NUDGE_SIZE``) before their first use and after every step, and how
far each such rerun drifts from it, step by step, is what rounding differences alone do to this
training (ReLUs that flip, BatchNorm over small batches and chaotic losses magnify them). A step matches when
its deviation is within ``FLOOR_MARGIN`` times the largest drift of the reruns at that step, and
never less than ``ROUNDING``; ``--rtol`` caps that tolerance. A non-finite loss or checksum is
never a match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from accrewrite.verify.sides import Side

# Another backend's kernels differ in every operation, a nudge once per parameter and step.
FLOOR_MARGIN = 10
# float32 rounding: a deviation this small is a match however calm the training is.
ROUNDING = 1e-4
# A drift this large says the training is chaotic there: its steps tell little either way.
CHAOTIC = 0.1
METRICS = ("loss", "checksum")


@dataclass
class Row:
    """One step of rank 0: each side's loss, and per metric (loss, checksum) the deviation and
    the tolerance there."""

    step: int
    first: float | None
    second: float | None
    deviations: tuple[float, float]
    tolerances: tuple[float, float]


@dataclass
class Comparison:
    rows: list[Row] = field(default_factory=list)
    over: tuple | None = None  # (step, rank, metric, deviation, tolerance) of the first step beyond
    largest: tuple = (0.0, 0, 0.0)  # (deviation, step, tolerance) where a deviation came closest to its tolerance
    chaotic_from: int | None = None  # the first step where a nudged rerun drifts more than CHAOTIC


def deviation(a: float | None, b: float | None) -> float:
    """Relative difference, against the larger magnitude (0 when both are 0; NaN if either is not
    finite, which no tolerance admits)."""
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def _checksum_deviation(a: dict, b: dict) -> float:
    """How far two sides' parameter changes differ, relative to the changes themselves: a
    projection on random signs varies like the change's norm, and can pass near zero."""
    values = (a["checksum"], b["checksum"], a.get("change", 0.0), b.get("change", 0.0))
    if not all(math.isfinite(value) for value in values):
        return math.nan
    scale = max(values[2], values[3])
    difference = abs(values[0] - values[1])
    return difference / scale if scale else (0.0 if difference == 0 else math.inf)


def _deviations(first: Side, second: Side) -> dict[int, list[tuple[float, float]]]:
    """Per rank, per step both made: (loss deviation, checksum deviation)."""
    return {rank: [(deviation(a["loss"], b["loss"]), _checksum_deviation(a, b)) for a, b in zip(steps, second.records[rank])]
            for rank, steps in first.records.items() if rank in second.records}


def not_finite(side: Side) -> tuple[int, int, str] | None:
    """The first (step, rank, what) where the side's loss or parameters are NaN or infinite."""
    found = [(number, rank, what) for rank, steps in side.records.items() for number, record in enumerate(steps, 1)
             for what, value in (("loss", record["loss"]), ("parameters", record["checksum"]))
             if value is not None and not math.isfinite(value)]
    return min(found, default=None)


def tolerance(drift: float | None, rtol: float | None) -> float:
    allowed = ROUNDING if drift is None else max(ROUNDING, FLOOR_MARGIN * drift)
    return allowed if rtol is None else min(rtol, allowed)


def compare(first: Side, second: Side, floors: tuple[Side, ...], rtol: float | None) -> Comparison:
    """Every step both sides made, rank by rank, within its tolerance (``tolerance``)."""
    found = _deviations(first, second)
    drifts = [_deviations(first, floor) for floor in floors]
    rows, over, largest, chaotic = [], None, (-1.0, 0, 0.0, 0.0), []
    for rank, steps in found.items():
        for index, deviations in enumerate(steps):
            measured = [[drift[rank][index][m] for drift in drifts if index < len(drift.get(rank, ()))]
                        for m in range(len(METRICS))]
            tolerances = tuple(tolerance(max(d) if d else None, rtol) for d in measured)
            if any(drift > CHAOTIC for d in measured for drift in d):
                chaotic.append(index + 1)
            if rank == min(found):
                rows.append(Row(index + 1, first.records[rank][index]["loss"], second.records[rank][index]["loss"],
                                deviations, tolerances))
            beyond = [m for m in range(len(METRICS)) if not deviations[m] <= tolerances[m]]  # NaN is beyond
            if beyond and over is None:
                m = beyond[0]
                over = (index + 1, rank, METRICS[m], deviations[m], tolerances[m])
            for m in range(len(METRICS)):
                largest = max(largest, (deviations[m] / tolerances[m], index + 1, deviations[m], tolerances[m]))
    return Comparison(rows, over, (largest[2], largest[1], largest[3]), min(chaotic, default=None))
