"""Compilations and wall time of a script that samples token by token, migrated to torch_xla
with ACC028 (the context padded to power-of-two lengths, the sequence grown on the host) and
without it.

    python benchmarks/generation_graphs.py SCRIPT [--set NAME=VALUE ...] [--xla-python PATH]

SCRIPT is migrated twice (all rules, then all but ACC028), its module-level constants first set
by ``--set`` (``--set max_iters=1`` shrinks a teaching script without editing it), and each form
runs under torch_xla's Python on PJRT's CPU device, in SCRIPT's folder (where it reads its data).
Printed per form: torch_xla's compilations (the CompileTime metric), graph executions and the
run's wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accrewrite.engine import Options, migrate_source

_XLA_PYTHON = Path.home() / ".cache" / "accrewrite-xla-venv" / "bin" / "python"
# Printed at exit, through names the script cannot rebind (teaching scripts name their model `m`).
_COUNTS = (
    "import atexit as _atexit, torch_xla.debug.metrics as _metrics\n"
    "_atexit.register(lambda: print('graphs', _metrics.metric_data('CompileTime')[0], "
    "_metrics.metric_data('ExecuteTime')[0]))\n"
)


def with_constants(source: str, settings: list[str]) -> str:
    """``source`` with each ``NAME = value`` line at module level set to the given value."""
    for setting in settings:
        name, value = setting.split("=", 1)
        source, found = re.subn(rf"^{re.escape(name)} = .*$", f"{name} = {value}", source, count=1, flags=re.M)
        if not found:
            raise SystemExit(f"no module-level `{name} = ...` in the script")
    return source


def run(script: Path, source: bytes, python: str, folder: Path) -> tuple[int, int, float]:
    path = folder / script.name
    path.write_bytes(_COUNTS.encode() + source)
    started = time.perf_counter()
    done = subprocess.run([python, str(path)], cwd=script.parent, capture_output=True, text=True,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{script.name} failed:\n{done.stderr[-3000:]}")
    compiles, executions = re.findall(r"^graphs (\d+) (\d+)$", done.stdout, re.M)[-1]
    return int(compiles), int(executions), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--xla-python", default=os.environ.get("ACCREWRITE_XLA_PYTHON", str(_XLA_PYTHON)))
    args = parser.parse_args()
    source = with_constants(args.script.read_text(), args.set).encode()
    print(f"{args.script.name}: {' '.join(args.set) or 'as written'}")
    with tempfile.TemporaryDirectory() as folder:
        for label, ignore in (("without ACC028", ("ACC028",)), ("with ACC028", ())):
            result = migrate_source(source, args.script.name, Options(target="torch_xla", ignore=ignore))
            if result.error is not None:
                raise SystemExit(f"{args.script.name} could not be migrated: {result.error}")
            compiles, executions, elapsed = run(args.script, result.output, args.xla_python, Path(folder))
            print(f"  {label:15} {compiles:5} compilations {executions:6} executions {elapsed:8.1f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
