"""The ``accrewrite`` command line.

Exit codes are a contract (as ruff's): 0 nothing to do or changes written; 1 ``--check`` found
files that would change; 2 an error (bad arguments or configuration, a file that could not be
read, decoded, parsed or written).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from accrewrite import __version__
from accrewrite.base.parallel_kinds import PARALLEL_KINDS, unknown_kind  # the runtime's table too; torch-free
from accrewrite.choices import FORMATS, ORIGINAL, positive
from accrewrite.targets import DEFAULT_TARGET, ProfileError, all_targets, unknown_target

if TYPE_CHECKING:
    from rich.console import Console

    from accrewrite.engine import Options
    from accrewrite.runner import Job

# Each command imports what it runs (libcst, the rules, rich's console) when it runs, so that
# `--version` and `--help` answer at once.

EXIT_OK, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2
EXIT_INTERRUPTED = 130  # as a shell reports SIGINT
# Below this many files a progress bar would only flicker.
PROGRESS_MIN_FILES = 20
# A 1 MiB file (the size limit) of training loops takes about a minute on two shared cores
# (benchmarks/codemod_scaling.py); past 150 s a file is taken for hung, not slow.
DEFAULT_TIMEOUT = 150.0


def _consoles() -> tuple[Console, Console]:
    """Standard output's and standard error's consoles."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # The reader went away (`| head`). rich would exit 1, the --check code: the run's work
            # is done, so its exit code stands and the rest of the output goes nowhere.
            self.quiet = True
            _to_devnull(self.file)

    # No emoji codes: a location on line 100 ("train.py:100:9") would print as "train.py💯9".
    return _Console(emoji=False), _Console(stderr=True, emoji=False)


def _error(err: Console, message: str) -> int:
    """Print an error (its text is never markup: ``[tool.accrewrite]`` stays) and give exit 2."""
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return EXIT_ERROR


def _to_devnull(stream) -> None:
    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _codes(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _parser() -> argparse.ArgumentParser:
    targets = "{" + ",".join(all_targets()) + "}"
    parser = argparse.ArgumentParser(
        prog="accrewrite",
        description="Migrate PyTorch CUDA training scripts to TorchAcc, torch_xla or accrewrite.runtime.",
    )
    parser.add_argument("--version", action="version", version=f"accrewrite {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = commands.add_parser("migrate", help="rewrite training scripts (shows a diff by default)")
    migrate.add_argument("paths", nargs="+", metavar="PATH", help="files or directories; - for standard input")
    migrate.add_argument("--stdin-filename", metavar="NAME",
                         help="the name of what `-` reads (for messages and the pyproject.toml it uses)")
    migrate.add_argument("--target", type=_target, metavar=targets, help=f"default: {DEFAULT_TARGET}")
    modes = migrate.add_mutually_exclusive_group()
    modes.add_argument("--diff", dest="mode", action="store_const", const="diff", help="print a diff (default)")
    modes.add_argument("--in-place", dest="mode", action="store_const", const="in-place", help="rewrite the files")
    modes.add_argument("--check", dest="mode", action="store_const", const="check",
                       help="exit 1 when a file would change; write nothing")
    modes.add_argument("--output-dir", metavar="DIR", help="write migrated copies under DIR")
    migrate.add_argument("--parallel", type=_parallel, metavar="|".join(PARALLEL_KINDS),
                         help="target runtime: DDP becomes FSDP2, tensor, pipeline and/or context parallel through "
                              "accelerate()")
    migrate.add_argument("--guard", metavar="ENV_VAR",
                         help="write the dual-path form: the target path runs only when ENV_VAR is set")
    migrate.add_argument("--select", type=_codes, metavar="CODES", help="rules to run: codes, prefixes, names, ALL")
    migrate.add_argument("--ignore", type=_codes, metavar="CODES", help="rules not to run")
    migrate.add_argument("--unsafe-fixes", action=argparse.BooleanOptionalAction, default=None,
                         help="apply fixes that may change numerics")
    migrate.add_argument("--output-format", "--format", dest="format", choices=FORMATS, default="concise",
                         help="concise (default; also text), full (with each finding's source line and help), "
                              "json, github, gitlab or sarif")
    migrate.add_argument("--statistics", action="store_true", help="print counts per rule instead of the findings")
    migrate.add_argument("--show-fixes", action="store_true", help="list the fixes made (or to make) per file")
    migrate.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                         help="worker processes (0: one per CPU; never more than the CPUs or the files)")
    migrate.add_argument("--exclude", type=_codes, action="extend", metavar="GLOB",
                         help="skip paths matching these globs (repeatable, comma-separated)")
    migrate.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                         help=f"seconds a file may take before it is given up (default {DEFAULT_TIMEOUT:g})")

    rules = commands.add_parser("rules", help="list every rule")
    rules.add_argument("--format", choices=("text", "json"), default="text")

    explain = commands.add_parser("explain", help="a rule's documentation and examples")
    explain.add_argument("rule", metavar="CODE|NAME")

    verify = commands.add_parser(
        "verify", help="run a script and its migration, compare per-step losses and parameters",
        usage="accrewrite verify SCRIPT [options] [-- ARGS]   (ARGS: the script's own arguments)",
        description="Run SCRIPT and its migration (or two migrations, --compare) on the same arguments, to the "
                    "script's end, and compare each optimizer step's loss and a parameter checksum against the "
                    "noise that nudged reruns of the first side measure. Exit 0 match, 1 when they diverge or "
                    "the migrated side fails, 2 when the original cannot run or verify cannot set up.",
    )
    verify.add_argument("script", metavar="SCRIPT")
    verify.add_argument("--target", type=_target, metavar=targets, default=DEFAULT_TARGET)
    verify.add_argument("--steps", type=positive(int), metavar="N",
                        help="stop each side after N optimizer steps (default: run to the script's end)")
    verify.add_argument("--nproc", type=positive(int), default=1, metavar="N", help="processes, under torchrun")
    verify.add_argument("--rtol", type=positive(float), metavar="R",
                        help="the most any step's tolerance may be (default: the measured noise alone decides)")
    verify.add_argument("--compare", type=_sides, metavar="A,B",
                        help="the two sides: original or a target (default: original,TARGET)")
    verify.add_argument("--python", action="append", default=[], metavar="[SIDE=]PATH",
                        help="the interpreter of one side (torch_xla=PATH), or of every side; repeatable")
    verify.add_argument("--root", metavar="DIR",
                        help="the folder the sides see a copy of (default: the git repository, else the working "
                             "directory)")
    verify.add_argument("--unsafe-fixes", action="store_true", help="migrate with fixes that may change numerics")
    verify.add_argument("--timeout", type=positive(float), default=900, metavar="S",
                        help="seconds per side (default 900)")
    verify.add_argument("--keep", action="store_true", help="keep the workspace, records and logs")
    verify.add_argument("--format", choices=("text", "json"), default="text",
                        help="json: standard output holds one JSON object per line, each side's progress and the "
                             "result last; the text goes to standard error")
    verify.add_argument("--report", metavar="PATH.html",
                        help="write the loss curves, deviations and verdict as one self-contained HTML page")
    return parser


def _target(value: str) -> str:
    if value not in all_targets():
        raise argparse.ArgumentTypeError(unknown_target(value))
    return value


def _parallel(value: str) -> str:
    if value not in PARALLEL_KINDS:
        raise argparse.ArgumentTypeError(unknown_kind(value))
    return value


def _sides(value: str) -> list[str]:
    sides = _codes(value)
    known = [ORIGINAL, *all_targets()]
    if len(sides) != 2 or len(set(sides)) != 2 or not all(side in known for side in sides):
        raise argparse.ArgumentTypeError(f"two different sides out of {', '.join(known)}, e.g. runtime,torch_xla")
    return sides


def _options(args, config) -> Options:
    from accrewrite.engine import Options

    def pick(flag, key, default):
        return flag if flag is not None else config.get(key, default)

    return Options(
        target=pick(args.target, "target", DEFAULT_TARGET),
        select=tuple(pick(args.select, "select", [])),
        ignore=tuple(pick(args.ignore, "ignore", [])),
        unsafe_fixes=bool(pick(args.unsafe_fixes, "unsafe-fixes", False)),
        guard=pick(args.guard, "guard", None),
        parallel=pick(args.parallel, "parallel", None),
    )


def _jobs(paths: list[Path], inputs: list[str], output_dir: str | None) -> list[Job]:
    from accrewrite.runner import Job

    if output_dir is None:
        return [Job(path) for path in paths]
    base = _mirrored_from(inputs)
    return [Job(path, Path(output_dir) / Path(os.path.abspath(path)).relative_to(base)) for path in paths]


def _mirrored_from(inputs: list[str]) -> Path:
    """Where the tree under --output-dir starts: a lone directory's own root, else the common
    parent of the inputs (``a/train.py b/train.py`` -> ``a/train.py``, ``b/train.py``), so
    that no two inputs land on one output."""
    absolute = [Path(os.path.abspath(path)) for path in inputs]
    if len(absolute) == 1 and absolute[0].is_dir():
        return absolute[0]
    return Path(os.path.commonpath([path.parent for path in absolute]))


def _inside(path: Path, folder: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def _checked_options(args, config) -> Options:
    """The options for files under ``config``; unknown rule codes are a ConfigError."""
    from accrewrite.config import ConfigError
    from accrewrite.registry import SelectionError

    options = _options(args, config)
    try:
        options.selection()
    except SelectionError as exc:
        flags = [*(args.select or []), *(args.ignore or [])]
        where = "--select/--ignore" if exc.entry in flags else f"{config.path}: [tool.accrewrite] select/ignore"
        raise ConfigError(f"{where}: {exc}") from None
    return options


def _migrate(args, out: Console, err: Console) -> int:
    from rich.markup import escape

    from accrewrite.config import ConfigError, Configs
    from accrewrite.discovery import discover
    from accrewrite.errors import FileError
    from accrewrite.report import report
    from accrewrite.runner import Outcome, run
    from accrewrite.workers import usable_cpus

    stdin = "-" in args.paths
    if stdin and (len(args.paths) > 1 or args.output_dir):
        return _error(err, "`-` reads standard input: give it alone, without --output-dir")
    configs = Configs()
    found = None if stdin else discover(args.paths, tuple(args.exclude or ()))
    try:
        # Flags are checked before any file is touched, and so is every file's configuration.
        first = _checked_options(args, configs.of(Path(args.stdin_filename or ".") if stdin else Path(args.paths[0])))
        chosen: dict[Path | None, Options] = {}
        work = []
        for path in found.files if found else ():
            config = configs.of(path)
            if config.excludes(path):
                continue
            if config.path not in chosen:
                chosen[config.path] = _checked_options(args, config)
            work.append((path, chosen[config.path]))
    except ConfigError as exc:
        return _error(err, str(exc))
    warned = set()
    for options in [first, *chosen.values()]:
        for rule in options.unavailable():
            if (rule.code, options.target) not in warned:
                warned.add((rule.code, options.target))
                err.print(f"[bold yellow]warning:[/] {rule.code} {rule.name} is not available on target "
                          f"{options.target!r}; it does not run (see `accrewrite rules`)", highlight=False,
                          soft_wrap=True)
    if stdin:
        return _migrate_stdin(args, first, out, err)
    if args.output_dir:  # an output folder inside the inputs holds last run's copies, not inputs
        work = [(path, options) for path, options in work if not _inside(path, Path(args.output_dir))]
    if not work and not found.problems:
        err.print(f"[bold yellow]warning:[/] no Python files found under {escape(', '.join(args.paths))}",
                  highlight=False, soft_wrap=True)
    mode = "output-dir" if args.output_dir else (args.mode or "diff")
    jobs = list(zip(_jobs([path for path, _ in work], args.paths, args.output_dir), (o for _, o in work)))
    workers = min(args.jobs if args.jobs > 0 else usable_cpus(), usable_cpus(), max(1, len(jobs)))
    # The project the files make (accrewrite.project): the folders given, and each file's own.
    roots = tuple(Path(path) if Path(path).is_dir() else Path(path).parent for path in args.paths)
    lone = len(args.paths) == 1 and len(jobs) == 1 and Path(args.paths[0]).is_file()
    if err.is_terminal and len(jobs) >= PROGRESS_MIN_FILES:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # Refreshed from this thread: the workers are forked, and a refresh thread must not be.
        with Progress(
            TextColumn("migrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err, transient=True, auto_refresh=False,
        ) as progress:
            task = progress.add_task("files", total=len(jobs))

            def advance():
                progress.advance(task)
                progress.refresh()

            outcomes = run(jobs, mode, workers, advance, args.timeout, roots, lone)
    else:
        outcomes = run(jobs, mode, workers, timeout=args.timeout, roots=roots, lone=lone)
    outcomes = [Outcome(path, error=FileError(why), file=False) for path, why in found.problems] + outcomes
    target = ", ".join(sorted({options.target for options in chosen.values()})) or first.target

    if any(o.error is not None for o in outcomes):
        code = EXIT_ERROR
    elif mode == "check" and any(o.changed for o in outcomes):
        code = EXIT_CHANGES
    else:
        code = EXIT_OK
    try:
        report(outcomes, mode, target, args.format, out, args.statistics, args.show_fixes)
    except BrokenPipeError:
        _to_devnull(sys.stdout)
    return code


def _migrate_stdin(args, options: Options, out: Console, err: Console) -> int:
    """``migrate -``: as ruff reads standard input. With --in-place the migrated source goes to
    standard output and the report to standard error; otherwise the report (and the diff) goes
    to standard output as for a file."""
    from accrewrite.report import report
    from accrewrite.runner import migrate_text

    source = sys.stdin.buffer.read()
    mode = args.mode or "diff"
    outcome, output = migrate_text(args.stdin_filename or "-", source, options, "diff" if mode == "in-place" else mode)
    if mode == "in-place":
        sys.stdout.buffer.write(output)
        sys.stdout.flush()
        outcome.diff = ""
    report([outcome], mode, options.target, args.format, err if mode == "in-place" else out, args.statistics,
           args.show_fixes)
    if outcome.error is not None:
        return EXIT_ERROR
    return EXIT_CHANGES if mode == "check" and outcome.changed else EXIT_OK


def _rules(args, out: Console) -> int:
    from accrewrite.registry import all_rules

    rules = all_rules().values()
    if args.format == "json":
        import json

        print(json.dumps([
            {"code": r.code, "name": r.name, "summary": r.summary, "safe": r.safe, "opt_in": r.opt_in,
             "diagnostic": r.diagnostic_only(), "targets": r.supported_targets()}
            for r in rules
        ], indent=2))
        return EXIT_OK
    rows = []
    for rule in rules:
        kind = ("safe" if rule.safe else "unsafe") + (", opt-in" if rule.opt_in else "")
        kind = "diagnostic" if rule.diagnostic_only() else kind
        rows.append((rule.code, rule.name, kind, ", ".join(rule.supported_targets()), rule.summary))
    if not out.is_terminal:  # piped: a line per rule, nothing cut or wrapped
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])
        return EXIT_OK
    from rich.table import Table

    table = Table()
    for column in ("code", "name", "fix", "targets", "summary"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    out.print(table)
    return EXIT_OK


def _explain(args, out: Console, err: Console) -> int:
    from rich.markdown import Markdown

    from accrewrite import explain
    from accrewrite.registry import SelectionError, find_rule

    try:
        rule = find_rule(args.rule)
    except SelectionError as exc:
        return _error(err, str(exc))
    if not out.is_terminal:  # piped: the Markdown itself, unpadded
        print(explain.markdown(rule).rstrip())
        return EXIT_OK
    out.print(Markdown(explain.markdown(rule), code_theme="ansi_dark", inline_code_lexer="python"))
    return EXIT_OK


def _verify(args, out: Console, err: Console) -> int:
    from accrewrite.verify import Side, verify

    names = args.compare or [ORIGINAL, args.target]
    pythons = {}
    for given in args.python:
        name, _, path = given.rpartition("=")
        if name and name not in (ORIGINAL, *all_targets()):
            return _error(err, f"--python {given}: no side {name!r}; the sides are {', '.join(names)}")
        pythons[name] = path
    sides = [Side(name, None if name == ORIGINAL else name, pythons.get(name) or pythons.get("") or sys.executable)
             for name in names]
    events = out.file if args.format == "json" else None  # then standard output holds only the events
    return verify(args.script, args.script_args, sides, args.steps, args.nproc, args.rtol, args.unsafe_fixes,
                  args.timeout, args.keep, args.root, err if events else out, err, events, args.report)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:  # answered without reading the targets' profiles: tools probe it often
        print(f"accrewrite {__version__}")
        return EXIT_OK
    script_args: list[str] = []
    if argv[:1] == ["verify"] and "--" in argv:  # the script's own arguments, never accrewrite's
        split = argv.index("--")
        argv, script_args = argv[:split], argv[split + 1:]
    try:
        parser = _parser()  # reads the targets' profiles, installed ones included
    except ProfileError as exc:
        return _error(_consoles()[1], str(exc))
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        after = "; the script's own arguments go after `--`: accrewrite verify SCRIPT [options] -- ARGS"
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{after if args.command == 'verify' else ''}")
    args.script_args = script_args
    out, err = _consoles()
    commands = {"migrate": lambda: _migrate(args, out, err), "rules": lambda: _rules(args, out),
                "explain": lambda: _explain(args, out, err), "verify": lambda: _verify(args, out, err)}
    try:
        return commands[args.command]()
    except ProfileError as exc:  # a spelling of a rule's own concept, checked once the rules load
        return _error(err, str(exc))
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours. Silence the flush at exit.
        _to_devnull(sys.stdout)
        return EXIT_OK
    except KeyboardInterrupt:  # the workers are gone with the run; files are old or new, never half
        err.print("interrupted", highlight=False)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
