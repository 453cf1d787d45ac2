"""Codemod speed against its floor and against a base, measured side by side in one run.

    python benchmarks/codemod_speed.py [DIR] [--base CHECKOUT] [--repeat 3]

Without DIR it measures the bundled corpus: the plain example scripts (``examples/*/train.py``)
and the golden fixture inputs (``tests/rules/fixtures/*.in.py``), each copied 12 times into a
temporary directory.

The floor is what any libcst codemod must pay: ``libcst.parse_module`` + ``.code`` of the same
files, in one process. "ours" is ``accrewrite migrate DIR --diff`` with ``--jobs 1`` and
``--jobs 2``, each run a fresh process importing this checkout; with ``--base CHECKOUT`` (a
source tree, e.g. ``git archive REV | tar -x -C CHECKOUT``) the same runs import that tree, in
turn with ours round by round, so that a drift of the machine's speed hits both. Each figure is
the best of ``--repeat`` rounds (the machine may be shared: the best run is the least
disturbed one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

from accrewrite.discovery import discover

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diagnostics_recall import package_farm  # noqa: E402 - a sibling script, also when imported by a test

_ROOT = Path(__file__).resolve().parent.parent
_COPIES = 12
_JOBS = (1, 2)


def bundled_corpus(directory: Path) -> None:
    """The example scripts and fixture inputs, each copied ``_COPIES`` times into ``directory``."""
    sources = sorted(_ROOT.glob("examples/*/train.py")) + sorted(_ROOT.glob("tests/rules/fixtures/*.in.py"))
    for copy in range(_COPIES):
        for index, source in enumerate(sources):
            shutil.copyfile(source, directory / f"s{copy}_{index}.py")


def floor(paths: list[Path]) -> float:
    start = time.perf_counter()
    for path in paths:
        cst.parse_module(path.read_bytes()).code
    return time.perf_counter() - start


def migrate(farm: Path, directory: str, jobs: int) -> float:
    """Seconds of ``accrewrite migrate --diff`` in a fresh process that imports accrewrite from
    ``farm`` (run from the corpus, so that no other checkout is on the path first)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "accrewrite", "migrate", ".", "--diff", "--jobs", str(jobs)],
                          cwd=directory, env={**os.environ, "PYTHONPATH": str(farm)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"accrewrite migrate ({farm}) exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def measure(directory: str, repeat: int, trees: dict[str, Path]) -> dict:
    """The best seconds of each (name, jobs) over ``repeat`` rounds, and of the floor."""
    paths = discover([directory]).files
    best = {"floor": float("inf")}
    with tempfile.TemporaryDirectory() as scratch:
        farms = {}
        for name, tree in trees.items():
            (Path(scratch) / name).mkdir()
            farms[name] = package_farm(tree, Path(scratch) / name)
        for _ in range(repeat):
            best["floor"] = min(best["floor"], floor(paths))
            for jobs in _JOBS:
                for name, farm in farms.items():
                    best[name, jobs] = min(best.get((name, jobs), float("inf")), migrate(farm, directory, jobs))
    best["files"] = len(paths)
    best["lines"] = sum(path.read_bytes().count(b"\n") for path in paths)
    return best


def print_table(best: dict, names: list[str]) -> None:
    print(f"files {best['files']}  lines {best['lines']}")
    print(f"floor (parse + codegen, 1 process)   {best['floor']:.3f} s")
    for jobs in _JOBS:
        for name in names:
            seconds = best[name, jobs]
            line = f"{name:<5} --jobs {jobs}                      {seconds:.3f} s  /floor {seconds / best['floor']:.2f}x"
            if name != "ours":
                line += f"  ours/{name} {best['ours', jobs] / seconds:.2f}x"
            print(line)
    for name in names:
        print(f"{name:<5} --jobs 2 speed-up over --jobs 1  {best[name, 1] / best[name, 2]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", help="a tree of training scripts (default: the bundled corpus)")
    parser.add_argument("--base", metavar="CHECKOUT", help="another source tree of accrewrite, measured in turn")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    trees = {"ours": _ROOT, **({"base": Path(args.base).resolve()} if args.base else {})}
    with tempfile.TemporaryDirectory() as corpus:
        if args.directory is None:
            bundled_corpus(Path(corpus))
        directory = os.path.abspath(args.directory or corpus)
        print_table(measure(directory, args.repeat, trees), list(trees))


if __name__ == "__main__":
    main()
