"""The codemod as a user runs it, against its floor and against a base, side by side in one run.

    python benchmarks/codemod_cli_speed.py DIR... [--base CHECKOUT] [--repeat 5]

Every figure is a fresh process's wall time, start-up included:

- the floor: ``python -c`` that imports libcst, then parses and prints (``.code``) every file
  that ``accrewrite migrate`` finds under DIR (a notebook's code cells as one script), which is
  what any libcst codemod started from the command line pays;
- ``accrewrite migrate DIR --diff --format json`` with ``--jobs 1`` and ``--jobs 2``;
- the one-file cold start: ``accrewrite migrate FILE --diff`` on an example script;
- the machine's own ceiling for ``--jobs 2``: a fixed count of pure-Python work done by one
  process, and split between two at once (on a machine shared with others, or whose two CPUs
  are one core's two threads, two processes do not run twice as fast as one).

With ``--base CHECKOUT`` (a source tree, e.g. ``git archive REV | tar -x -C CHECKOUT``) each run
of ours is followed by the same run importing that tree, so that a drift of the machine's speed
hits both. Each tree runs once untimed before, which caches its bytecode as an install does.
Each figure is the median of ``--repeat`` rounds (the machine may be shared); the ratios are
of those medians. The profile behind a figure is ``python -m cProfile -m accrewrite migrate ...``
(one process: with ``--jobs 2`` the parent's own work, the workers' shows as its wait).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from codemod_speed import _env  # noqa: E402 - sibling scripts, also when imported by a test
from diagnostics_recall import package_farm  # noqa: E402

_ROOT = Path(__file__).resolve().parent.parent
_LONE = _ROOT / "examples" / "ddp_gpt" / "train.py"  # the one-file cold start's script

# The floor's process: what ``migrate`` reads of each file, parsed and printed by libcst.
_FLOOR = """
import sys
import libcst
from accrewrite.discovery import discover
from accrewrite.notebook import Notebook, is_notebook
for path in discover(sys.argv[1:]).files:
    data = path.read_bytes()
    libcst.parse_module(Notebook.read(data).script() if is_notebook(str(path)) else data).code
"""

# The ceiling's process: 30 million decrements, by as many processes at once as its argument says.
_BUSY = """
import sys
from multiprocessing import get_context
def count_down(count):
    while count:
        count -= 1
if __name__ == "__main__":
    processes = int(sys.argv[1])
    with get_context("fork").Pool(processes) as pool:
        pool.map(count_down, [30_000_000 // processes] * processes)
"""


def timed(command: list[str], env: dict[str, str], cwd: str) -> float:
    """Wall seconds of ``command`` in a fresh process; its output is thrown away."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1, 2):  # 2: a corpus may hold files that cannot be migrated
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def commands(directories: list[str]) -> dict[str, list[str]]:
    """The timed commands of one tree, by name (the floor's needs only libcst and discovery)."""
    migrate = [sys.executable, "-m", "accrewrite", "migrate", "--diff"]
    return {
        "floor": [sys.executable, "-c", _FLOOR, *directories],
        "jobs 1": [*migrate, "--format", "json", "--jobs", "1", *directories],
        "jobs 2": [*migrate, "--format", "json", "--jobs", "2", *directories],
        "one file": [*migrate, str(_LONE)],
        "busy 1": [sys.executable, "-c", _BUSY, "1"],
        "busy 2": [sys.executable, "-c", _BUSY, "2"],
    }


_MACHINE = ("floor", "busy 1", "busy 2")  # what no tree of accrewrite runs


def measure(directories: list[str], repeat: int, trees: dict[str, Path]) -> dict:
    """The median wall seconds of each (tree, command) over ``repeat`` rounds, run in turn."""
    runs: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        envs = {}
        for name, tree in trees.items():
            (Path(scratch) / name).mkdir()
            envs[name] = _env(package_farm(tree, Path(scratch) / name))
            timed(commands(directories)["one file"], envs[name], scratch)  # caches the tree's bytecode
        for _ in range(repeat):
            for what, command in commands(directories).items():
                for name, env in envs.items():
                    if name == "ours" or what not in _MACHINE:  # one floor and ceiling, whichever tree
                        runs.setdefault((name, what), []).append(timed(command, env, scratch))
    return {key: statistics.median(seconds) for key, seconds in runs.items()}


def print_table(medians: dict, names: list[str]) -> None:
    floor = medians["ours", "floor"]
    print(f"floor (libcst import, parse + print, 1 process)  {floor:.3f} s")
    for what in ("jobs 1", "jobs 2", "one file"):
        for name in names:
            seconds = medians[name, what]
            line = f"{name:<5} {what:<9} {seconds:8.3f} s"
            if what != "one file":
                line += f"  /floor {seconds / floor:.2f}x"
            if name != "ours":
                line += f"  ours/{name} {medians['ours', what] / seconds:.2f}x"
            print(line)
    for name in names:
        print(f"{name:<5} --jobs 2 speed-up over --jobs 1  {medians[name, 'jobs 1'] / medians[name, 'jobs 2']:.2f}x")
    print(f"the machine: two busy processes against one   {medians['ours', 'busy 1'] / medians['ours', 'busy 2']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directories", nargs="+", metavar="DIR", help="trees of training scripts")
    parser.add_argument("--base", metavar="CHECKOUT", help="another source tree of accrewrite, measured in turn")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    trees = {"ours": _ROOT, **({"base": Path(args.base).resolve()} if args.base else {})}
    directories = [os.path.abspath(directory) for directory in args.directories]
    print_table(measure(directories, args.repeat, trees), list(trees))


if __name__ == "__main__":
    main()
