"""Codemod speed against its floor and against a base, measured side by side in one run.

    python benchmarks/codemod_speed.py [DIR] [--base CHECKOUT] [--repeat 3]
    python benchmarks/codemod_speed.py [DIR] [--base CHECKOUT] --instructions [STEP]

Without DIR it measures the bundled corpus: the plain example scripts (``examples/*/train.py``)
and the golden fixture inputs (``tests/rules/fixtures/*.in.py``), each copied 12 times into a
temporary directory.

The floor is what any libcst codemod must pay: ``libcst.parse_module`` + ``.code`` of the same
files, in one process. "ours" is ``accrewrite migrate DIR --diff`` with ``--jobs 1`` and
``--jobs 2``, each run a fresh process importing this checkout; with ``--base CHECKOUT`` (a
source tree, e.g. ``git archive REV | tar -x -C CHECKOUT``) the same runs import that tree, in
turn with ours round by round, so that a drift of the machine's speed hits both (each tree runs
once untimed before, which caches its bytecode as an install does). Each figure is
the best of ``--repeat`` rounds (the machine may be shared: the best run is the least
disturbed one). CPU seconds stand beside the wall time (the floor's process, and each run's
process with its workers): on a loaded machine they are the steadier figure for ``--jobs 1``;
the speed-up of ``--jobs 2`` is in wall time only.

The steadiest figure comes last: in one process (a fresh one per tree, each round), each file
parsed and printed (the floor) and then migrated by ``migrate_source``, in turn, CPU seconds
summed apart; the round with the least ratio is shown.

Timed rounds drift with the machine by 5 to 10%. ``--instructions`` counts instead: the CPU
instructions (valgrind's cachegrind, no cache simulation) of migrating every STEP-th file
(default 5) with ``migrate_source`` in one process, and of the floor on the same files, each less
a run that imports, reads the files and migrates one small file without the loop. The count
repeats within about 0.05%, so a change of a percent shows; it weighs every instruction alike,
so it tells the direction and size of a change, while the timed figures stay the measure.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import resource
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


def floor(paths: list[Path]) -> tuple[float, float]:
    """Wall and CPU seconds of parsing and printing ``paths`` with libcst."""
    start, cpu = time.perf_counter(), time.process_time()
    for path in paths:
        cst.parse_module(path.read_bytes()).code
    return time.perf_counter() - start, time.process_time() - cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _env(farm: Path) -> dict[str, str]:
    """A run's environment: importing ``farm``, with bytecode cached as an installed package's
    is (a tree whose modules compiled on every run would pay that in each)."""
    env = {**os.environ, "PYTHONPATH": str(farm)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def warm_up(farm: Path, paths: list[Path], scratch: Path) -> None:
    """One untimed run of ``farm`` on a file, which caches its modules' bytecode."""
    scratch.mkdir()
    shutil.copyfile(paths[0], scratch / "warm_up.py")
    migrate(farm, str(scratch), 1)


def migrate(farm: Path, directory: str, jobs: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``accrewrite migrate --diff`` in a fresh process that imports
    accrewrite from ``farm`` (run from the corpus, so that no other checkout is on the path
    first); its CPU seconds count its workers'."""
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run([sys.executable, "-m", "accrewrite", "migrate", ".", "--diff", "--jobs", str(jobs)],
                          cwd=directory, env=_env(farm), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if done.returncode not in (0, 1):
        raise SystemExit(f"accrewrite migrate ({farm}) exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed, cpu


_NONE = (float("inf"), float("inf"))


def interleaved(paths: list[Path]) -> tuple[float, float]:
    """CPU seconds of the floor and of ``migrate_source``, file by file in turn in this process
    (the cycle collector paused per file, as in a worker): a drift of the machine's speed hits
    both alike."""
    from accrewrite.engine import Options, migrate_source

    options = Options()
    floor_cpu = ours_cpu = 0.0
    gc.freeze()
    for path in paths:
        source = path.read_bytes()
        gc.disable()
        start = time.process_time()
        cst.parse_module(source).code
        middle = time.process_time()
        migrate_source(source, str(path), options)
        floor_cpu, ours_cpu = floor_cpu + middle - start, ours_cpu + time.process_time() - middle
        gc.enable()
    return floor_cpu, ours_cpu


def interleaved_in(farm: Path, directory: str) -> tuple[float, float]:
    """``interleaved`` of ``directory``'s files in a fresh process that imports ``farm``."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), directory, "--interleaved"], cwd=directory,
                          env=_env(farm), capture_output=True, text=True, check=True)
    floor_cpu, ours_cpu = map(float, done.stdout.split())
    return floor_cpu, ours_cpu


_COUNTED = ("none", "floor", "migrate")  # what a counted run does after its common start


def counted_run(directory: str, step: int, what: str) -> None:
    """The body of a counted run (``--instructions``): the same start for each ``what``, then
    nothing, the floor or the migrations of every ``step``-th file."""
    from accrewrite.engine import Options, migrate_source

    sources = [(str(path), path.read_bytes()) for path in discover([directory]).files[::step]]
    options = Options()
    migrate_source(b"import torch\nx = torch.zeros(1).cuda()\n", "warm_up.py", options)  # the lazy imports
    gc.freeze()
    if what == "none":
        return
    for path, source in sources:
        gc.disable()
        if what == "floor":
            cst.parse_module(source).code
        else:
            migrate_source(source, path, options)
        gc.enable()


def instructions(farm: Path, directory: str, step: int, what: str) -> int:
    """The instructions a counted run of ``what`` executes, importing ``farm``."""
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, os.path.abspath(__file__), directory, "--count-run", what, str(step)],
        cwd=directory, env=_env(farm), capture_output=True, text=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the counted run ({farm}, {what}) failed: {done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def count(directory: str, step: int, trees: dict[str, Path]) -> None:
    """Print the instructions of the floor and of each tree's migrations, and their ratios."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions counts with valgrind: install it (apt install valgrind), or time the runs")
    files = len(discover([directory]).files[::step])
    with tempfile.TemporaryDirectory() as scratch:
        counts = {}
        for name, tree in trees.items():
            (Path(scratch) / name).mkdir()
            farm = package_farm(tree, Path(scratch) / name)
            warm_up(farm, discover([directory]).files, Path(scratch) / f"{name}-warm-up")
            start = instructions(farm, directory, step, "none")
            counted = _COUNTED[1:] if name == "ours" else ("migrate",)  # one floor: libcst's, whichever tree
            counts[name] = {what: instructions(farm, directory, step, what) - start for what in counted}
    floor_count = counts["ours"]["floor"]
    print(f"every {step}th file: {files} files; instructions (millions)")
    print(f"floor (parse + codegen)   {floor_count / 1e6:10.0f}")
    for name, counted in counts.items():
        line = f"{name:<5} migrate_source       {counted['migrate'] / 1e6:10.0f}  /floor {counted['migrate'] / floor_count:.3f}x"
        if name != "ours":
            line += f"  ours/{name} {counts['ours']['migrate'] / counted['migrate']:.3f}x"
        print(line)


def _least(first: tuple[float, float], second: tuple[float, float]) -> tuple[float, float]:
    """The least wall time and the least CPU time (maybe of different rounds)."""
    return min(first[0], second[0]), min(first[1], second[1])


def measure(directory: str, repeat: int, trees: dict[str, Path]) -> dict:
    """The best (wall, CPU) seconds of each (name, jobs) over ``repeat`` rounds, and of the floor."""
    paths = discover([directory]).files
    best = {"floor": _NONE}
    with tempfile.TemporaryDirectory() as scratch:
        farms = {}
        for name, tree in trees.items():
            (Path(scratch) / name).mkdir()
            farms[name] = package_farm(tree, Path(scratch) / name)
            warm_up(farms[name], paths, Path(scratch) / f"{name}-warm-up")
        for _ in range(repeat):
            best["floor"] = _least(best["floor"], floor(paths))
            for jobs in _JOBS:
                for name, farm in farms.items():
                    best[name, jobs] = _least(best.get((name, jobs), _NONE), migrate(farm, directory, jobs))
            for name, farm in farms.items():
                pairs = (best.get((name, "interleaved"), (1.0, float("inf"))), interleaved_in(farm, directory))
                best[name, "interleaved"] = min(pairs, key=lambda pair: pair[1] / pair[0])  # the lesser ratio
    best["files"] = len(paths)
    best["lines"] = sum(path.read_bytes().count(b"\n") for path in paths)
    return best


def print_table(best: dict, names: list[str]) -> None:
    print(f"files {best['files']}  lines {best['lines']}")
    wall, cpu = best["floor"]
    print(f"floor (parse + codegen, 1 process)   {wall:.3f} s  cpu {cpu:.3f} s")
    for jobs in _JOBS:
        for name in names:
            seconds, used = best[name, jobs]
            line = (f"{name:<5} --jobs {jobs}                      {seconds:.3f} s  /floor {seconds / wall:.2f}x"
                    f"  cpu {used:.3f} s  /floor {used / cpu:.2f}x")
            if name != "ours":
                line += f"  ours/{name} {best['ours', jobs][0] / seconds:.2f}x  cpu {best['ours', jobs][1] / used:.2f}x"
            print(line)
    for name in names:
        print(f"{name:<5} --jobs 2 speed-up over --jobs 1  {best[name, 1][0] / best[name, 2][0]:.2f}x")
    for name in names:
        floor_cpu, used = best[name, "interleaved"]
        line = f"{name:<5} in one process, file by file: floor cpu {floor_cpu:.3f} s  ours cpu {used:.3f} s  /floor {used / floor_cpu:.2f}x"
        if name != "ours":
            mine = best["ours", "interleaved"]
            line += f"  ours/{name} {(mine[1] / mine[0]) / (used / floor_cpu):.2f}x"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", help="a tree of training scripts (default: the bundled corpus)")
    parser.add_argument("--base", metavar="CHECKOUT", help="another source tree of accrewrite, measured in turn")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--instructions", type=int, nargs="?", const=5, metavar="STEP",
                        help="count instructions (valgrind) of every STEP-th file (default 5) instead of timing")
    parser.add_argument("--interleaved", action="store_true", help=argparse.SUPPRESS)  # one measurement, for a farm
    parser.add_argument("--count-run", nargs=2, metavar=("WHAT", "STEP"), help=argparse.SUPPRESS)  # under valgrind
    args = parser.parse_args()
    if args.interleaved:
        print(*interleaved(discover([args.directory]).files))
        return
    if args.count_run:
        counted_run(args.directory, int(args.count_run[1]), args.count_run[0])
        return
    trees = {"ours": _ROOT, **({"base": Path(args.base).resolve()} if args.base else {})}
    with tempfile.TemporaryDirectory() as corpus:
        if args.directory is None:
            bundled_corpus(Path(corpus))
        directory = os.path.abspath(args.directory or corpus)
        if args.instructions:
            count(directory, args.instructions, trees)
        else:
            print_table(measure(directory, args.repeat, trees), list(trees))


if __name__ == "__main__":
    main()
