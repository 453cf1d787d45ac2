"""``accrewrite verify --report PATH.html``: what verify found, as one self-contained page to look
at and to attach to a pull request.

The page holds the verdict in words; the loss curves of every side that ran (the nudged reruns
faint), the band of the first side's tolerance around its curve, and the step of the largest
deviation (or of the first beyond its tolerance) marked; each step's loss and checksum
deviations against their tolerances; the step table; and for a side whose target counts its
graphs (torch_xla's), its graph executions, compilations and host transfers per step after
warm-up. The charts are inline SVG drawn here, and the page fetches nothing: it has no external
address, and its Content-Security-Policy forbids every fetch, so it opens the same offline, from
a CI artifact or a mail.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from accrewrite.targets import all_targets
from accrewrite.verify import graphs
from accrewrite.verify.report import MATCH, Ending, check_graphs
from accrewrite.verify.sides import Side
from accrewrite.verify.verdict import METRICS, Comparison

WIDTH, HEIGHT = 720, 300
TABLE_ENDS = 10  # steps shown at each end of a long run's table, besides those over their tolerance
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40  # the plot's margins, for the axes' labels
COLOURS = ("#1f77b4", "#d62728")  # the first side, the second
FAINT = "#9a9a9a"  # the nudged reruns
BAND = "#1f77b4"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 760px; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.6em; }
.verdict { padding: .6em .8em; border-radius: 4px; font-weight: 600; }
.match { background: #e6f4ea; color: #14532d; } .diverge { background: #fdecea; color: #7f1d1d; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
td, th { padding: .15em .6em; text-align: right; border-bottom: 1px solid #ddd; }
.over { color: #b91c1c; font-weight: 600; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.legend span { display: inline-block; margin-right: 1.2em; }
.legend i { display: inline-block; width: 1.4em; height: .25em; vertical-align: middle; margin-right: .3em; }
"""
# Nothing may be fetched: no script, font, image or frame from anywhere, the page's own styles only.
POLICY = "default-src 'none'; style-src 'unsafe-inline'"


@dataclass
class Series:
    """One curve: (x, y) points, a missing or non-finite y breaking the line."""

    name: str
    points: list[tuple[int, float | None]]
    colour: str
    width: float = 2.0
    dashed: bool = False


def write(path: Path, ending: Ending, script: str) -> None:
    path.write_text(page(ending, script), encoding="utf-8")


def page(ending: Ending, script: str) -> str:
    title = f"accrewrite verify {script}"
    kind = "match" if ending.code == MATCH else "diverge"
    parts = [f'<p class="verdict {kind}">{_text(ending.words)}</p>']
    if ending.sides:
        parts.append(_losses(ending))
    if ending.comparison is not None and ending.comparison.rows:
        parts += [_deviations(ending.comparison), _table(ending)]
    parts += [_graphs(side, ending.name) for side in ending.sides[:2] if _counts_graphs(side)]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
            f"<title>{_text(title)}</title><style>{STYLE}</style></head>\n"
            f"<body><h1>{_text(title)}</h1>\n" + "\n".join(parts) + "\n</body></html>\n")


def _text(words: str) -> str:
    return html.escape(words, quote=True)


def _losses(ending: Ending) -> str:
    """Every side's loss per step of rank 0, the first side's tolerance band, the step to look at."""
    first = ending.sides[0]
    curves = [Series(side.name, _steps(side, "loss"), COLOURS[index] if index < 2 else FAINT,
                     2.0 if index < 2 else 1.0)
              for index, side in enumerate(ending.sides)]
    comparison = ending.comparison
    band = mark = None
    if comparison is not None and comparison.rows:
        band = [(row.step, row.first - margin, row.first + margin) for row in comparison.rows if _finite(row.first)
                for margin in [abs(row.first) * row.tolerances[0]]]
        mark = _mark(comparison)
    note = (f"The band is {first.name}'s loss within each step's loss tolerance." if band else "")
    # The nudged reruns drawn first, under the two sides.
    return (f"<h2>Loss per step{_rank(first)}</h2>\n" + _legend(curves, band is not None) +
            _chart(curves[2:] + curves[:2], band=band, mark=mark, label="loss") +
            (f"<p>{_text(note)}</p>" if note else ""))


def _mark(comparison: Comparison) -> tuple[int, str]:
    """The step to look at: the first beyond its tolerance, else the largest deviation."""
    if comparison.over is not None:
        step, _, metric, found, allowed = comparison.over
        return step, f"step {step}: {metric} {found:.3%} > {allowed:.3%}"
    found, step, allowed = comparison.largest
    return step, f"largest deviation: step {step}, {found:.3%} (tolerance {allowed:.3%})"


def _deviations(comparison: Comparison) -> str:
    """Each step's loss and checksum deviations against their tolerances, on a log scale."""
    rows = comparison.rows
    curves = []
    for m, (metric, colour) in enumerate(zip(METRICS, COLOURS)):
        curves += [Series(f"{metric} deviation", [(row.step, row.deviations[m]) for row in rows], colour),
                   Series(f"{metric} tolerance", [(row.step, row.tolerances[m]) for row in rows], colour, 1.0, True)]
    return ("<h2>Deviation per step, against its tolerance</h2>\n" + _legend(curves, False) +
            _chart(curves, mark=_mark(comparison), label="relative deviation", log=True) +
            "<p>A step matches where both its deviations are under their tolerances; a deviation of 0 "
            "is drawn on the chart's floor.</p>")


def _table(ending: Ending) -> str:
    first, second = ending.sides[0].name, ending.sides[1].name
    head = ["step", f"{first} loss", f"{second} loss"] + [f"{metric} {kind}" for metric in METRICS
                                                        for kind in ("dev", "tol")]
    lines = ["<h2>Steps</h2><table><tr>" + "".join(f"<th>{_text(cell)}</th>" for cell in head) + "</tr>"]
    shown = _shown(ending.comparison)
    for index, row in enumerate(ending.comparison.rows):
        if index not in shown:
            if index - 1 in shown:
                lines.append(f'<tr><td colspan="{len(head)}">…</td></tr>')
            continue
        cells = [str(row.step), _number(row.first), _number(row.second)]
        for found, allowed in zip(row.deviations, row.tolerances):
            over = ' class="over"' if not found <= allowed else ""  # NaN is over
            cells += [f"<span{over}>{found:.3%}</span>", f"{allowed:.3%}"]
        lines.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return "\n".join(lines) + "</table>"


def _shown(comparison: Comparison) -> set[int]:
    """The rows of the table: a long run's first and last steps, the marked step and every step over
    its tolerance (the charts hold the rest)."""
    rows = comparison.rows
    ends = set(range(TABLE_ENDS)) | set(range(len(rows) - TABLE_ENDS, len(rows)))
    over = {index for index, row in enumerate(rows)
            if not all(found <= allowed for found, allowed in zip(row.deviations, row.tolerances))}
    return ends | over | {_mark(comparison)[0] - 1}


def _counts_graphs(side: Side) -> bool:
    needs = all_targets()[side.target].verify if side.target is not None else None
    return needs is not None and bool(needs.metrics) and bool(side.records)


def _graphs(side: Side, name: Callable[[str], str]) -> str:
    """The side's graph executions, compilations and host transfers per step after warm-up, and its
    profile line."""
    device = all_targets()[side.target].verify.device
    found = graphs.profile(side.records[min(side.records)], name)
    summary, problem = check_graphs(side, device, name)
    curves = [Series("graph executions", list(zip(found.steps, found.executions)), COLOURS[0]),
              Series("compilations", list(zip(found.steps, found.compiles)), COLOURS[1])]
    if found.transfers is not None:
        curves.append(Series("host transfers", list(zip(found.steps, found.transfers)), FAINT, dashed=True))
    chart = _legend(curves, False) + _chart(curves, label="per step", zero=True) if found.steps else ""
    words = "".join(f"<p>{_text(line)}</p>" for line in (summary, problem) if line)
    return f"<h2>{_text(side.name)}: graphs per step after warm-up</h2>\n{chart}{words}"


def _steps(side: Side, key: str) -> list[tuple[int, float | None]]:
    records = side.records[min(side.records)] if side.records else []
    return [(number, record.get(key)) for number, record in enumerate(records, 1)]


def _rank(side: Side) -> str:
    return f" (rank {min(side.records)})" if len(side.records) > 1 else ""


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _legend(curves: list[Series], band: bool) -> str:
    keys = [f'<span><i style="background:{curve.colour}{";opacity:.5" if curve.dashed else ""}"></i>'
            f'{_text(curve.name)}</span>' for curve in curves]
    if band:
        keys.append(f'<span><i style="background:{BAND};opacity:.2;height:.8em"></i>tolerance</span>')
    return f'<p class="legend">{"".join(keys)}</p>\n'


# The charts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Axes:
    """From data to the SVG's pixels."""

    x0: float
    x1: float
    y0: float
    y1: float
    log: bool

    def x(self, value: float) -> float:
        span = self.x1 - self.x0 or 1
        return LEFT + (value - self.x0) / span * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        value, low, high = (self._scaled(v) for v in (value, self.y0, self.y1))
        return TOP + (high - value) / ((high - low) or 1) * (HEIGHT - TOP - BOTTOM)

    def _scaled(self, value: float) -> float:
        return math.log10(value) if self.log else value


def _chart(curves: list[Series], band: list[tuple[int, float, float]] | None = None,
           mark: tuple[int, str] | None = None, label: str = "", log: bool = False, zero: bool = False) -> str:
    """A line chart of ``curves`` over the steps, with an optional band and a marked step; on a log
    scale, values at or below zero sit at the chart's floor."""
    xs = [x for curve in curves for x, _ in curve.points] or [1]
    ys = [y for curve in curves for _, y in curve.points if _finite(y) and (y > 0 or not log)]
    ys += [y for _, low, high in band or () for y in (low, high)]
    axes = _axes(min(xs), max(xs), ys, log, zero)
    floor = axes.y0
    shapes = []
    if band:
        outline = [(axes.x(x), axes.y(high)) for x, _, high in band] + [
            (axes.x(x), axes.y(low)) for x, low, _ in reversed(band)]
        shapes.append(f'<path class="band" d="{_path(outline)}Z" fill="{BAND}" fill-opacity="0.18" stroke="none"/>')
    for curve in curves:
        segments = _segments((x, y if not log or not _finite(y) else max(y, floor)) for x, y in curve.points)
        drawn = " ".join(_path([(axes.x(x), axes.y(y)) for x, y in segment]) for segment in segments)
        if drawn:
            dash = ' stroke-dasharray="6 4"' if curve.dashed else ""
            shapes.append(f'<path class="curve" data-series="{_text(curve.name)}" d="{drawn}" fill="none" '
                          f'stroke="{curve.colour}" stroke-width="{curve.width}"{dash} stroke-linejoin="round" '
                          'stroke-linecap="round"/>')
    if mark is not None:
        step, words = mark
        x = axes.x(step)
        anchor = "end" if x > WIDTH / 2 else "start"
        shapes.append(f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" '
                      f'stroke="#555" stroke-dasharray="4 3"/>'
                      f'<text x="{x + (-4 if anchor == "end" else 4):.1f}" y="{TOP + 12}" '
                      f'text-anchor="{anchor}">{_text(words)}</text>')
    return (f'<svg width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_text(label)}">'
            + _frame(axes, label) + "".join(shapes) + "</svg>\n")


def _axes(x0: int, x1: int, ys: list[float], log: bool, zero: bool) -> _Axes:
    if not ys:
        ys = [1.0]
    low, high = min(ys), max(ys)
    if zero:
        low = min(low, 0.0)
    if log:
        low, high = 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high))
        return _Axes(x0, x1, low, high if high > low else low * 10, log)
    pad = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
    return _Axes(x0, x1, low if zero and low == 0 else low - pad, high + pad, log)


def _frame(axes: _Axes, label: str) -> str:
    """The axes, their ticks and labels."""
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" fill="none" stroke="#ccc"/>']
    for step in _ticks(axes.x0, axes.x1, integers=True):
        x = axes.x(step)
        parts.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{step:g}</text>')
    for value in (_decades(axes.y0, axes.y1) if axes.log else _ticks(axes.y0, axes.y1)):
        y = axes.y(value)
        parts.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_tick(value, axes.log)}</text>')
    parts.append(f'<text x="{(LEFT + right) / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">step</text>'
                 f'<text x="12" y="{(TOP + bottom) / 2:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {(TOP + bottom) / 2:.1f})">{_text(label)}</text>')
    return "".join(parts)


def _ticks(low: float, high: float, integers: bool = False) -> list[float]:
    """About five round values between ``low`` and ``high``."""
    span = high - low
    if span <= 0:
        return [low]
    raw = span / 5
    unit = 10 ** math.floor(math.log10(raw))
    step = next(unit * factor for factor in (1, 2, 5, 10) if unit * factor >= raw)
    if integers:
        step = max(1.0, round(step))
    first = math.ceil(low / step) * step
    return [first + index * step for index in range(int((high - first) / step) + 1)]


def _decades(low: float, high: float) -> list[float]:
    return [10.0 ** power for power in range(round(math.log10(low)), round(math.log10(high)) + 1)]


def _tick(value: float, log: bool) -> str:
    return f"{value:.0e}" if log else f"{value:.4g}"


def _segments(points: Iterable[tuple[int, float | None]]) -> list[list[tuple[int, float]]]:
    """The runs of finite points: a line breaks where a value is missing or not finite."""
    segments: list[list[tuple[int, float]]] = [[]]
    for x, y in points:
        if _finite(y):
            segments[-1].append((x, y))
        elif segments[-1]:
            segments.append([])
    return [segment for segment in segments if segment]


def _path(points: list[tuple[float, float]]) -> str:
    """An SVG path through ``points``; one point alone is drawn as a dot (a round cap)."""
    points = points * 2 if len(points) == 1 else points
    return "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points) if points else ""
