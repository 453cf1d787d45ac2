"""Regenerate the migrated forms committed beside every example.

For each ``examples/<name>/train.py`` this writes, with the codemod's default rule selection:

    examples/<name>/migrated/runtime.py           --target runtime
    examples/<name>/migrated/torchacc.py          --target torchacc
    examples/<name>/migrated/torch_xla.py         --target torch_xla
    examples/<name>/migrated/guarded_torchacc.py  --target torchacc --guard TORCHACC_COMPILER_OPT

Each is exactly what ``accrewrite migrate examples/<name>/train.py --target T [--guard VAR]``
prints, and ``tests/examples/test_examples.py`` fails when a committed form differs from a fresh
regeneration. Run it after a rule changes, then review the diff:

    python examples/regenerate.py            # rewrite every example's migrated/ folder
    python examples/regenerate.py --check    # exit 1 when something would change
    python examples/regenerate.py nanogpt    # only the named examples
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accrewrite.engine import Options, migrate_source

EXAMPLES = Path(__file__).resolve().parent
GUARD_VARIABLE = "TORCHACC_COMPILER_OPT"
# file name in migrated/ -> how it is migrated
FORMS = {
    "runtime.py": Options(target="runtime"),
    "torchacc.py": Options(target="torchacc"),
    "torch_xla.py": Options(target="torch_xla"),
    "guarded_torchacc.py": Options(target="torchacc", guard=GUARD_VARIABLE),
}


def example_names() -> list[str]:
    return sorted(path.parent.name for path in EXAMPLES.glob("*/train.py"))


def migrated_forms(name: str):
    """``{file name: (migrated bytes, FileResult)}`` for one example; raises on a migration error."""
    script = EXAMPLES / name / "train.py"
    source = script.read_bytes()
    forms = {}
    for file_name, options in FORMS.items():
        result = migrate_source(source, str(script), options)
        if result.error is not None:
            raise RuntimeError(f"{script}:{result.error.line}: {result.error.reason} ({options})")
        forms[file_name] = (result.output, result)
    return forms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="examples to regenerate (default: all)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything would change")
    args = parser.parse_args(argv)
    names = args.names or example_names()
    stale = []
    for name in names:
        folder = EXAMPLES / name / "migrated"
        for file_name, (output, result) in migrated_forms(name).items():
            path = folder / file_name
            current = path.read_bytes() if path.exists() else None
            status = "unchanged" if current == output else "stale" if args.check else "written"
            if current != output:
                stale.append(path)
                if not args.check:
                    folder.mkdir(exist_ok=True)
                    path.write_bytes(output)
            print(
                f"{path.relative_to(EXAMPLES)}: {status}; "
                f"{len(result.fixes)} fixes, {len(result.diagnostics)} diagnostics"
            )
    if args.check and stale:
        print(f"{len(stale)} migrated forms are stale: run python examples/regenerate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
