"""Recall and precision of the diagnostics that name a host sync or a changing shape, against
hand labels of real training scripts.

    python benchmarks/diagnostics_recall.py DIR LABELS [--before CHECKOUT] [--json OUT]

DIR holds fetched public repositories, one folder per repository (``owner+name``, as for
``real_scripts.py``). LABELS lists the codes it covers (``codes``) and files of DIR whose training loops and step
functions were read by hand (``benchmarks/labels/host_sync.json``: plain PyTorch scripts;
``benchmarks/labels/accelerate.json``: scripts that Accelerate trains, which the codemod leaves
as they are but still diagnoses), and in them:

* every host sync that runs every step or every N steps: ``.item()``, ``.cpu()``, ``.numpy()``,
  ``.tolist()``, ``float()``/``int()``/``bool()`` of a tensor, printing, logging or formatting a
  tensor, handing one to a metric that reads it (ACC101), and Python control flow on a tensor's
  value (ACC102);
* every shape that changes from batch to batch (ACC103): padding to each batch's longest sample
  (wherever the file sets it up), data-sized results in the loops.

A label is a line (its number and text: the text finds it again after small shifts), a code,
and yes or no; a "no" says why the line is not one (a Python float, a CPU tensor, padding to a
fixed length) and guards precision.

Each labelled file is migrated to the runtime target, and its findings of those codes are
matched to labels by statement, a finding per labelled occurrence (a statement may hold several):

* found: a labelled occurrence with a finding; missed: one without;
* false alarm: a finding beyond the statement's labelled occurrences (on a "no" line, or an
  unlabelled one: everything of the labelled loops is labelled, so anything else is not one);
* moved: a labelled sync in a statement that ACC009 moved into a step closure. It no longer
  waits in the step, so it is neither found nor missed;
* not counted: ACC101's findings on ``torch.cuda.synchronize()``, a wait for the device rather
  than a read of a value.

ACC101 is measured twice: as migrated, and with ACC009 off, where every labelled sync stays in
the step and each must be reported (the analysis behind ACC101 judged on all of them).

What the labels cover: syncs written in the loop's body (nested blocks and loops included, also
those that run every N steps or once an epoch in an epoch loop around the step loop), and calls
there of a helper of the same file that returns its argument read on the host
(``to_python_float(t)``). The bodies of other functions the loop calls (an evaluation pass, a
helper that logs) are not read, nor syncs inside helpers of another file
(``metric_logger.update(loss=t)`` converting in utils.py): a per-file analysis cannot see them.
Scripts that train on the CPU only (nothing waits for a device there) are not labelled.

``--before CHECKOUT`` measures a source tree of accrewrite too (``git archive REV | tar -x -C
CHECKOUT``), imported in a subprocess, and prints both side by side.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

CODES = ("ACC101", "ACC102", "ACC103")
# ACC009's fix message for a statement it moved into a step closure.
MOVED = "moved into a step closure"


def relocate(lines: list[str], line: int, text: str) -> int | None:
    """The line holding ``text`` nearest to ``line`` (labels survive small shifts)."""
    found = [i + 1 for i, current in enumerate(lines) if current.strip() == text]
    return min(found, key=lambda i: abs(i - line)) if found else None


def statement_starts(source: str) -> dict[int, int]:
    """Each line's innermost simple statement's first line (a compound statement's header lines
    map to the header)."""
    starts: dict[int, int] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return starts
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        end = node.body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno
        for line in range(node.lineno, (end or node.lineno) + 1):
            if line not in starts or starts[line] < node.lineno:
                starts[line] = node.lineno
    return starts


def measure_file(directory: Path, entry: dict, ignore: tuple[str, ...]) -> dict:
    """One labelled file's matches, per code, migrated with the rules of ``ignore`` off."""
    from accrewrite.engine import Options, migrate_source

    folder = entry["repository"].replace("/", "+", 1)
    path = directory / folder / entry["path"]
    shown = f"{folder}/{entry['path']}"
    source = path.read_bytes()
    lines = source.decode("utf-8", errors="replace").splitlines()
    result = migrate_source(source, str(path), Options(target="runtime", ignore=ignore))
    if result.error is not None:
        return {"error": f"{shown}: {result.error.reason}"}
    starts = statement_starts(source.decode("utf-8", errors="replace"))
    moved = {fix.line for fix in result.fixes if fix.code == "ACC009" and MOVED in fix.message}
    # Matched by statement: a call over several lines is reported on one of them and labelled on
    # another (the tensor a multi-line `accelerator.log({...})` is given).
    findings = Counter((d.code, starts.get(d.line, d.line)) for d in result.diagnostics if d.code in CODES)

    out = {code: {"found": [], "missed": [], "false": [], "moved": [], "waits": []} for code in CODES}
    syncs, negatives, stale = Counter(), {}, []
    for label in entry["labels"]:
        line = relocate(lines, label["line"], label["text"])
        if line is None:
            stale.append(f"{shown}:{label['line']}: label text not found: {label['text']}")
            continue
        where = f"{shown}:{line}: {label['text']}"
        code, line = label["code"], starts.get(line, line)
        if not label["sync"]:
            negatives[code, line] = label.get("reason", "")
        elif code == "ACC101" and line in moved:
            out[code]["moved"].append(where)
        else:
            syncs[code, line] += 1
    for code, line in sorted(set(syncs) | set(findings)):
        labelled, reported = syncs[code, line], findings[code, line]
        text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        where = f"{shown}:{line}: {text}"
        if code == "ACC101" and "synchronize(" in text and not labelled:
            out[code]["waits"] += [where] * reported
            continue
        hits = min(labelled, reported)
        out[code]["found"] += [where] * hits
        out[code]["missed"] += [where] * (labelled - hits)
        reason = negatives.get((code, line)) or "not labelled a sync"
        out[code]["false"] += [f"{where}  ({reason})"] * (reported - hits)
    return {"codes": out, "stale": stale}


# The columns: a code, measured on the migrated file or with ACC009 off (every labelled sync
# then stays in the step, and each must be reported).
COLUMNS = {"ACC101": ("ACC101", ()), "ACC101, ACC009 off": ("ACC101", ("ACC009",)), "ACC102": ("ACC102", ()),
           "ACC103": ("ACC103", ())}


def measure(directory: Path, labels: dict) -> dict:
    """The counts of the columns whose code the labels cover (their ``codes``)."""
    columns = {column: spec for column, spec in COLUMNS.items() if spec[0] in labels["codes"]}
    totals = {column: defaultdict(list) for column in columns}
    errors, stale = [], []
    for ignore in sorted({ignore for _, ignore in columns.values()}):
        for entry in labels["files"]:
            report = measure_file(directory, entry, ignore)
            if "error" in report:
                errors.append(report["error"])
                continue
            if not ignore:
                stale += report["stale"]
            for column, (code, ignored) in columns.items():
                for kind, items in report["codes"][code].items() if ignored == ignore else ():
                    totals[column][kind] += items
    counts = {}
    for column in columns:
        t = totals[column]
        found, missed, false = len(t["found"]), len(t["missed"]), len(t["false"])
        counts[column] = {
            "labelled": found + missed + len(t["moved"]), "moved": len(t["moved"]), "found": found,
            "missed": missed, "false_alarms": false, "not_counted": len(t["waits"]),
            "recall": found / (found + missed) if found + missed else None,
            "precision": found / (found + false) if found + false else None,
            "misses": t["missed"], "false_alarm_lines": t["false"],
        }
    negatives = sum(1 for entry in labels["files"] for label in entry["labels"] if not label["sync"])
    syncs = sum(1 for entry in labels["files"] for label in entry["labels"] if label["sync"])
    return {"files": len(labels["files"]), "syncs": syncs, "negatives": negatives, "codes": counts,
            "errors": errors, "stale": stale}


def package_farm(checkout: Path, into: Path) -> Path:
    """A directory where ``import accrewrite`` finds ``checkout``'s source, laid out as installed
    (rules/, runtime/ and kernels/ are subpackages of accrewrite)."""
    package = into / "accrewrite"
    package.mkdir()
    for child in (checkout / "accrewrite").iterdir():
        (package / child.name).symlink_to(child.resolve())
    for sub in ("rules", "runtime", "kernels"):
        if (checkout / sub).is_dir():
            (package / sub).symlink_to((checkout / sub).resolve())
    return into


def measure_checkout(checkout: Path, directory: Path, labels_path: Path) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        farm = package_farm(checkout, Path(scratch))
        out = Path(scratch) / "counts.json"
        env = {**os.environ, "PYTHONPATH": str(farm)}
        command = [sys.executable, str(Path(__file__).resolve()), str(directory), str(labels_path), "--json", str(out)]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(columns: dict[str, dict]) -> None:
    first = next(iter(columns.values()))
    print(f"labelled files {first['files']}: {first['syncs']} occurrences, {first['negatives']} negatives")
    rows = [("labelled", "labelled"), ("moved by ACC009", "moved"), ("found", "found"), ("missed", "missed"),
            ("false alarms", "false_alarms"), ("not counted (device waits)", "not_counted"),
            ("recall", "recall"), ("precision", "precision")]
    names = list(columns)
    shown = list(first["codes"])
    width = max(len(column) for column in shown) + 2
    print(f"{'':<28}" + "".join(f"{column:>{width}}" for column in shown for _ in names))
    if len(names) > 1:
        print(f"{'':<28}" + "".join(f"{name:>{width}}" for _ in shown for name in names))
    for title, key in rows:
        cells = []
        for column in shown:
            for name in names:
                value = columns[name]["codes"][column][key]
                cells.append(_ratio(value) if key in ("recall", "precision") else str(value))
        print(f"{title:<28}" + "".join(f"{cell:>{width}}" for cell in cells))


def print_lists(name: str, result: dict) -> None:
    for column in result["codes"]:
        counts = result["codes"][column]
        for title, key in (("missed", "misses"), ("false alarms", "false_alarm_lines")):
            if counts[key]:
                print(f"\n{column} {title} ({name}):")
                for line in counts[key]:
                    print(f"  {line}")
    for line in result["errors"] + result["stale"]:
        print(f"  ! {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", metavar="DIR", help="fetched repositories, owner+name folders")
    parser.add_argument("labels", metavar="LABELS", help="the labels (JSON)")
    parser.add_argument("--before", metavar="CHECKOUT", help="also measure this source tree of accrewrite")
    parser.add_argument("--json", metavar="OUT", help="write the counts as JSON")
    args = parser.parse_args(argv)
    directory, labels_path = Path(args.directory).resolve(), Path(args.labels).resolve()
    labels = json.loads(labels_path.read_text())
    columns = {}
    if args.before:
        columns["before"] = measure_checkout(Path(args.before), directory, labels_path)
    columns["now" if args.before else "result"] = result = measure(directory, labels)
    print_table(columns)
    if args.before:
        print_lists("before", columns["before"])
    print_lists("now" if args.before else "result", result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
