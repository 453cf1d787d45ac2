"""The migrated forms committed beside every example are what the codemod writes today.

``examples/<name>/migrated/{runtime,torchacc,torch_xla,guarded_torchacc}.py`` are regenerated
in memory with ``examples/regenerate.py`` (the engine API, default rule selection) and must equal
the committed files byte for byte; each compiles, and migrating it again changes nothing. After
an intended rule change: ``python examples/regenerate.py``, then review the diff.
"""

import importlib.util
from pathlib import Path

import pytest

from accrewrite.engine import migrate_source

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load_regenerate():
    spec = importlib.util.spec_from_file_location("examples_regenerate", EXAMPLES / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


regenerate = _load_regenerate()
NAMES = regenerate.example_names()
CASES = [(name, form) for name in NAMES for form in regenerate.FORMS]

# (example, form) -> the rule bug that makes a second migration change the output; each is
# xfail(strict=True), so the test fails (XPASS) as soon as the bug is fixed: then drop the entry.
NOT_IDEMPOTENT: dict[tuple[str, str], str] = {}


def _second_run_cases():
    for name, form in CASES:
        reason = NOT_IDEMPOTENT.get((name, form))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(name, form, marks=marks, id=f"{name}-{form[:-3]}")


@pytest.fixture(scope="module")
def fresh():
    """Every example's migrated forms, regenerated once for the module."""
    return {name: regenerate.migrated_forms(name) for name in NAMES}


def test_every_bundled_training_shape_is_there():
    assert {"mnist", "hf_no_trainer", "nanogpt", "imagenet", "mingpt", "torchrun_ddp"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_migrated_folder_holds_exactly_the_forms(name):
    folder = EXAMPLES / name / "migrated"
    assert sorted(p.name for p in folder.glob("*.py")) == sorted(regenerate.FORMS)


@pytest.mark.slow
@pytest.mark.parametrize("name, form", CASES, ids=[f"{n}-{f[:-3]}" for n, f in CASES])
def test_committed_form_equals_a_fresh_migration(fresh, name, form):
    committed = EXAMPLES / name / "migrated" / form
    output, result = fresh[name][form]
    assert result.changed, f"{name}: the migration to {form} changed nothing"
    assert committed.read_text() == output.decode(), (
        f"{committed} is stale: run `python examples/regenerate.py {name}` and review the diff"
    )


@pytest.mark.parametrize("name, form", CASES, ids=[f"{n}-{f[:-3]}" for n, f in CASES])
def test_form_compiles(fresh, name, form):
    output, _ = fresh[name][form]
    compile(output, str(EXAMPLES / name / "migrated" / form), "exec", dont_inherit=True)


@pytest.mark.parametrize("name, form", list(_second_run_cases()))
def test_a_second_migration_changes_nothing(fresh, name, form):
    output, _ = fresh[name][form]
    path = EXAMPLES / name / "migrated" / form
    again = migrate_source(output, str(path), regenerate.FORMS[form])
    assert again.error is None
    assert again.fixes == [], [f"{f.code} line {f.line}: {f.message}" for f in again.fixes]
    assert again.output == output


@pytest.mark.parametrize("name", NAMES)
def test_guarded_form_imports_no_target_module_outside_the_guard(fresh, name):
    """With the variable unset the guarded script must run where TorchAcc is not installed: every
    `torchacc` import sits inside an `if enable_torchacc_compiler():` branch."""
    output, _ = fresh[name]["guarded_torchacc.py"]
    lines = output.decode().splitlines()
    for number, line in enumerate(lines):
        if "import torchacc" in line or "from torchacc" in line:
            indent = len(line) - len(line.lstrip())
            assert indent > 0, f"line {number + 1} imports torchacc unguarded: {line!r}"
            guard = next(
                (lines[up] for up in range(number - 1, -1, -1)
                 if lines[up].strip() and len(lines[up]) - len(lines[up].lstrip()) < indent),
                "",
            )
            assert "enable_torchacc_compiler()" in guard, f"line {number + 1}: {line!r} under {guard!r}"
