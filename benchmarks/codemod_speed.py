"""Codemod speed against its floor, measured side by side in one run.

    python benchmarks/codemod_speed.py [DIR] [--repeat 3]

Without DIR it measures the bundled corpus: the plain example scripts (``examples/*/train.py``)
and the golden fixture inputs (``tests/rules/fixtures/*.in.py``), each copied 12 times into a
temporary directory (168 files, about 23,000 lines of training scripts).

The floor is what any libcst codemod must pay: ``libcst.parse_module`` + ``.code`` of the same
files, in one process. "ours" is ``accrewrite migrate --diff`` over DIR (in-process, output
discarded) with ``--jobs 1`` and ``--jobs 2``. Each figure is the best of ``--repeat`` runs
(the machine may be shared: the best run is the least disturbed one).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import tempfile
import time
from pathlib import Path

import libcst as cst

from accrewrite.cli import main as accrewrite
from accrewrite.discovery import discover


_ROOT = Path(__file__).resolve().parent.parent
_COPIES = 12


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


def ours(directory: str, jobs: int) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = accrewrite(["migrate", directory, "--diff", "--jobs", str(jobs)])
    elapsed = time.perf_counter() - start
    if code not in (0, 1):
        raise SystemExit(f"accrewrite migrate exited {code}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", help="a tree of training scripts (default: the bundled corpus)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as corpus:
        if args.directory is None:
            bundled_corpus(Path(corpus))
        measure(args.directory or corpus, args.repeat)


def measure(directory: str, repeat: int) -> None:
    paths = discover([directory]).files
    lines = sum(path.read_bytes().count(b"\n") for path in paths)
    best = {"floor": float("inf"), 1: float("inf"), 2: float("inf")}
    for _ in range(repeat):
        best["floor"] = min(best["floor"], floor(paths))
        for jobs in (1, 2):
            best[jobs] = min(best[jobs], ours(directory, jobs))
    print(f"files {len(paths)}  lines {lines}")
    print(f"floor (parse + codegen, 1 process)  {best['floor']:.3f} s")
    for jobs in (1, 2):
        print(f"accrewrite --jobs {jobs:<2}                {best[jobs]:.3f} s  ours/floor {best[jobs] / best['floor']:.2f}x")
    print(f"--jobs 2 speed-up over --jobs 1      {best[1] / best[2]:.2f}x")


if __name__ == "__main__":
    main()
